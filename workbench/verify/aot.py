"""Ahead-of-time compile of a candidate's captured launches for the GPU targets (DESIGN "Targets and evidence").

The sandbox worker records every distinct launch specialization a candidate makes (kernel, argument types,
constexpr values, launch options), on the verified suites and, without running them, at the model card's sizes.
Here those launches are compiled for each target in a child process (compile_worker.py, the sandbox's limits; a
compiler that crashes or hangs is a verdict on that launch, not a crash of the workbench), and what the compiler
reported is kept per kernel x target x specialization, cached by source hash, specialization and target.

Which launches: every launch captured for the target with its own launch settings, at the model suite (the sizes
and the bfloat16 the target runs) and at the smoke suite (small sizes, where other tiles bind); a kernel neither
launched is compiled at the first smoke shape's probe for the target, else from the verified suites' launches on
the interpreter, one per argument types x launch options.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import triton

from workbench import syntax
from workbench.backends import Target
from workbench.verify.sandbox import run_child

COMPILE_WORKER = Path(__file__).with_name("compile_worker.py")
REPORT_VERSION = 2  # in the cache key: what a cached build records changed (AMD registers count AGPRs once)
ITEM_TIMEOUT_S = 600  # one launch x target; a compile past SLOW_COMPILE_S is a finding (a GPU's JIT pays it too)
SLOW_COMPILE_S = 60
PROBE_COMPILE_S = SLOW_COMPILE_S
"""A tuning probe's limit on one launch x target: a point whose compile runs past it is a finding (it does not
compile in time), not minutes of ptxas the search waits for."""
SMOKE_PROBE = "probe:meta:"
"""The suite label of the first smoke shape's launches captured for each target with the target's own launch
settings (workbench.verify.harness.build_captures): what a kernel no captured suite launches is compiled at."""
CAPTURED = "capture:"
"""The label prefix of a suite other than the model's captured for each target with the target's own launch settings
(capture:smoke, capture:edge; workbench.verify.harness.build_captures), unlike the interpreter's launches of the
suites it verified (labelled smoke, edge)."""


def captured_label(suite: str) -> str:
    """The label of ``suite``'s launches captured for a target: model, or capture:<suite>."""
    return "model" if suite == "model" else f"{CAPTURED}{suite}"


def spill_counted(suite: str) -> bool:
    """Whether a build's spills count against its target: a launch captured for it with its own launch settings
    (the model suite's, another captured suite's, the first smoke shape's probe); not the interpreter's launches."""
    return suite == "model" or suite.startswith((CAPTURED, SMOKE_PROBE))


def suite_phrase(suite: str) -> str:
    """Where a build's launch was made, for findings: "model suite", "smoke suite" (captured for the target),
    "first smoke shape" (its probe), else "<suite> suite on the interpreter"."""
    if suite == "model" or suite.startswith(CAPTURED):
        return f"{suite.removeprefix(CAPTURED)} suite"
    return "first smoke shape" if suite.startswith(SMOKE_PROBE) else f"{suite} suite on the interpreter"


COMPILE_MEMORY_BYTES = 8 << 30


@dataclass
class KernelBuild:
    """What the compiler said about one kernel specialization on one target. spilled_bytes: stack (NVIDIA) or
    scratch (AMD) bytes per thread; shared_bytes: dynamic shared memory (LDS) of the compiled kernel;
    ctas_per_sm: resident CTAs per SM (CU) from registers, shared memory and warps; tensor_cores: whether a
    kernel with a ``tl.dot`` got tensor-core instructions (None without a dot)."""

    kernel: str
    target: str
    suite: str
    specialization: dict
    ok: bool
    error: str = ""
    registers: int | None = None
    spilled_bytes: int | None = None
    shared_bytes: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    ctas_per_sm: int | None = None
    uses_dot: bool | None = None
    tensor_cores: bool | None = None
    seconds: float = 0.0
    cached: bool = False

    @property
    def spills(self) -> bool:
        return bool(self.ok and self.spilled_bytes)

    def line(self) -> str:
        if not self.ok:
            return f"{self.target} {self.kernel}: {self.error}"
        return (f"{self.target} {self.kernel}: {self.registers} regs, {self.spilled_bytes} B spilled, "
                f"{self.shared_bytes} B shared, {self.ctas_per_sm} CTA/SM")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TargetReport:
    """Every build of one verification; failures and spills on the required targets."""

    builds: list[KernelBuild] = field(default_factory=list)
    capture_errors: list[str] = field(default_factory=list)
    integrity: list[tuple[str, str]] = field(default_factory=list)  # (verdict, reason) from the compile children

    def failures(self) -> list[KernelBuild]:
        return [b for b in self.builds if not b.ok]

    def spills(self) -> list[KernelBuild]:
        """Builds that spill where it counts (``spill_counted``: a named finding; the interpreter's launches of the
        other shapes take the interpreter's settings, not the target's)."""
        return [b for b in self.builds if spill_counted(b.suite) and b.spills]

    def slow(self) -> list[KernelBuild]:
        """Builds that took more than SLOW_COMPILE_S to compile (here; a GPU's JIT pays the same at first call)."""
        return [b for b in self.builds if b.ok and b.seconds > SLOW_COMPILE_S]

    def compiled_on(self) -> list[str]:
        targets = dict.fromkeys(b.target for b in self.builds)
        return [t for t in targets if all(b.ok for b in self.builds if b.target == t)]

    def spill_free_on(self) -> list[str]:
        return [t for t in self.compiled_on() if not any(b.spills for b in self.builds
                                                         if b.target == t and spill_counted(b.suite))]


def select_launches(launches: list[dict], target: str | None = None) -> list[dict]:
    """The launches to compile for ``target``: every distinct launch captured for it (the model suite's, recorded
    for it or for no target in particular, and the other captured suites'); for a kernel with none, its
    first-smoke-shape launches captured for the target (its own launch settings), else the interpreter's launches,
    the first per argument types x options."""
    launches = [x for x in launches if x.get("target") in (None, target)]

    def captured(x: dict) -> bool:
        return x["suite"] == "model" or (x["suite"].startswith(CAPTURED) and x.get("target") == target)

    at_suites = {x["kernel"] for x in launches if captured(x)}
    at_probe = {x["kernel"] for x in launches if x["suite"].startswith(SMOKE_PROBE) and x.get("target") == target}
    chosen, seen = [], set()
    for launch in launches:
        types = json.dumps([launch["kernel"], launch["signature"], launch["options"], launch.get("autotune")],
                           sort_keys=True)
        if launch["kernel"] in at_suites:
            if not captured(launch):
                continue
            key = json.dumps([types, launch["constexprs"]], sort_keys=True)
        elif launch["kernel"] in at_probe:
            if not launch["suite"].startswith(SMOKE_PROBE):
                continue  # the interpreter's launch: the target's own one is there
            key = json.dumps([types, launch["constexprs"]], sort_keys=True)
        else:
            key = types
        if key not in seen:
            seen.add(key)
            chosen.append(launch)
    return chosen


def compile_key(source: str) -> str:
    """The hash a candidate's builds are cached under: its source with the value of a literal top-level
    ``TUNED_SETTINGS = {...}`` blanked. That table only sets launch options and constexprs, which every cached
    launch names itself, so the variants a port's tuning compiles share the builds of the targets they leave alone;
    any other change to the source (a second statement on that line included) changes the hash."""
    try:
        tree = syntax.parse(source)
    except SyntaxError:
        return hashlib.sha256(source.encode()).hexdigest()
    lines = source.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["TUNED_SETTINGS"]:
            try:
                ast.literal_eval(node.value)
            except ValueError:
                break
            first, last = node.value.lineno - 1, node.value.end_lineno - 1
            head, tail = lines[first][:node.value.col_offset], lines[last][node.value.end_col_offset:]
            lines[first:last + 1] = [head + "{...}" + tail]
            break
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _cache_key(source_hash: str, launch: dict, target: Target) -> str:
    kernel_file = Path(launch["file"])
    foreign = launch["module"] != "candidate" and kernel_file.is_file()
    kernel_source = hashlib.sha256(kernel_file.read_bytes()).hexdigest() if foreign else ""
    spec = {k: launch[k] for k in ("kernel", "module", "signature", "constexprs", "options")}
    text = json.dumps([REPORT_VERSION, source_hash, kernel_source, spec, target.name, triton.__version__],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def compile_for_targets(candidate: Path, source_hash: str, launches: list[dict], targets: list[Target], *,
                        cache_dir: Path | None = None, item_timeout_s: float = ITEM_TIMEOUT_S,
                        first_failure_ends: bool = False) -> TargetReport:
    """Compile the selected launches for every target; cached results are reused (``cached`` set).
    first_failure_ends: a target's first launch that does not compile (or finish in ``item_timeout_s``) ends that
    target's compiles, its other launches failed as not compiled (a probe's figure needs no more)."""
    report = TargetReport()
    items, pending = [], []
    for target in targets:
        for launch in select_launches(launches, target.name):
            build_id = len(items)
            key = _cache_key(source_hash, launch, target)
            items.append((launch, target, key))
            hit = cache_dir / f"{key}.json" if cache_dir else None
            if hit is not None and hit.is_file():
                # the compiler's figures are the specialization's; the suite is this launch's, not the cached one's
                report.builds.append(KernelBuild(**{**json.loads(hit.read_text()), "suite": launch["suite"],
                                                    "cached": True}))
            else:
                pending.append(build_id)
    # one compile child per target, as many at once as there are cores (a compile is single-threaded)
    by_target = [[i for i in pending if items[i][1].name == t.name] for t in targets]
    by_target = [group for group in by_target if group]
    done: dict[int, dict] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(len(by_target), os.cpu_count() or 1))) as pool:
        for records, integrity in pool.map(lambda group: _run_compiles(candidate, items, group, item_timeout_s,
                                                                         first_failure_ends),
                                           by_target):
            done.update(records)
            report.integrity += [i for i in integrity if i not in report.integrity]
    for build_id, record in sorted(done.items()):
        launch, target, key = items[build_id]
        build = _build(launch, target, record)
        report.builds.append(build)
        # a crash or hang may be the machine's, a launch skipped was never compiled, and a child the candidate
        # tampered with reports nothing: no cache
        if cache_dir is not None and "crash" not in record and "skipped" not in record and not report.integrity:
            cache_dir.mkdir(parents=True, exist_ok=True)
            partial = cache_dir / f"{key}.{os.getpid()}.tmp"  # whole files only: readers in other processes
            partial.write_text(json.dumps(build.to_dict()))
            partial.replace(cache_dir / f"{key}.json")
    return report


def _build(launch: dict, target: Target, record: dict) -> KernelBuild:
    spec = {k: launch[k] for k in ("signature", "constexprs", "options", "autotune") if k in launch}
    build = KernelBuild(kernel=launch["kernel"], target=target.name, suite=launch["suite"], specialization=spec,
                        ok=bool(record.get("ok")), error=record.get("error", ""), seconds=record.get("seconds", 0.0))
    if build.ok:
        for name in ("registers", "spilled_bytes", "shared_bytes", "num_warps", "num_stages", "uses_dot"):
            setattr(build, name, record.get(name))
        build.tensor_cores = record.get("tensor_cores") if build.uses_dot else None
        build.ctas_per_sm = target.occupancy(build.registers, build.shared_bytes or 0, build.num_warps or 4)
    return build


def _run_compiles(candidate: Path, items: list, pending: list[int], item_timeout_s: float,
                  first_failure_ends: bool = False) -> tuple[dict[int, dict], list[tuple[str, str]]]:
    """({item id: the worker's record}, [(integrity verdict, reason)]). A child that dies mid-item (crash, hang)
    gives that item its verdict and a new child takes the rest (none, with ``first_failure_ends``: they are
    skipped). Only lines with the job's token are the worker's;
    a line without it, an audit event or a patched namespace is an integrity verdict, and no item of that child
    keeps a result."""
    done: dict[int, dict] = {}
    integrity: list[tuple[str, str]] = []
    while pending:
        token = secrets.token_hex(16)
        job = {"candidate": str(candidate), "item_timeout_s": item_timeout_s, "token": token,
               "items": [{"id": i, "launch": items[i][0], "target": _target_json(items[i][1])} for i in pending]}
        job_dir = Path(tempfile.mkdtemp(prefix="compile-"))
        # Triton's own cache inside the job folder: the only place the (isolated) child may write
        env = {"TRITON_DEFAULT_FP_FUSION": "1", "TRITON_CACHE_DIR": str(job_dir / "triton-cache")}
        try:
            (job_dir / "job.json").write_text(json.dumps(job))
            outcome = run_child(COMPILE_WORKER, job_dir, env, item_timeout_s * len(pending) + 60,
                                COMPILE_MEMORY_BYTES, [candidate.parent])
        finally:
            shutil.rmtree(job_dir, ignore_errors=True)
        lines = _records(outcome.payload)
        started, refused = None, _refusals(lines, token)
        for record in lines:
            if record.pop("token", None) != token:
                continue
            if "start" in record:
                started = record["start"]
            elif record.get("id") in pending:
                done[record["id"]] = record
                started = None
        if refused:
            integrity += refused
            for i in pending:
                done[i] = {"ok": False, "error": f"{refused[0][0]}: {refused[0][1]}"}
            break
        if outcome.status == "ok":
            for i in pending:
                done.setdefault(i, {"ok": False, "error": "the compile worker sent no result for this launch"})
        else:
            victim = started if started is not None else next((i for i in pending if i not in done), None)
            if victim is not None:
                why = "did not finish" if "SIGALRM" in outcome.message or outcome.status == "timeout" \
                    else "crashed"
                done[victim] = {"ok": False, "crash": True,
                                "error": f"compiler {why}: {outcome.message} ({outcome.output_tail.strip()[-200:]})"
                                if why == "crashed" else f"compiler did not finish within {item_timeout_s:g} s"}
        failed = next((record for record in done.values() if not record.get("ok")), None)
        if failed is not None and first_failure_ends:
            for i in pending:
                done.setdefault(i, {"ok": False, "skipped": True,
                                    "error": f"not compiled: an earlier launch did not ({failed['error'][:120]})"})
        pending = [i for i in pending if i not in done]
    return done, integrity


def _records(payload: bytes) -> list[dict]:
    """The JSON objects of a compile child's output, one per line (a line cut short by a crash is skipped)."""
    records = []
    for line in payload.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        records.append(record if isinstance(record, dict) else {"not an object": record})
    return records


def _refusals(records: list[dict], token: str) -> list[tuple[str, str]]:
    """The integrity verdicts a compile child's output shows: lines the worker did not write (no token), and the
    audit events and patched namespaces its last line reports."""
    found: list[tuple[str, str]] = []
    for record in records:
        if record.get("token") != token:
            found.append(("forged_report", "a compile result did not come from the compile worker"))
            continue
        if record.get("end"):
            found += [(e["kind"], f"{e['event']} {e.get('detail', '')}".strip()[:200]) for e in record["events"]]
            if record["patched"]:
                found.append(("monkeypatch", f"changed during the compile: {', '.join(record['patched'][:5])}"))
    return list(dict.fromkeys(found))


def _target_json(target: Target) -> dict:
    return {"name": target.name, "backend": target.backend, "arch": target.arch, "warp_size": target.warp_size,
            "tensor_core_ops": list(target.tensor_core_ops)}
