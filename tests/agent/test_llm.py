"""The llm and hybrid proposers: a scripted chat model that fixes its kernel once the prompt shows the failure, the
whole client path against a local server speaking the OpenAI chat API, and endpoint failures ending as verdicts."""

from __future__ import annotations

import json
import socket
import sqlite3

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage
from scripted_llm import BROKEN, BROKEN_REPLY, FIXED, FIXED_REPLY, MODEL, Raw, ScriptedServer
from typer.testing import CliRunner

from workbench.agent.llm import HybridProposer, LLMConfig, LLMProposer
from workbench.agent.run import port_block
from workbench.agent.search import SearchProposer
from workbench.blocks import get_block
from workbench.cli import app
from workbench.errors import WorkbenchError
from workbench.store import get_engine
from workbench.store.queries import candidate_checks, find_run, run_candidates, run_steps
from workbench.templating import list_templates

FAST = {"seeds": 1, "suites": ["smoke"], "dtypes": ["float32"]}


class PromptRecorder(BaseCallbackHandler):
    """The user message of every chat-model call, as the model received it."""

    def __init__(self):
        self.prompts: list[str] = []

    def on_chat_model_start(self, serialized, messages, **kwargs) -> None:
        self.prompts.append(messages[0][-1].content)


def scripted(*replies: str) -> tuple[GenericFakeChatModel, PromptRecorder]:
    recorder = PromptRecorder()
    return GenericFakeChatModel(messages=iter([AIMessage(r) for r in replies]), callbacks=[recorder]), recorder


def fake_config(**kw) -> LLMConfig:
    return LLMConfig(base_url="http://127.0.0.1:9/v1", model="fake-coder", **kw)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.interpreter
def test_the_model_fixes_its_kernel_once_the_prompt_shows_the_failure(settings):
    chat, recorder = scripted(BROKEN_REPLY, FIXED_REPLY)
    outcome = port_block("rmsnorm", settings, proposer="llm", chat=chat, llm=fake_config(), budget=3, **FAST)
    assert outcome.status == "promoted", outcome.reason
    engine = get_engine(settings.db_url)
    first, second = run_candidates(engine, outcome.run_id)
    assert (first.template, first.status, first.source) == ("llm", "fail", BROKEN)
    assert (second.template, second.status, second.source) == ("llm", "pass", FIXED)
    assert first.params == {"model": "fake-coder", "call": 1} and second.params["call"] == 2

    one, two = recorder.prompts
    assert "def reference(x" in one and FIXED in one  # the spec, and the template-rendered starting candidate
    assert "verification result" not in one and "verification result (#1)" in two
    failing = sorted({c.shape for c in candidate_checks(engine, first.id) if not c.passed})
    assert failing and "verdict: fail" in two and f"failing shapes: {'; '.join(failing)}" in two
    assert f"message: {first.message}" in two and "max_abs" in two
    assert "N + eps + 0.5)" in two  # the broken candidate itself

    operator = settings.operators_dir / "rmsnorm"
    (promoted,) = operator.glob("*.py")
    assert promoted.read_text() == FIXED and promoted.name.startswith("rmsnorm_llm_")
    manifest = json.loads(promoted.with_suffix(".json").read_text())
    assert manifest["template"] == "llm" and manifest["params"]["model"] == "fake-coder"
    revise = [s for s in run_steps(engine, outcome.run_id) if s.node == "revise"]
    assert revise[0].data["llm"]["prompt"] == two and revise[0].data["llm"]["tries"] == 1
    assert "the model revises #1 after fail" in revise[0].message


@pytest.mark.interpreter
@pytest.mark.e2e
def test_cli_port_against_a_local_openai_server_retries_its_failures(settings, monkeypatch):
    """`workbench port rmsnorm --proposer llm --llm-base-url http://127.0.0.1:<port>/v1` through langchain's
    ChatOpenAI: a 500, a body that is not JSON and a 429 are retried with the same prompt; an empty reply is not (the
    same prompt would get it again): the next prompt says the reply was empty. The key travels in the Authorization
    header and nowhere else."""
    key = "sk-test-7f3a9c-never-stored"
    monkeypatch.setenv("WORKBENCH_LLM_API_KEY", key)
    monkeypatch.delenv("WORKBENCH_LLM_MODEL", raising=False)
    script = [Raw(500, json.dumps({"error": {"message": "overloaded"}})), Raw(200, "<html>not json</html>"),
              BROKEN_REPLY, Raw(429, json.dumps({"error": {"message": "slow down"}})), "", FIXED_REPLY]
    with ScriptedServer(script) as server:
        result = CliRunner().invoke(app, ["port", "rmsnorm", "--proposer", "llm", "--llm-base-url", server.base_url,
                                          "--seeds", "1", "--suites", "smoke", "--dtypes", "float32", "--budget", "3"])
    assert result.exit_code == 0, result.output
    assert "promoted rmsnorm after 3 candidates" in result.output
    assert len(server.requests) == 6 and not server.script
    for request in server.requests:
        headers = {k.lower(): v for k, v in request["headers"].items()}
        assert headers["authorization"] == f"Bearer {key}" and request["body"]["model"] == MODEL
    prompts = server.prompts()
    assert prompts[0] == prompts[1] == prompts[2] and prompts[3] == prompts[4] != prompts[5]
    assert "verdict: fail" in prompts[3] and "failing shapes: rows=" in prompts[3]
    assert "Your last reply could not be used: your reply was empty" in prompts[5]

    engine = get_engine(settings.db_url)
    run = find_run(engine, json.loads(CliRunner().invoke(app, ["runs", "--json"]).stdout)[0]["id"])
    assert run.status == "promoted" and run.proposer == "llm"
    assert run.config["llm"]["base_url"] == server.base_url and run.config["llm"]["model"] == MODEL
    assert [(c.template, c.status) for c in run_candidates(engine, run.id)] == [
        ("llm", "fail"), ("llm", "llm_error"), ("llm", "pass")]
    traces = [s.data["llm"] for s in run_steps(engine, run.id) if "llm" in s.data]
    assert [t["tries"] for t in traces] == [3, 2, 1]
    assert traces[0]["errors"][0].startswith("HTTP 500") and traces[0]["errors"][1].startswith("malformed response")
    assert traces[1]["errors"] == ["rate limited (HTTP 429): Error code: 429 - slow down", "your reply was empty"]

    db = settings.db_url.removeprefix("sqlite:///")
    for path in (db, settings.checkpoints_path):
        assert key not in "\n".join(sqlite3.connect(path).iterdump())
    assert key not in result.output


def test_an_endpoint_that_refuses_connections_ends_the_run_blocked_with_the_verdict(settings):
    config = LLMConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", retries=2, timeout_s=5)
    outcome = port_block("rmsnorm", settings, proposer="llm", llm=config, budget=2, **FAST)
    assert outcome.status == "blocked" and "budget of 2 candidates spent" in outcome.reason
    engine = get_engine(settings.db_url)
    candidates = run_candidates(engine, outcome.run_id)
    assert [(c.iteration, c.status) for c in candidates] == [(1, "llm_error"), (2, "llm_error")]
    message = candidates[0].message
    assert message.startswith("3 tries failed: connection error: ") and message.count("Connection refused") == 3
    assert find_run(engine, outcome.run_id).status == "blocked"
    diagnoses = [s.message for s in run_steps(engine, outcome.run_id) if s.node == "diagnose"]
    assert diagnoses and all(m.startswith("llm_error: 3 tries failed") for m in diagnoses)


def test_the_client_retries_a_rate_limit_after_the_delay_the_server_asks_for_and_the_trace_keeps_each_try():
    """Transport retries are the OpenAI client's own (max_retries): it waits what Retry-After says (2 s here, against
    its own first backoff of at most 0.5 s) and says so in its retry-count header; the proposal's trace still lists
    every try."""
    spec = get_block("rmsnorm")
    slow_down = json.dumps({"error": {"message": "slow down"}})
    with ScriptedServer([Raw(429, slow_down, {"Retry-After": "2"}), FIXED_REPLY]) as server:
        llm = LLMProposer(spec, LLMConfig(base_url=server.base_url, model=MODEL, retries=1), suites=["smoke"],
                          dtypes=["float32"], shapes={"smoke": spec.shapes["smoke"]}, start_source=None)
        proposal = llm.first()
    first, second = server.requests
    assert second["at"] - first["at"] >= 1.9
    assert {k.lower(): v for k, v in second["headers"].items()}["x-stainless-retry-count"] == "1"
    assert proposal["source"] == FIXED and "error" not in proposal
    assert proposal["trace"]["tries"] == 2
    assert proposal["trace"]["errors"] == ["rate limited (HTTP 429): Error code: 429 - slow down"]
    assert "after 1 failed tries (rate limited (HTTP 429)" in proposal["reason"]

    with ScriptedServer([Raw(503, slow_down)] * 3) as server:
        llm = LLMProposer(spec, LLMConfig(base_url=server.base_url, model=MODEL, retries=1), suites=["smoke"],
                          dtypes=["float32"], shapes={"smoke": spec.shapes["smoke"]}, start_source=None)
        proposal = llm.first()
    assert len(server.requests) == 2 and len(server.script) == 1  # the bound: one retry, then the error
    assert proposal["error"] == "2 tries failed: HTTP 503: Error code: 503 - slow down; HTTP 503: Error code: " \
                                "503 - slow down"


def test_refusals_and_prose_without_code_are_not_retried_with_the_same_prompt(settings):
    with ScriptedServer([Raw(401, json.dumps({"error": {"message": "invalid api key"}}))]) as server:
        config = LLMConfig(base_url=server.base_url, model=MODEL, retries=3)
        outcome = port_block("rmsnorm", settings, proposer="llm", llm=config, budget=1, **FAST)
    assert len(server.requests) == 1 and outcome.status == "blocked"
    (candidate,) = run_candidates(get_engine(settings.db_url), outcome.run_id)
    assert candidate.status == "llm_error" and candidate.message.startswith("1 try failed: HTTP 401")

    chat = FakeListChatModel(responses=["RMSNorm divides by the root mean square; a kernel is easy to write."])
    outcome = port_block("rmsnorm", settings, proposer="llm", chat=chat, llm=fake_config(retries=1), budget=1,
                         **FAST)
    (candidate,) = run_candidates(get_engine(settings.db_url), outcome.run_id)
    assert outcome.status == "blocked" and candidate.status == "llm_error"
    assert candidate.message == "1 try failed: your reply had no python block with a module defining run " \
                                "(67 characters)"


def test_a_reply_that_does_not_parse_is_a_candidate_and_the_next_prompt_shows_its_syntax_error(settings):
    """The model's first module has a syntax error: it is recorded as a candidate with the verdict compile_error
    (line, message and the offending line), and the second prompt carries exactly that; the second reply passes."""
    broken = FIXED_REPLY.replace("def run(x, weight, eps):", "def run(x, weight, eps)")
    with ScriptedServer([broken, FIXED_REPLY]) as server:
        config = LLMConfig(base_url=server.base_url, model=MODEL, retries=2)
        outcome = port_block("rmsnorm", settings, proposer="llm", llm=config, budget=2, **FAST)
        prompts = server.prompts()
    assert outcome.status == "promoted", outcome.reason
    first, second = run_candidates(get_engine(settings.db_url), outcome.run_id)
    assert (first.status, second.status) == ("compile_error", "pass")
    line = next(i for i, text in enumerate(first.source.splitlines(), 1) if text.startswith("def run(x, weight, eps)"))
    assert f":{line}: SyntaxError: " in first.message and first.message.endswith("def run(x, weight, eps)")
    assert len(prompts) == 2 and "verdict: compile_error" in prompts[1]
    assert f":{line}: SyntaxError: " in prompts[1] and "def run(x, weight, eps)\n" in prompts[1]


def test_the_endpoint_must_be_named_and_the_key_is_never_recorded(settings, monkeypatch):
    for name in ("WORKBENCH_LLM_BASE_URL", "WORKBENCH_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(WorkbenchError, match="needs an endpoint: --llm-base-url"):
        port_block("rmsnorm", settings, proposer="llm")
    monkeypatch.setenv("WORKBENCH_LLM_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("WORKBENCH_LLM_API_KEY", "sk-secret")
    monkeypatch.setenv("WORKBENCH_LLM_TIMEOUT", "7.5")
    config = LLMConfig.load(model="served")
    assert (config.base_url, config.model, config.timeout_s) == ("http://127.0.0.1:8000/v1", "served", 7.5)
    assert "sk-secret" not in json.dumps(config.public())
    # a resumed run keeps the endpoint it recorded; a flag still wins
    stored = LLMConfig.load(stored={"base_url": "http://gpu-box:8000/v1", "model": "m"})
    assert stored.base_url == "http://gpu-box:8000/v1"
    assert LLMConfig.load("http://other/v1", stored=stored.public()).base_url == "http://other/v1"
    monkeypatch.setenv("WORKBENCH_LLM_TIMEOUT", "soon")
    with pytest.raises(WorkbenchError, match="WORKBENCH_LLM_TIMEOUT: 'soon' is not a number"):
        LLMConfig.load()


def test_hybrid_searches_while_a_repair_rule_applies_and_asks_the_model_otherwise():
    spec = get_block("rmsnorm")
    templates = list_templates("rmsnorm")
    search = SearchProposer(templates, spec.shapes["smoke"] + spec.shapes["edge"])
    chat, recorder = scripted(FIXED_REPLY, FIXED_REPLY)
    llm = LLMProposer(spec, fake_config(), suites=["smoke"], dtypes=["float32"],
                      shapes={"smoke": spec.shapes["smoke"]}, start_source=None, chat=chat)
    hybrid = HybridProposer(search, llm)
    first = hybrid.first()
    assert first["template"] == "row_block" and "source" not in first

    narrow = {**first["params"], "BLOCK_N": 64}
    current = {"iteration": 1, "template": "row_block", "params": narrow, "verdict": "fail", "message": "m"}
    coverage = {"class": "coverage", "reason": "r", "symptoms": {"requirement": "BLOCK_N >= N",
                                                                 "failing_shapes": ["rows=3,N=4097"]}}
    repaired = hybrid.propose(current, coverage, [current])
    assert repaired["template"] == "row_block" and "coverage repair" in repaired["reason"]
    assert recorder.prompts == []

    crashed = {**current, "verdict": "runtime_error", "message": "IndexError in the kernel"}
    asked = hybrid.propose(crashed, {"class": "runtime_error", "reason": "runtime_error: IndexError", "symptoms": {}},
                           [crashed])
    assert asked["template"] == "llm" and asked["source"] == FIXED
    assert asked["reason"].startswith("no repair rule for runtime_error; ")
    assert "verdict: runtime_error" in recorder.prompts[0] and "IndexError in the kernel" in recorder.prompts[0]

    # the model's own candidates go back to the model
    again = hybrid.propose({**asked, "iteration": 2, "verdict": "fail", "message": "m2"},
                           {"class": "wrong", "reason": "w", "symptoms": {}}, [crashed])
    assert again["template"] == "llm" and again["params"]["call"] == 1 and len(recorder.prompts) == 2


@pytest.mark.interpreter
def test_hybrid_port_asks_the_model_when_the_template_does_not_compile(settings, copied_templates):
    host = copied_templates("rmsnorm") / "_host.j2"  # the host code both rmsnorm templates share
    source = host.read_text()
    assert source.count("def run(x, weight, eps):") == 1
    host.write_text(source.replace("def run(x, weight, eps):", "def run(x, weight, eps)"))
    chat, recorder = scripted(FIXED_REPLY)
    outcome = port_block("rmsnorm", settings, proposer="hybrid", chat=chat, llm=fake_config(), budget=4, **FAST)
    assert outcome.status == "promoted", outcome.reason
    statuses = [(c.template, c.status) for c in run_candidates(get_engine(settings.db_url), outcome.run_id)]
    assert statuses == [("row_block", "compile_error"), ("llm", "pass")]
    assert len(recorder.prompts) == 1 and "verdict: compile_error" in recorder.prompts[0]
    assert "SyntaxError" in recorder.prompts[0]
