"""The llm proposer: candidates written by a chat model behind any OpenAI-compatible endpoint (a local vLLM, SGLang or
Ollama server, or a hosted API), through langchain's chat-model interface; and the hybrid proposer, which searches
the templates first and asks the model when search is exhausted or a failure has no repair rule.

Configuration: --llm-base-url / --llm-model, else $WORKBENCH_LLM_BASE_URL / $WORKBENCH_LLM_MODEL (without a model, the
endpoint's /models list is read and its first model taken). $WORKBENCH_LLM_TIMEOUT (seconds per request),
$WORKBENCH_LLM_RETRIES (transport retries after the first try), $WORKBENCH_LLM_PROMPT_CHARS (the prompt's budget),
$WORKBENCH_LLM_TEMPERATURE and $WORKBENCH_LLM_MAX_TOKENS. The API key is read from $WORKBENCH_LLM_API_KEY when a request
is made, and nowhere else: it is never stored with the run, never logged, never part of a prompt (local servers take any
key).

Transport failures (connection refused, timeout, 408, 409, rate limit, a 5xx) are retried by the OpenAI client itself
(``max_retries``): exponential backoff with jitter, and the delay a server asks for in ``Retry-After`` honoured (up to
the client's cap). Every try goes through a recording transport, so the run's trace still lists each try and what it
met. A 200 whose body cannot be read is retried by the proposer with the same prompt, within the same bound of tries.
When the tries are spent the proposal carries the error, and the iteration is recorded with the verdict ``llm_error``. A
request the endpoint refuses outright (401, 404, ...) is not retried. A reply that came back but cannot be used is not
retried with the same prompt either (at temperature 0 the same prompt gets the same answer): an empty reply or one with
no python block is an ``llm_error`` iteration whose message the next prompt gives the model; a python block that does
not parse is a candidate like any other, whose verdict (compile_error, with the SyntaxError's line, message and the line
itself) the next prompt shows.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from workbench.agent.prompt import SYSTEM, build_prompt, extract_module
from workbench.agent.search import SearchProposer
from workbench.agent.state import Attempt, Proposal
from workbench.blocks.base import BlockSpec, Shape
from workbench.errors import WorkbenchError, one_line
from workbench.vocabulary import Verdict

API_KEY_ENV = "WORKBENCH_LLM_API_KEY"
LOCAL_KEY = "not-needed"  # OpenAI clients want a key set; local servers accept any
LLM_TEMPLATE = "llm"     # the template name recorded for a model-written candidate


class LLMConfig(BaseSettings):
    """Where and how to ask: each field from its argument, else $WORKBENCH_LLM_<NAME> (timeout_s: _TIMEOUT), else its
    default; an empty variable counts as unset. Holds no key (see
    API_KEY_ENV): ``public()`` of it is what a run records."""

    model_config = SettingsConfigDict(env_prefix="WORKBENCH_LLM_", frozen=True, populate_by_name=True,
                                      env_ignore_empty=True, extra="ignore")

    base_url: str = ""
    model: str = ""
    timeout_s: float = Field(120.0, validation_alias="WORKBENCH_LLM_TIMEOUT")
    retries: int = Field(3, ge=0)
    prompt_chars: int = Field(24_000, ge=4000)
    temperature: float | None = None
    max_tokens: int | None = None

    @classmethod
    def load(cls, base_url: str | None = None, model: str | None = None,
             stored: dict[str, Any] | None = None) -> LLMConfig:
        """Flags first, then what a run recorded (when it is resumed), then $WORKBENCH_LLM_*, then defaults."""
        given = {k: v for k, v in (stored or {}).items() if v is not None and v != ""}
        given.update({k: v for k, v in {"base_url": base_url, "model": model}.items() if v})
        try:
            config = cls(**given)
        except ValidationError as exc:
            error = exc.errors()[0]
            name = str(error["loc"][0])
            env = name if name.startswith("WORKBENCH_") else f"WORKBENCH_LLM_{name.upper()}"
            if error["type"] in ("greater_than_equal", "too_short"):
                raise WorkbenchError("retries must be at least 0 and the prompt budget at least 4000 characters") \
                    from None
            raise WorkbenchError(f"${env}: '{error['input']}' is not a number") from None
        if not config.base_url:
            raise WorkbenchError("the llm proposer needs an endpoint: --llm-base-url or $WORKBENCH_LLM_BASE_URL "
                                 "(e.g. http://127.0.0.1:8000/v1 for a local vLLM server)")
        return config

    def public(self) -> dict[str, Any]:
        return self.model_dump()


def api_key() -> str:
    return os.environ.get(API_KEY_ENV) or LOCAL_KEY


def require_client() -> None:
    """A WorkbenchError naming the extra to install when langchain-openai is missing."""
    try:
        import langchain_openai  # noqa: F401
    except ImportError:
        raise WorkbenchError("the llm and hybrid proposers need langchain-openai: "
                             "pip install 'workbench[llm]'") from None


class TryLog:
    """The HTTP tries of one request, as the client's transport saw them: a transport error, or an error status with
    the endpoint's message. Wraps the client's own transport (``transport()``), so retries stay the client's."""

    def __init__(self) -> None:
        self.tries = 0
        self.errors: list[str] = []

    def transport(self):
        try:
            import httpx2 as httpx  # the HTTP library of openai>=3
        except ImportError:
            import httpx
        log = self

        class RecordingTransport(httpx.HTTPTransport):
            def handle_request(self, request):
                log.tries += 1
                try:
                    response = super().handle_request(request)
                except httpx.TransportError as exc:
                    kind = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection error"
                    log.errors.append(f"{kind}: {one_line(_root(exc))[:300]}")
                    raise
                if response.status_code >= 400:
                    response.read()
                    log.errors.append(status_error(response.status_code, response.text))
                return response

        return RecordingTransport()


def status_error(code: int, body: str) -> str:
    """An error status as the trace words it: "rate limited (HTTP 429): Error code: 429 - slow down"."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body
    kind = "rate limited (HTTP 429)" if code == 429 else f"HTTP {code}"
    return f"{kind}: {one_line(f'Error code: {code} - {message}')[:300]}"


def chat_model(config: LLMConfig, tries: TryLog | None = None):
    """A langchain ChatOpenAI on the endpoint; the OpenAI client retries transport failures (``config.retries``
    times, honouring Retry-After) and ``tries`` records each try."""
    require_client()
    import openai
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    kwargs: dict[str, Any] = {}
    if config.temperature is not None:
        kwargs["temperature"] = config.temperature
    if config.max_tokens is not None:
        kwargs["max_tokens"] = config.max_tokens
    if tries is not None:
        kwargs["http_client"] = openai.DefaultHttpxClient(transport=tries.transport())
    return ChatOpenAI(model=config.model, base_url=config.base_url, api_key=SecretStr(api_key()),
                      timeout=config.timeout_s, max_retries=config.retries, **kwargs)


def resolve_model(config: LLMConfig) -> LLMConfig:
    """The config with its model named: as given, else the first model the endpoint's /models lists."""
    if config.model:
        return config
    require_client()
    import openai

    try:
        client = openai.OpenAI(base_url=config.base_url, api_key=api_key(), timeout=min(config.timeout_s, 30.0),
                               max_retries=config.retries)
        served = [m.id for m in client.models.list()]
    except openai.OpenAIError as exc:
        raise WorkbenchError(f"no model named (--llm-model or $WORKBENCH_LLM_MODEL) and the models of "
                             f"{config.base_url} could not be listed: {one_line(exc)[:200]}") from None
    if not served:
        raise WorkbenchError(f"{config.base_url} lists no model: name one with --llm-model")
    return LLMConfig(**{**config.public(), "model": served[0]})


class ReplyError(Exception):
    """A reply that came back but holds no candidate module (empty, or no python block). Not an endpoint failure:
    the same prompt would get the same answer, so it is not retried; the next prompt tells the model what was
    wrong (REPLY_PROBLEM starts the message)."""


REPLY_PROBLEM = "your reply "


def classify(exc: BaseException) -> tuple[str, bool]:
    """(what went wrong, whether trying again can help)."""
    if isinstance(exc, ReplyError):
        return str(exc), False
    try:
        import openai
    except ImportError:
        openai = None
    if openai is not None:
        if isinstance(exc, openai.APITimeoutError):
            return "timeout", True
        if isinstance(exc, openai.APIConnectionError):
            return "connection error", True
        if isinstance(exc, openai.RateLimitError):
            return "rate limited (HTTP 429)", True
        if isinstance(exc, openai.APIStatusError):
            code = exc.status_code
            return f"HTTP {code}", code >= 500 or code in (408, 409)
        if isinstance(exc, openai.APIResponseValidationError):
            return "malformed response", True
    if isinstance(exc, TimeoutError | ConnectionError):
        return "connection error" if isinstance(exc, ConnectionError) else "timeout", True
    # anything else came out of reading the response (a body the client could not parse): a malformed reply
    return f"malformed response ({type(exc).__name__})", True


def _root(exc: BaseException) -> BaseException:
    """The innermost cause (a connection error's "[Errno 111] Connection refused" under the client's wrappers)."""
    for _ in range(10):
        inner = exc.__cause__ or exc.__context__
        if inner is None or not str(inner):
            break
        exc = inner
    return exc


def reply_text(content: Any) -> str:
    """A chat message's content as text (a string, or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content if p)
    return "" if content is None else str(content)


class LLMProposer:
    """Asks a chat model for a complete candidate module. Proposals carry the module's source (template "llm",
    params: the model and the call number) or, when the endpoint failed, the error; and a "trace" (the prompt,
    tries, seconds) for the run's record, which is not kept in the graph's state."""

    name = "llm"

    def __init__(self, spec: BlockSpec, config: LLMConfig, *, suites: list[str], dtypes: list[str],
                 shapes: dict[str, list[Shape]], start_source: str | None,
                 checks_of: Callable[[int], list[dict]] = lambda _cid: [], chat=None):
        self.spec, self.config = spec, config
        self.suites, self.dtypes, self.shapes = suites, dtypes, shapes
        self.start_source = start_source
        self.checks_of = checks_of
        self._chat = chat
        self._tries: TryLog | None = None  # the HTTP tries of our own client (none for a chat model handed in)

    @property
    def chat(self):
        if self._chat is None:
            self._tries = TryLog()
            self._chat = chat_model(self.config, self._tries)
        return self._chat

    @property
    def model_name(self) -> str:
        return self.config.model or getattr(self._chat, "model_name", "") or "model"

    def first(self) -> Proposal:
        prompt = build_prompt(self.spec, suites=self.suites, dtypes=self.dtypes, shapes=self.shapes,
                              start_source=self.start_source, budget=self.config.prompt_chars,
                              wanted="Write the candidate module. You may start from the starting candidate, "
                                     "or write your own kernels.")
        return self._ask(prompt, call=1, why="first candidate written by the model")

    def explore(self, current: Attempt, history: list[Attempt], n: int) -> list[Proposal]:
        """None side by side: the model writes one candidate at a time, each told how the last one did."""
        return []

    def propose(self, current: Attempt, diagnosis: dict[str, Any], history: list[Attempt]) -> Proposal:
        """The next candidate, told the last candidate's source and verification result."""
        calls = sum(h.get("template") == LLM_TEMPLATE for h in history) + 1
        if current.get("path") or current.get("verdict") not in (None, Verdict.LLM_ERROR):
            last = current
        else:  # the endpoint failed last time: show the last candidate there is
            last = next((h for h in reversed(history) if h.get("path")), None)
        last_source, checks, last_diagnosis = None, [], diagnosis
        if last is not None:
            if last is not current:
                last_diagnosis = last.get("diagnosis")
            try:
                last_source = Path(last["path"]).read_text() if last.get("path") else None
            except OSError:
                last_source = None
            if last.get("candidate_id") is not None:
                checks = self.checks_of(last["candidate_id"])
        earlier = [h for h in history if h.get("iteration") != (last or {}).get("iteration")]
        unusable = current.get("verdict") == Verdict.LLM_ERROR and REPLY_PROBLEM in str(current.get("message", ""))
        if unusable:
            problem = str(current["message"])[str(current["message"]).index(REPLY_PROBLEM):]
            wanted = (f"Your last reply could not be used: {problem}. Reply with the complete candidate module in one "
                      f"```python fenced block.")
            why = f"the model is told its reply could not be used ({problem})"
        elif current.get("verdict") == Verdict.PASS:
            wanted = (f"The last candidate passed ({diagnosis.get('reason', '')}). Write a different candidate that "
                      f"also passes, with a smaller error or fewer kernel launches.")
            why = "exploring: another passing candidate wanted"
        elif last is None:
            wanted = "Write the candidate module."
            why = f"{current.get('verdict')}: asking again"
        else:
            wanted = (f"Candidate #{last.get('iteration')} failed verification ({last.get('verdict')}). Find the "
                      f"cause in the failing shapes and error figures and write the complete corrected module.")
            why = f"the model revises #{last.get('iteration')} after {last.get('verdict')}"
        prompt = build_prompt(self.spec, suites=self.suites, dtypes=self.dtypes, shapes=self.shapes,
                              start_source=self.start_source, last=last, last_source=last_source,
                              diagnosis=last_diagnosis, checks=checks, history=earlier, wanted=wanted,
                              budget=self.config.prompt_chars)
        return self._ask(prompt, call=calls, why=why)

    def _ask(self, prompt: str, *, call: int, why: str) -> Proposal:
        """One proposal: the reply's module, or the error once the tries are spent. Transport failures were retried
        by the client (each try is in the TryLog); an unreadable 200 is asked again here, within the same bound."""
        from langchain_core.messages import HumanMessage, SystemMessage

        messages = [SystemMessage(SYSTEM), HumanMessage(prompt)]
        chat = self.chat  # a missing client library is the user's to fix, not an endpoint failure
        params = {"model": self.model_name, "call": call}
        tries, errors = 0, []
        started = time.monotonic()
        while True:
            log = self._tries
            if log is not None:
                log.tries, log.errors = 0, []
            try:
                text = reply_text(chat.invoke(messages).content)
                if not text.strip():
                    raise ReplyError(f"{REPLY_PROBLEM}was empty")
                module = extract_module(text, self.spec.name)
                if module is None:
                    raise ReplyError(f"{REPLY_PROBLEM}had no python block with a module defining run "
                                     f"({len(text)} characters)")
                failure = None
            except Exception as exc:  # every endpoint failure ends as a verdict, never as a crash of the run
                failure = exc
            tries += log.tries if log is not None else 1
            errors += log.errors if log is not None else []
            if failure is None:
                break
            kind, retryable = classify(failure)
            if log is None or not _transport_error(failure):  # the client's own tries are in the log already
                detail = one_line(_root(failure) if kind in ("connection error", "timeout") else failure)[:300]
                errors.append(kind if detail.lower().rstrip(".") in kind.lower() else f"{kind}: {detail}")
            if not retryable or (log is not None and _transport_error(failure)) or tries > self.config.retries:
                error = f"{tries} {'try' if tries == 1 else 'tries'} failed: {'; '.join(errors)}"
                trace = {"prompt": prompt, "prompt_chars": len(prompt), "tries": tries, "errors": errors,
                         "seconds": round(time.monotonic() - started, 2)}
                return Proposal(template=LLM_TEMPLATE, params=params, reason=f"{why}: {self.model_name} call {call}",
                                error=error, trace=trace)
        trace = {"prompt": prompt, "prompt_chars": len(prompt), "reply_chars": len(text), "tries": tries,
                 "errors": errors, "seconds": round(time.monotonic() - started, 2)}
        retried = f" after {tries - 1} failed tries ({errors[-1]})" if errors else ""
        return Proposal(template=LLM_TEMPLATE, params=params, source=module, trace=trace,
                        reason=f"{why}: {self.model_name} call {call}{retried}")


def _transport_error(exc: BaseException) -> bool:
    """A failure the OpenAI client met on the wire (and retried, where it could), as opposed to a reply it got."""
    try:
        import openai
    except ImportError:
        return False
    return isinstance(exc, openai.APIConnectionError | openai.APIStatusError)


class HybridProposer:
    """Search first; the model when search is exhausted, when a failure class has no repair rule, and for the
    model's own candidates."""

    name = "hybrid"

    def __init__(self, search: SearchProposer, llm: LLMProposer):
        self.search, self.llm = search, llm

    def first(self) -> Proposal | None:
        return self.search.first() or self.llm.first()

    def explore(self, current: Attempt, history: list[Attempt], n: int) -> list[Proposal]:
        """The search's untried points after one of its own; none after the model's (one at a time)."""
        return self.search.explore(current, history, n) if current.get("template") in self.search.by_name else []

    def propose(self, current: Attempt, diagnosis: dict[str, Any], history: list[Attempt]) -> Proposal | None:
        cls = diagnosis["class"]
        if current.get("template") in self.search.by_name and (cls == "explore" or cls in self.search.rules):
            found = self.search.propose(current, diagnosis, history)
            if found:
                return found
            why = "search is exhausted"
        elif current.get("template") in self.search.by_name:
            why = f"no repair rule for {cls}"
        else:
            why = ""
        proposal = self.llm.propose(current, diagnosis, history)
        if why:
            proposal["reason"] = f"{why}; {proposal['reason']}"
        return proposal
