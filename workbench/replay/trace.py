"""What the profiler traces of a distributed replay say (``workbench replay ... --ranks N --profile`` writes one
Chrome trace per rank; ``workbench trace <replay-id>`` reads them).

On each rank's main thread (the thread of the ``ProfilerStep#<n>`` spans), within each step's span, every moment is
one of:
    communication  inside a collective op (``c10d::``, ``_c10d_functional::``, ``gloo:``, ``nccl:``,
                   ``record_param_comms``: issuing a collective, or waiting for one, ``wait_tensor``); or after
                   one, until the next op, while the work it started on another thread runs (gloo's blocking
                   collectives return, then are waited for outside any op, FSDP's all-gather inside its span)
    compute        inside any other op; attributed to the innermost ``block:<name>`` span around it, else to its
                   top-level op (the backward's autograd nodes, the optimizer, the glue between blocks)
    idle           inside no op (the interpreter between ops)

The All-to-All is in flight while any thread of the rank runs an all-to-all collective (the main thread issuing it,
gloo's worker threads running it: an asynchronous dispatch runs there while the main thread goes on); the time
waited on it is the main thread's communication while it is in flight, and the time hidden under the experts the
part of it that overlaps the main thread's ``block:moe_grouped_gemm``.

A bubble is an idle gap of at least the threshold, named by the ops before and after it. The slowest rank is the one
whose compute exceeds the mean of the other ranks' at the same step the most, summed over the steps after the first
(compute, not wall time: the ranks wait for each other in the collectives, so their steps last alike; the first step
carries what happens once, the optimizer's state created, the first gathers: it counts only when it is the only one),
named only when it computes 10% longer than they do there (SLOW_SHARE), and its slowest step the one where it exceeds
them the most; the op that explains it is the one whose compute on that rank at that step exceeds the other ranks'
mean the most (a collective's time is mostly the wait for the slowest rank: it names none).
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workbench.errors import WorkbenchError

COLLECTIVE = re.compile(r"^(c10d::|_?c10d_functional::|gloo:|nccl:|record_param_comms)")
ALL_TO_ALL = re.compile(r"all_?to_?all", re.I)
STEP = re.compile(r"^ProfilerStep#(\d+)$")
EXPERTS = "block:moe_grouped_gemm"
COMPUTE, COMMUNICATION, IDLE = "compute", "communication", "idle"
DEFAULT_BUBBLE_MS = 1.0
WARMUP_STEPS = 1
"""The first steps, left out of the slowest rank's comparison where later steps were traced."""
SLOW_SHARE = 0.10
"""How much longer than the other ranks' mean a rank must compute at a step to be named the slowest (less is noise:
two ranks of one run differ by a few percent)."""

Interval = tuple[float, float]


@dataclass
class _Node:
    """One op of a thread (times in ms) and the ops inside it."""

    name: str
    start: float
    end: float
    children: list[_Node] = field(default_factory=list)


@dataclass(frozen=True)
class Segment:
    """A stretch of a step on the main thread: ms from the step's start, its kind and the op it is attributed to."""

    start: float
    end: float
    kind: str
    op: str


@dataclass
class RankStep:
    """One step of one rank: its spans on the main thread (``segments``, ms from the step's start, idle left out)
    and the All-to-All in flight on any thread (``all_to_all``)."""

    rank: int
    step: int
    ms: float
    segments: list[Segment]
    all_to_all: list[Interval]


@dataclass
class StepFigures:
    """Milliseconds of one rank's step; ``ops``: its compute by the op it is attributed to."""

    rank: int
    step: int
    ms: float
    compute_ms: float
    communication_ms: float
    idle_ms: float
    all_to_all_ms: float
    all_to_all_wait_ms: float
    hidden_ms: float
    ops: dict[str, float]

    @property
    def hidden_fraction(self) -> float:
        return self.hidden_ms / self.all_to_all_ms if self.all_to_all_ms else 0.0

    def to_dict(self) -> dict:
        """The figures without ``ops``, with the hidden fraction."""
        return {**{k: v for k, v in asdict(self).items() if k != "ops"}, "hidden_fraction": self.hidden_fraction}


@dataclass
class Bubble:
    """An idle gap of ``ms`` at ``at_ms`` from its step's start, between the ops ``before`` and ``after``."""

    rank: int
    step: int
    at_ms: float
    ms: float
    before: str
    after: str


@dataclass
class Slowest:
    """The rank and step whose compute exceeds the other ranks' mean the most, and the op that explains it (its
    compute there, and the other ranks' mean)."""

    rank: int
    step: int
    compute_ms: float
    others_compute_ms: float
    op: str
    op_ms: float
    others_op_ms: float


@dataclass
class TraceReport:
    """What ``report`` found: every rank's steps, the bubbles (longest first), the slowest rank (None: no rank computes
    longer than the others), the bubble threshold; and the All-to-All over every rank and step."""

    steps: list[StepFigures]
    bubbles: list[Bubble]
    slowest: Slowest | None
    bubble_ms: float

    @property
    def all_to_all_ms(self) -> float:
        return sum(s.all_to_all_ms for s in self.steps)

    @property
    def hidden_ms(self) -> float:
        return sum(s.hidden_ms for s in self.steps)

    @property
    def hidden_fraction(self) -> float:
        return self.hidden_ms / self.all_to_all_ms if self.all_to_all_ms else 0.0

    def to_dict(self) -> dict:
        return {"steps": [s.to_dict() for s in self.steps], "bubbles": [asdict(b) for b in self.bubbles],
                "slowest": asdict(self.slowest) if self.slowest else None, "bubble_ms": self.bubble_ms,
                "all_to_all_ms": self.all_to_all_ms, "hidden_ms": self.hidden_ms,
                "hidden_fraction": self.hidden_fraction}


def _union(intervals: list[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        elif b > a:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _measure(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in _union(intervals))


def _overlap(x: list[Interval], y: list[Interval]) -> float:
    """The time covered by both ``x`` and ``y``."""
    x, y = _union(x), _union(y)
    total, j = 0.0, 0
    for a, b in x:
        while j < len(y) and y[j][1] <= a:
            j += 1
        k = j
        while k < len(y) and y[k][0] < b:
            total += min(b, y[k][1]) - max(a, y[k][0])
            k += 1
    return total


def _tree(events: list[dict]) -> list[_Node]:
    """The ops of one thread nested by time (an op ending past its parent is cut at the parent's end)."""
    roots: list[_Node] = []
    stack: list[_Node] = []
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        start = e["ts"] / 1e3
        while stack and stack[-1].end <= start:
            stack.pop()
        node = _Node(e["name"], start, start + e["dur"] / 1e3)
        if stack:
            node.end = min(node.end, stack[-1].end)
            stack[-1].children.append(node)
        else:
            roots.append(node)
        stack.append(node)
    return roots


def _pieces(nodes: list[_Node], label: str | None = None) -> Iterator[tuple[float, float, str, str, bool]]:
    """(start, end, kind, op, between) covering ``nodes`` without overlap: a collective and all inside it is
    communication under its own name; any other time is compute, under the innermost block around it, else its
    top-level op. ``between``: the time of an op between or around the ops inside it (its own Python or
    bookkeeping, or a wait that is no op of its own)."""
    for node in nodes:
        if COLLECTIVE.match(node.name):
            yield node.start, node.end, COMMUNICATION, node.name, False
            continue
        op = node.name if node.name.startswith("block:") else label or node.name
        cursor = node.start
        for child in node.children:
            if cursor < child.start:
                yield cursor, child.start, COMPUTE, op, True
            yield from _pieces([child], op)
            cursor = max(cursor, child.end)
        if cursor < node.end:
            yield cursor, node.end, COMPUTE, op, bool(node.children)


def _waits(pieces: list[tuple[float, float, str, str, bool]], background: list[Interval], end: float
           ) -> list[tuple[float, float, str]]:
    """(start, end, collective): the wait after each collective that returned before its work was done (gloo's
    blocking collectives return, then the caller waits outside any op, FSDP's all-gather inside its span), from its
    end until the work that started on another thread (``background``) before the next op ends, at the latest when
    that op starts (``end``: the step's)."""
    ops = [p for p in pieces if not p[4]]
    found = []
    for i, (start, stop, kind, op, _) in enumerate(ops):
        if kind != COMMUNICATION:
            continue
        following = ops[i + 1][0] if i + 1 < len(ops) else end
        until = min(max((b for a, b in background if start <= a < following), default=stop), following)
        if until > stop:
            found.append((stop, until, op))
    return found


def _minus(a: float, b: float, cuts: list[Interval], ends: list[float]) -> list[Interval]:
    """[a, b) without ``cuts`` (disjoint, in order; ``ends``: their ends)."""
    left = []
    for x, y in cuts[bisect.bisect_right(ends, a):]:
        if x >= b:
            break
        if x > a:
            left.append((a, x))
        a = y
    return left + [(a, b)] if a < b else left


def _step_segments(step: _Node, background: list[Interval]) -> list[Segment]:
    """A step's segments in ms from its start: its ops' pieces (_pieces), the waits after its collectives (_waits)
    communication instead of the time between ops they cover, touching pieces of one kind and op joined."""
    pieces = list(_pieces(step.children))
    waits = _waits(pieces, background, step.end)
    cuts = [(a, b) for a, b, _ in waits]
    ends = [b for _, b in cuts]
    flat = [(a, b, COMMUNICATION, op) for a, b, op in waits]
    for a, b, kind, op, between in pieces:
        flat += [(x, y, kind, op) for x, y in (_minus(a, b, cuts, ends) if between else [(a, b)])]
    joined: list[list] = []
    for a, b, kind, op in sorted(flat):
        if joined and joined[-1][1] == a and joined[-1][2:] == [kind, op]:
            joined[-1][1] = b
        else:
            joined.append([a, b, kind, op])
    return [Segment(a - step.start, b - step.start, kind, op) for a, b, kind, op in joined]


@functools.lru_cache(maxsize=16)
def _read(path: str, mtime_ns: int) -> list[RankStep]:
    try:
        events = json.loads(Path(path).read_text())["traceEvents"]
        spans = [e for e in events if e.get("ph") == "X"]
        steps = [e for e in spans if STEP.match(str(e.get("name", "")))]
        if not steps:
            raise ValueError("no ProfilerStep spans")
        pid, tid = steps[0]["pid"], steps[0]["tid"]
        ours = [e for e in spans if e.get("pid") == pid and isinstance(e.get("name"), str)
                and isinstance(e.get("ts"), int | float) and isinstance(e.get("dur"), int | float)]
        main = [e for e in ours if e["tid"] == tid]
        background = [(e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3, e["name"]) for e in ours
                      if e["tid"] != tid and COLLECTIVE.match(e["name"])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WorkbenchError(f"{path} is not the Chrome trace of a profiled replay ({exc})") from None
    rank_steps = []
    for node in _tree(main):
        found = STEP.match(node.name)
        if not found:
            continue
        mine = [(max(a, node.start), min(b, node.end), name) for a, b, name in background
                if a < node.end and b > node.start]
        segments = _step_segments(node, [(a, b) for a, b, _ in mine])
        flight = _union([(a - node.start, b - node.start) for a, b, name in mine if ALL_TO_ALL.search(name)]
                        + [(s.start, s.end) for s in segments if s.kind == COMMUNICATION and ALL_TO_ALL.search(s.op)])
        rank_steps.append(RankStep(-1, int(found.group(1)), node.end - node.start, segments, flight))
    return rank_steps


def read_trace(path: Path, rank: int) -> list[RankStep]:
    """The steps of one rank's Chrome trace; WorkbenchError when it is missing or not a profiled replay's."""
    if not path.is_file():
        raise WorkbenchError(f"the trace of rank {rank} is missing: {path}")
    steps = _read(str(path), path.stat().st_mtime_ns)
    return [RankStep(rank, s.step, s.ms, s.segments, s.all_to_all) for s in steps]


def figures(step: RankStep) -> StepFigures:
    """The milliseconds of one rank's step (the module docstring)."""
    by_kind: dict[str, list[Interval]] = defaultdict(list)
    ops: dict[str, float] = defaultdict(float)
    for s in step.segments:
        by_kind[s.kind].append((s.start, s.end))
        if s.kind == COMPUTE:
            ops[s.op] += s.end - s.start
    compute, communication = _measure(by_kind[COMPUTE]), _measure(by_kind[COMMUNICATION])
    experts = [(s.start, s.end) for s in step.segments if s.op == EXPERTS]
    return StepFigures(step.rank, step.step, step.ms, compute, communication,
                       max(step.ms - compute - communication, 0.0), _measure(step.all_to_all),
                       _overlap(by_kind[COMMUNICATION], step.all_to_all), _overlap(experts, step.all_to_all),
                       dict(ops))


def bubbles(step: RankStep, threshold_ms: float) -> list[Bubble]:
    """The idle gaps of at least ``threshold_ms`` in one rank's step, with the ops around them."""
    found, cursor, before = [], 0.0, "step start"
    for s in [*step.segments, Segment(step.ms, step.ms, IDLE, "step end")]:
        if s.start - cursor >= threshold_ms:
            found.append(Bubble(step.rank, step.step, cursor, s.start - cursor, before, s.op))
        if s.end >= cursor:
            cursor, before = s.end, s.op
    return found


def slowest(steps: list[StepFigures]) -> Slowest | None:
    """The rank whose compute exceeds the other ranks' mean the most over the steps after the warm-up
    (``WARMUP_STEPS``; all of them when no later step was traced), its step where it does the most, and the op (a
    block, else a top-level op) whose compute there exceeds the others' mean the most; None with one rank, or when no
    rank computes ``SLOW_SHARE`` longer than the others at any step."""
    by_step: dict[int, list[StepFigures]] = defaultdict(list)
    for s in steps:
        by_step[s.step].append(s)
    compared = sorted(by_step)[WARMUP_STEPS:] or sorted(by_step)
    by_step = {step: by_step[step] for step in compared}
    excess: dict[int, list[tuple[float, StepFigures, list[StepFigures]]]] = defaultdict(list)
    for ranks in by_step.values():
        for s in ranks:
            others = [o for o in ranks if o is not s]
            if others:
                excess[s.rank].append((s.compute_ms - _mean(o.compute_ms for o in others), s, others))
    total = {rank: sum(e for e, _, _ in found) for rank, found in excess.items()}
    rank = max(total, key=total.get, default=None)
    if rank is None or total[rank] <= 0:
        return None
    _, s, others = max(excess[rank], key=lambda found: found[0])
    if s.compute_ms < (1 + SLOW_SHARE) * _mean(o.compute_ms for o in others):
        return None
    op = max(s.ops, key=lambda name: s.ops[name] - _mean(o.ops.get(name, 0.0) for o in others))
    return Slowest(s.rank, s.step, s.compute_ms, _mean(o.compute_ms for o in others), op, s.ops[op],
                   _mean(o.ops.get(op, 0.0) for o in others))


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


def report(paths: list[Path], bubble_ms: float = DEFAULT_BUBBLE_MS) -> TraceReport:
    """Read every rank's trace (``paths`` by rank) and report it (the module docstring)."""
    rank_steps = [step for rank, path in enumerate(paths) for step in read_trace(path, rank)]
    steps = [figures(s) for s in rank_steps]
    gaps = sorted((b for s in rank_steps for b in bubbles(s, bubble_ms)), key=lambda b: -b.ms)
    return TraceReport(steps, gaps, slowest(steps), bubble_ms)


def replay_traces(detail: dict | None, replay_id: int) -> list[Path]:
    """The trace paths (by rank) a replay recorded in its detail; WorkbenchError for a replay without them."""
    traces = (detail or {}).get("traces")
    if not traces:
        raise WorkbenchError(f"replay #{replay_id} has no traces (a distributed replay records them with --profile)")
    return [Path(p) for p in traces]


def timeline(step: RankStep, join_ms: float = 0.2) -> list[Segment]:
    """One rank's step for a chart: consecutive spans of one kind less than ``join_ms`` apart drawn as one (named
    by the op that takes most of it), the gaps between as idle."""
    drawn: list[tuple[Segment, dict[str, float]]] = []
    for s in step.segments:
        if drawn and drawn[-1][0].kind == s.kind and s.start - drawn[-1][0].end < join_ms:
            last, ops = drawn[-1]
            ops[s.op] = ops.get(s.op, 0.0) + s.end - s.start
            drawn[-1] = Segment(last.start, max(last.end, s.end), s.kind, max(ops, key=ops.get)), ops
        else:
            drawn.append((s, {s.op: s.end - s.start}))
    shown, cursor = [], 0.0
    for s, _ in drawn:
        if s.start - cursor >= join_ms:
            shown.append(Segment(cursor, s.start, IDLE, IDLE))
        shown.append(s)
        cursor = max(cursor, s.end)
    return shown
