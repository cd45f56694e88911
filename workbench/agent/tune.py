"""The port's tuning: from the passing candidate the run chose, a search for each target's launch settings (and, where
a target still spills, for a neighbouring template point) by compile-only probes.

A probe renders the template at a point with a per-target table of launch settings (the template's declared
``launch`` space, templates/_launch.j2's TUNED_SETTINGS), captures its launches at the model and smoke suites in the
sandbox and compiles them for the targets being searched (seconds; no numerics run). Each target's figure is the
builds' worst spill and most registers at both suites (small sizes bind other tiles than the model's) and the cost
model's time at the model suite; on the target of a GPU backend that measures, where the probe compiled it
spill-free, the measured time instead (the probe timed on that GPU at the model suite, its outputs checked; a move
there must be faster past both spreads of the trials). A launch whose compile runs past
workbench.verify.aot.PROBE_COMPILE_S fails that target (minutes of ptxas on a spilling extreme are a finding, not a
wait) and its other launches are not compiled. Targets are independent (a target's launches read only its own
settings), so one probe tries a different neighbour on every target at once, and a table of every target's best is
exact.

A point where a target spills more than HEAVY_SPILL bytes a thread (or does not compile) first takes the bold point
step (every size one step smaller at once) while it spills less: no launch setting relieves a spill of more than a
thread's whole register file. Then, per target, the search is a descent over the neighbours of its best settings
(one setting one step along its choices; where the target spills, first every setting one step toward fewer
registers a thread at once, then those steps one by one: more warps, fewer stages, smaller tiles): a neighbour that
compiles where the best does not, is spill-free where the best spills, spills less, or is faster (by more than TIE)
becomes the best; one that ties is a plateau: the next step the same way is tried too, then the tie's other
neighbours (two settings that pay only together: more warps, then a register cap), and the search moves to a tie
that changes fewer of the template's own settings. A target stops when no untried neighbour is left (the best is a
local optimum), when it spills and STALL settings in a row relieved nothing (each one step toward fewer registers
tried among them, and the step past one that spilled as much: a bold step that failed says nothing of its parts,
a step that spilled as much nothing of the next one), or when a budget ends (probes and seconds:
SPILL_BUDGET times the port's while a target spills at the model suite or a shrunk point grows back; else, and for a
spill at the smoke suite alone, the port's probes counted past those, and its seconds), and says which. Spills come
first: once every spilling target has stopped, the spill-free targets' speed search waits for the point search and
the growth back, and goes on at the point they end at. When a required target spills at every launch setting tried,
the template's neighbouring points are probed: first every size one step smaller at once (the bold step), then the
points where no size grows before those where one does, the fewest parameters changed, the fewest steps; a dtype
(the operands' arithmetic) moves alone, at the sizes as they are. A point nearer spill-free (fewer targets that do
not compile, then fewer bytes spilled over all targets) becomes the search's point (its numerics are verified before
anything is promoted): its launch settings are searched again, then its own neighbouring points, until every target
is spill-free or a budget ends. A point the spills shrank then grows back, one size one step up at a time, where it
stays spill-free everywhere and is modelled faster (its time over the best's, averaged over the targets) or as fast
(within TIE: a size the spills alone moved, which the time does not see, goes back toward the passing point's, the
template's own choice); a point grown back that compiles but spills has its launch settings searched first (the shrink
judged it at the settings of its time: a tile setting may relieve it), where no launch search has been there yet, and
is judged at the best they find.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from workbench.backends import TARGETS
from workbench.templating import Template, format_point
from workbench.verify.aot import spill_counted
from workbench.vocabulary import Verdict

TIE = 0.01
"""A neighbour must be modelled this much faster (relative) to move the search: the cost model's noise floor."""
DEFAULT_PROBES = 8
"""Compile-only probes a port's tuning may spend (each compiles every searched target's kernels once)."""
SPILL_BUDGET = 3
"""While a target spills at the model suite or does not compile, the budgets (probes and seconds) are this many
times the port's: a spill at the model's sizes is the finding the search exists for, a faster spill-free neighbour is
not. A spill at the smoke suite alone is searched within the port's own budgets: kda's 8 B a thread at one smoke shape
on sm_100a, which no setting relieved, held `make port` for 1809 s at three times."""
DEFAULT_SECONDS = 600.0
"""The wall time after which the tuning starts no probe (a probe under way finishes: a compile is not cut)."""
STALL = 2
"""Launch settings a spilling target tries in a row without spilling less, after which (and once each single step
toward fewer registers from its best, and the step past one that spilled as much, has been tried) its launch search
stops and the template's neighbouring points are probed. In the walks of the reversed and the hand-ordered cards,
89 of 90 launch settings that relieved a spill came at most one probe after the last relief (the other: 16 B, four
after)."""
HEAVY_SPILL = 1024
"""Bytes a thread spills past which no launch setting is tried first: more than a whole NVIDIA register file (255
32-bit registers) a thread, where more warps at best halve a thread's share of the tile. Such a point (or one that
does not compile) takes the bold point step first: every size one step smaller at once."""
PRESSURE_UP = ("warps",)
"""Launch settings that relieve register pressure upward (more warps share the tile); every other one downward,
but a register cap (maxnreg), which lowers a thread's registers by spilling."""
COMPILER_STAGES = {"cuda": 3, "hip": 2}
"""The pipeline stages Triton 3.9 compiles a launch that leaves a stages setting None with (CUDAOptions.num_stages,
HIPOptions.num_stages): where None stands in a stages setting's value order on a target's backend."""

Settings = dict[str, Any]
Table = dict[str, Settings]


@dataclass
class Figure:
    """One target's outcome of a probe: compiled, worst spill (B/thread), most registers, time (ms; None: not
    modelled, or its measurement failed), whether the time was measured and its spread (ms: the interquartile ranges
    of the trials, summed over the shapes; 0 when modelled), and whether the spill is at the smoke suite alone (the
    model suite's launches spill-free)."""

    ok: bool
    spilled_bytes: int = 0
    registers: int = 0
    time_ms: float | None = None
    measured: bool = False
    spread_ms: float = 0.0
    error: str = ""
    smoke_only: bool = False

    @property
    def spills(self) -> bool:
        """Spills or does not compile: what the search exists to relieve."""
        return not self.ok or self.spilled_bytes > 0

    @property
    def at_model(self) -> bool:
        """Spills at the model's own sizes (or does not compile): what earns the search SPILL_BUDGET times the
        port's budgets. A spill at the smoke suite alone (small sizes that bind other tiles) is relieved within the
        port's own budgets."""
        return self.spills and not self.smoke_only

    @property
    def heavy(self) -> bool:
        """Spills more than HEAVY_SPILL or does not compile: the bold point step before any launch setting."""
        return not self.ok or self.spilled_bytes > HEAVY_SPILL

    def key(self) -> tuple:
        return (not self.ok, self.spilled_bytes > 0, self.spilled_bytes,
                self.time_ms if self.time_ms is not None else float("inf"))

    def relieves(self, other: Figure) -> bool:
        """Nearer spill-free than the other: compiles where it does not, spill-free where it spills, or spills less
        (by more than TIE)."""
        mine, theirs = self.key(), other.key()
        if mine[:2] != theirs[:2]:
            return mine[:2] < theirs[:2]
        return mine[2] < theirs[2] * (1 - TIE)

    def better_than(self, other: Figure) -> bool:
        """Relieves the other's spill; or, the spills equal, is faster by more than TIE (measured times: by more
        than TIE past both spreads, so that the noise of the trials moves nothing)."""
        if self.key()[:3] != other.key()[:3]:
            return self.relieves(other)
        return self.key()[3] + self.spread_ms < (other.key()[3] - other.spread_ms) * (1 - TIE)

    def timed(self, timing: dict) -> Figure:
        """This figure with its time measured (workbench.perf.measure's figure): time_ms and spread_ms; no time,
        and the error, where the measurement failed (the candidate was wrong, crashed or ran out of time at the
        sizes timed: no neighbour is slower than that)."""
        return replace(self, time_ms=timing.get("time_ms"), spread_ms=timing.get("spread_ms") or 0.0, measured=True,
                       error=timing.get("error", ""))

    def text(self) -> str:
        if not self.ok:
            return f"does not compile ({self.error[:80]})"
        spill = f"spills {self.spilled_bytes} B" if self.spilled_bytes else "spill-free"
        when = f"not measured ({self.error[:80]})" if self.measured and self.time_ms is None else \
            "no time" if self.time_ms is None else f"{self.time_ms:.4f} ms measured (spread {self.spread_ms:.4f})" \
            if self.measured else f"{self.time_ms:.4f} ms modelled"
        return f"{self.registers} registers, {spill}, {when}"


@dataclass
class Trial:
    """One target's point of one probe, as the record keeps it."""

    probe: int
    target: str
    params: dict[str, Any]
    settings: Settings
    figure: Figure
    moved: bool
    why: str

    def to_dict(self) -> dict:
        return {"probe": self.probe, "target": self.target, "params": self.params, "settings": self.settings,
                **vars(self.figure), "moved": self.moved, "why": self.why}


@dataclass
class Outcome:
    """The search's result: the point, the per-target table (only what differs from the template's own settings),
    each target's best figure and why it stopped, every trial, the probes spent and the seconds."""

    params: dict[str, Any]
    tuned: Table
    best: dict[str, Figure]
    stopped: dict[str, str]
    trials: list[Trial] = field(default_factory=list)
    probes: int = 0
    seconds: float = 0.0

    def spill_free_on(self) -> list[str]:
        return [t for t, f in self.best.items() if not f.spills]

    def summary(self) -> str:
        per_target = "; ".join(f"{t}: {format_point(self.tuned.get(t, {})) or 'template settings'} "
                               f"({self.best[t].text()}; {self.stopped[t]})" for t in self.best)
        return f"{self.probes} compile-only probes, {self.seconds:.0f} s: {format_point(self.params)}; {per_target}"


Probe = Callable[[dict[str, Any], Table, list[str]], dict[str, Figure]]
"""probe(params, table, targets): each target's figure for the template at ``params`` with ``table``'s settings."""


def compiled_as(key: str, value: Any, target: str | None) -> Any:
    """What a launch setting's value compiles as on ``target``: None in a stages setting is the backend's
    COMPILER_STAGES; any other value (None in a register cap: no cap) is itself."""
    if value is None and target and "stages" in key:
        return COMPILER_STAGES[TARGETS[target].backend]
    return value


def axis(choices: list, key: str = "", target: str | None = None) -> list:
    """A setting's choices in value order, whatever order of preference the sidecar lists them in. None (the
    compiler's own choice) stands where it compiles on ``target`` (a stages setting's: 3 on NVIDIA, 2 on AMD), in
    place of that number, which would compile the same; else last (no register cap, or no target: the top of its
    range)."""
    own = compiled_as(key, None, target)
    if own is not None and None in choices:
        choices = [v for v in choices if v != own]

    def position(v: Any) -> float:
        as_compiled = compiled_as(key, v, target)
        return float("inf") if as_compiled is None else as_compiled
    return sorted(choices, key=position)


def base_settings(per_target: dict[str, Settings], target: str, keys: list[str]) -> Settings:
    """The settings a target runs with from the template alone (its LAUNCH_SETTINGS merged as the candidate's
    target_settings merges them: default, backend, target)."""
    backend = TARGETS[target].backend
    merged = {**per_target.get("default", {}), **per_target.get(backend, {}), **per_target.get(target, {})}
    return {k: merged.get(k) for k in keys}


def step(template: Template, settings: Settings, key: str, direction: int, target: str | None = None
         ) -> Settings | None:
    """``settings`` with ``key`` one step along its value order on ``target`` (direction -1 or 1; a number that
    None stands for there steps as None); None past either end."""
    values = axis(template.launch[key]["choices"], key, target)
    current = settings[key]
    if current not in values and None in values and compiled_as(key, None, target) == current:
        current = None
    if current not in values or not 0 <= values.index(current) + direction < len(values):
        return None
    return {**settings, key: values[values.index(current) + direction]}


def relieving(key: str) -> int:
    """The direction that relieves register pressure: up for warps, down for stages and tiles; 0 for a register
    cap (either way trades spills for occupancy)."""
    return 0 if "maxnreg" in key else 1 if any(word in key for word in PRESSURE_UP) else -1


def neighbours(template: Template, settings: Settings, relieve: bool, target: str | None = None
               ) -> Iterator[tuple[Settings, str, str, int]]:
    """(settings one step away along one launch setting on ``target``, the move in words, the key, the direction);
    with ``relieve`` (the target spills or does not compile), first every relieving step at once, then the relieving
    steps one by one, then the others."""
    moves = [(moved, f"{key} {settings[key]} -> {moved[key]}", key, d) for key in template.launch for d in (-1, 1)
             if (moved := step(template, settings, key, d, target)) is not None]
    if relieve:
        bold = {**settings}
        for moved, _, key, d in moves:
            if d == relieving(key):
                bold[key] = moved[key]
        changed = [k for k in bold if bold[k] != settings[k]]
        if len(changed) > 1:
            yield bold, "every setting one step toward fewer registers a thread: " + ", ".join(
                f"{k} {settings[k]} -> {bold[k]}" for k in changed), "", 0
        moves.sort(key=lambda m: m[3] != relieving(m[2]))
    yield from moves


def probe_figures(report, targets: list[str], modelled: dict[str, dict]) -> dict[str, Figure]:
    """Each target's figure from a probe's target report (workbench.verify.harness.target_report, at the model and
    smoke suites) and its modelled summary ({target: {"time_ms": ...}}): the spill and registers are the worst over
    the launches captured for the target (workbench.verify.aot.spill_counted), the time the model suite's; a
    target's own failed compile fails that target alone; any other verdict (the sandbox's: the candidate crashed,
    hung, was refused) fails every target."""
    whole = report.verdict not in (Verdict.PASS, Verdict.TARGET_COMPILE_ERROR)
    figures = {}
    for target in targets:
        builds = [b for b in report.builds if b["target"] == target and spill_counted(b["suite"])]
        failed = next((b for b in builds if not b["ok"]), None)
        if whole or not any(b["suite"] == "model" for b in builds) or failed:
            why = report.message if whole else failed["error"] if failed else "no model-suite launch captured"
            figures[target] = Figure(ok=False, error=why)
        else:
            spilled = max(b["spilled_bytes"] for b in builds)
            at_model = max(b["spilled_bytes"] for b in builds if b["suite"] == "model")
            figures[target] = Figure(ok=True, spilled_bytes=spilled, registers=max(b["registers"] or 0 for b in builds),
                                     time_ms=modelled.get(target, {}).get("time_ms"),
                                     smoke_only=spilled > 0 and not at_model)
    return figures


def spills_less(figures: dict[str, Figure], than: dict[str, Figure]) -> bool:
    """Whether ``figures`` (every target's, at a point) is nearer spill-free everywhere than ``than``: fewer targets
    that do not compile, then fewer bytes spilled over all targets (by more than TIE)."""
    def totals(found: dict[str, Figure]) -> tuple[int, int]:
        return sum(not f.ok for f in found.values()), sum(f.spilled_bytes for f in found.values() if f.ok)
    (broken, spilled), (was_broken, was_spilled) = totals(figures), totals(than)
    return broken < was_broken or (broken == was_broken and spilled < was_spilled * (1 - TIE))


def time_ratio(figures: dict[str, Figure], than: dict[str, Figure], spills: bool = False) -> float | None:
    """``figures``' time (every target's, at a point) over ``than``'s, averaged over the targets (a measured time
    counted at its slow end against the other's fast end); None unless it is spill-free everywhere (with ``spills``:
    compiles everywhere) and timed."""
    if not all(f.ok and (spills or not f.spilled_bytes) and f.time_ms for f in figures.values()):
        return None
    ratios = [(f.time_ms + f.spread_ms) / (than[t].time_ms - than[t].spread_ms) for t, f in figures.items()
              if than[t].time_ms and than[t].time_ms > than[t].spread_ms]
    return sum(ratios) / len(ratios) if ratios else None


def faster(figures: dict[str, Figure], than: dict[str, Figure], spills: bool = False) -> bool:
    """Whether ``figures`` is spill-free everywhere (with ``spills``: compiles everywhere) and modelled faster than
    ``than``: its time_ratio below 1 - TIE."""
    ratio = time_ratio(figures, than, spills)
    return ratio is not None and ratio < 1 - TIE


def as_fast(figures: dict[str, Figure], than: dict[str, Figure]) -> bool:
    """Whether ``figures`` is spill-free everywhere and no slower than ``than`` (its time_ratio within TIE of 1 or
    below): a tie."""
    ratio = time_ratio(figures, than)
    return ratio is not None and ratio <= 1 + TIE


class Tuner:
    """The search for one template point and its per-target launch settings (see the module's docstring)."""

    def __init__(self, template: Template, params: dict[str, Any],
                 launch_table: Callable[[dict[str, Any]], dict[str, Settings]], targets: list[str], probe: Probe,
                 budget: int = DEFAULT_PROBES, seconds: float = DEFAULT_SECONDS,
                 covers: Callable[[dict[str, Any]], bool] | None = None,
                 on_trial: Callable[[Trial], None] | None = None, imprecise: list[dict[str, Any]] | None = None):
        self.template, self.params, self.targets = template, dict(params), list(targets)
        self.launch_table, self.probe, self.budget, self.seconds = launch_table, probe, budget, seconds
        self.started = time.monotonic()
        self.covers = covers or (lambda p: True)
        # points of the template the run's verification found too imprecise: no dtype moves to their arithmetic
        self.imprecise = list(imprecise or [])
        self.on_trial = on_trial or (lambda trial: None)
        self.trials: list[Trial] = []
        self.probes = 0
        self.relief = 0  # probes spent relieving spills and growing back what they shrank (not the speed's budget)
        self._bases: dict[str, dict[str, Settings]] = {}
        self._tried: dict[tuple[str, str], list[Settings]] = {}  # (point, target): the settings probed there
        self._figures: dict[tuple[str, str, str], Figure] = {}  # (point, target, settings): each probe's figure
        self._grown: set[tuple[str, str]] = set()  # (point, table): each growth tried
        self._points = list(template.points())  # every valid point, enumerated once

    def _probe(self, params: dict, table: Table, targets: list[str], spilling: bool = False) -> dict[str, Figure]:
        """The probe of ``table`` (full settings per target), rendered with what differs from the point's own;
        ``spilling``: made to relieve a spill (counted apart from the speed search's budget)."""
        self.probes += 1
        self.relief += spilling
        base = self._base(params)
        diff = {t: {k: v for k, v in s.items() if v != base[t][k]} for t, s in table.items()}
        figures = self.probe(params, {t: d for t, d in diff.items() if d}, targets)
        self._figures |= {self._probe_key(params, t, {**base[t], **table.get(t, {})}): figures[t] for t in targets}
        return figures

    @staticmethod
    def _probe_key(params: dict, target: str, settings: Settings) -> tuple[str, str, str]:
        return format_point(params), target, format_point(settings)

    def _spent(self, spilling: bool) -> str:
        """Why the search may start no probe now ('' while it may): its probe budget (SPILL_BUDGET times the
        port's while ``spilling``; the port's own, past the probes that relieved spills, when not) or its seconds
        (SPILL_BUDGET times the port's while ``spilling``) are spent."""
        if spilling and self.probes >= self.budget * SPILL_BUDGET:
            return f"probe budget of {self.budget * SPILL_BUDGET} ({SPILL_BUDGET} x {self.budget} while a target " \
                   f"spills) spent"
        if not spilling and self.probes >= self.budget + self.relief:
            return f"probe budget of {self.budget} spent" + (f" (and {self.relief} relieving spills)"
                                                               if self.relief else "")
        seconds = self.seconds * (SPILL_BUDGET if spilling else 1)
        if time.monotonic() - self.started >= seconds:
            return f"time budget of {seconds:.0f} s spent" + (f" ({SPILL_BUDGET} x {self.seconds:.0f} while a "
                                                              f"target spills)" if spilling else "")
        return ""

    def _trial(self, target: str, params: dict, settings: Settings, figure: Figure, moved: bool, why: str) -> None:
        trial = Trial(self.probes, target, dict(params), dict(settings), figure, moved, why)
        self.trials.append(trial)
        self.on_trial(trial)

    def _base(self, params: dict) -> dict[str, Settings]:
        """Each target's settings from the template at ``params`` alone (rendered once per point)."""
        key = format_point(params)
        if key not in self._bases:
            per_target = self.launch_table(params)
            self._bases[key] = {t: base_settings(per_target, t, list(self.template.launch)) for t in self.targets}
        return self._bases[key]

    def _descend(self, params: dict, best: dict[str, tuple[Settings, Figure]], base: dict[str, Settings],
                 speed: bool = True) -> dict[str, str]:
        """Each target's descent from ``best`` (updated in place); why each stopped. A neighbour no better and no
        worse (within TIE) is a plateau: the next step the same way is tried too (a register cap that starts to
        pay two steps down, say), and the search moves there when it is nearer the template's own settings
        (``base``: what a bold step changed for nothing is taken back). Spills first: a spilling target stops
        after STALL settings in a row that relieve nothing, and once every spilling target has stopped the descent
        returns, the spill-free targets' not stopped (their speed search goes on after the point search, at the
        point it ends at: what they tried at a point is remembered). Without ``speed`` (a point the point search
        moved to) it returns as soon as no target spills: the growth back toward the passing point comes before any
        speed search."""
        def changes(target: str, settings: Settings) -> int:
            return sum(settings[k] != base[target][k] for k in settings)

        tried = {t: self._tried.setdefault((format_point(params), t), []) for t in best}
        for target, (settings, _) in best.items():
            if settings not in tried[target]:
                tried[target].append(settings)
        stall = {t: 0 for t in best}  # a spilling target's settings in a row that relieved nothing
        # a tie's next step the same way (tried before the best's own neighbours), and its other neighbours (after)
        plateau: dict[str, list[tuple[Settings, str, str, int]]] = {t: [] for t in best}
        across: dict[str, list[tuple[Settings, str, str, int]]] = {t: [] for t in best}
        stopped: dict[str, str] = {}
        while True:
            if not speed and not any(f.spills for _, f in best.values()):
                return stopped
            moves = {}
            for target, (settings, _) in best.items():
                if target in stopped:
                    continue
                if best[target][1].spills and stall[target] >= STALL and not any(
                        d == relieving(k) and m not in tried[target] for m, _, k, d in
                        [*neighbours(self.template, settings, True, target), *plateau[target]]):
                    stopped[target] = f"no relief from the last {stall[target]} settings tried (each one step " \
                                      f"toward fewer registers among them): the template's neighbouring points next"
                    continue
                options = [*plateau[target], *neighbours(self.template, settings, best[target][1].spills, target),
                           *across[target]]
                move = next((m for m in options if m[0] not in tried[target]), None)
                if move is None:
                    stopped[target] = f"local optimum: no untried neighbour left ({len(tried[target])} settings " \
                                      f"tried)"
                else:
                    moves[target] = move
            spilling = [t for t, (_, f) in best.items() if f.spills]
            if not moves or (spilling and not any(t in moves for t in spilling)):
                return stopped
            relief = any(best[t][1].at_model for t in spilling)
            if spent := self._spent(relief):
                for target in moves:
                    stopped[target] = spent
                return stopped
            figures = self._probe(params, {t: m[0] for t, m in moves.items()}, list(moves), relief)
            for target, (settings, text, key, direction) in moves.items():
                tried[target].append(settings)
                figure, before = figures[target], best[target][1]
                stall[target] = 0 if figure.relieves(before) else stall[target] + 1
                flat = not figure.better_than(before) and not before.better_than(figure)
                moved = figure.better_than(before) or (flat and changes(target, settings) <
                                                       changes(target, best[target][0]))
                flat = flat and not moved and key
                # a step toward fewer registers that spills as much (slower or not) says nothing of the next one
                onward = flat or (key and not moved and direction == relieving(key) and before.spills and figure.ok
                                  and not figure.relieves(before) and not before.relieves(figure))
                why = f"{text}: {figure.text()}" + (f", better than {before.text()}" if figure.better_than(before)
                                                    else ", as good and nearer the template's settings" if moved else
                                                    ", no better: the next step that way too" if flat else
                                                    ", spills as much: the next step that way too" if onward else "")
                self._trial(target, params, settings, figure, moved, why)
                plateau[target] = [m for m in plateau[target] if m[0] != settings]
                if moved:
                    best[target], plateau[target], across[target] = (settings, figure), [], []
                elif onward:
                    if (further := step(self.template, settings, key, direction, target)) is not None:
                        plateau[target].append((further, f"{key} {settings[key]} -> {further[key]}", key, direction))
                    if flat:
                        across[target] += [(m, f"{text}, then {t}", k, d) for m, t, k, d in
                                           neighbours(self.template, settings, False, target)
                                           if m[key] == settings[key]]

    def _sizes(self, params: dict) -> list[str]:
        """The point's parameters the point search may move: numbers (tiles, programs) that are no launch setting."""
        return [k for k, v in params.items()
                if k not in self.template.launch and isinstance(v, int | float) and not isinstance(v, bool)]

    def _smaller(self, params: dict) -> dict:
        """``params`` with every size one step smaller along its choices (the smallest stays)."""
        smaller = {**params}
        for k in self._sizes(params):
            values = axis(self.template.params[k]["choices"])
            smaller[k] = values[max(values.index(params[k]) - 1, 0)]
        return smaller

    def _settle(self, point: dict) -> dict | None:
        """The template's point with ``point``'s sizes and dtypes: its own values of the parameters that are also
        launch settings where the constraints allow, else the first allowed ones (each target's table sets those;
        the point's only have to satisfy the template's constraints: 8 warps on a tile too small for them, say);
        None where no such point exists."""
        if point in self._points:
            return point
        fixed = [k for k in point if k not in self.template.launch]
        return next((p for p in self._points if all(p[k] == point[k] for k in fixed)), None)

    def _shrink(self, params: dict, best: dict[str, tuple[Settings, Figure]], tried: set[str]
                ) -> tuple[dict, dict[str, tuple[Settings, Figure]]]:
        """While a target spills more than HEAVY_SPILL or does not compile: the bold point step, taken where it
        spills less (fewer targets that do not compile, then fewer bytes over all); (the point, its figures)."""
        while (heavy := [t for t, (_, f) in best.items() if f.heavy]) and \
                not self._spent(relief := any(best[t][1].at_model for t in heavy)):
            point = self._settle(self._smaller(params))
            if point is None or format_point(point) in tried or not self.covers(point) or \
                    all(point[k] == params[k] for k in self._sizes(params)):
                break
            tried.add(format_point(point))
            changes = ", ".join(f"{k} {params[k]} -> {point[k]}" for k in params if point[k] != params[k])
            moved, moved_best = self._relieving_point(point, best, f"{', '.join(heavy)} spill over {HEAVY_SPILL} B a "
                                                      f"thread (or do not compile): every size one step smaller "
                                                      f"before any launch setting: {changes}", relief)
            if not moved:
                break
            params, best = point, moved_best
        return params, best

    def _relieving_point(self, point: dict, best: dict[str, tuple[Settings, Figure]], why: str, relief: bool
                         ) -> tuple[bool, dict[str, tuple[Settings, Figure]]]:
        """The probe of ``point`` at each target's best settings, made to relieve a spill (``relief``: one at the
        model suite, counted apart from the speed search's budget), each target's trial recorded with ``why``:
        (whether it spills less than ``best``, each target's settings and figure there)."""
        table = {t: s for t, (s, _) in best.items()}
        figures = self._probe(point, table, self.targets, spilling=relief)
        moved = spills_less(figures, {t: f for t, (_, f) in best.items()})
        for target in self.targets:
            self._trial(target, point, table[target], figures[target], moved,
                        f"{why}: {figures[target].text()}" + (", less spill: the point moves" if moved else ""))
        return moved, {t: (table[t], figures[t]) for t in self.targets}

    def _point_moves(self, params: dict, tried: set[str]) -> Iterator[tuple[dict, str]]:
        """The template's other covering points: first every size (numbers: tiles, programs) one step smaller at
        once (when that is a point), then the points no size of which grows before those where one does, the
        fewest parameters changed first, the fewest steps along their choices (a dtype takes none). A parameter that
        is no number (a dtype: the operands' arithmetic) moves alone, one at a time and with the sizes as they are:
        fewer registers a value where the sizes alone left a spill, at a precision the verification holds to the
        tolerances before anything is promoted; never to a value a point the run found too imprecise had
        (``imprecise``: the tuned candidate would fail, and the tuning's other moves with it). A parameter that is
        also a launch setting is the launch search's (per target): it moves only where the template's constraints
        need it at the new sizes (``_settle``)."""
        sizes = self._sizes(params)
        arithmetic = [k for k in params if k not in sizes and k not in self.template.launch]
        smaller = self._settle(self._smaller(params))
        seen: set[tuple] = set()

        def order(point: dict) -> tuple:
            changed = [k for k in params if point[k] != params[k]]
            steps = sum(abs(axis(self.template.params[k]["choices"]).index(point[k]) -
                            axis(self.template.params[k]["choices"]).index(params[k])) for k in changed if k in sizes)
            larger = any(k in sizes and point[k] > params[k] for k in changed)
            return point != smaller or len(changed) < 2, larger, len(changed), steps
        for point in sorted(self._points, key=order):
            key, at = format_point(point), tuple(point[k] for k in (*sizes, *arithmetic))
            recast = [k for k in arithmetic if point[k] != params[k]]
            if at in seen or len(recast) > 1 or (recast and any(point[k] != params[k] for k in sizes)) or \
                    any(all(point[k] == bad.get(k) for k in recast) for bad in self.imprecise if recast):
                continue
            seen.add(at)  # one point for each set of sizes and dtypes: the nearest ``params`` in its launch values
            if key not in tried and self.covers(point):
                changes = ", ".join(f"{k} {params[k]} -> {point[k]}" for k in params if point[k] != params[k])
                bold = "every size one step smaller: " if point == smaller and changes.count("->") > 1 else ""
                yield point, bold + changes + (" (the arithmetic: its numerics are verified before it is promoted)"
                                               if recast else "")

    def _growth(self, params: dict, table: Table) -> Iterator[tuple[dict, str]]:
        """The covering points one size one step larger than ``params``, for sizes still below the passing
        point's, the largest step in bytes first (the last tile the spills shrank), not yet grown to with ``table``
        (a point the shrink passed through was judged at the settings of its time, its own never searched)."""
        for key in sorted(params, key=lambda k: -params[k] if isinstance(params[k], int | float) else 0):
            if key in self.template.launch or not isinstance(params[key], int | float) or \
                    isinstance(params[key], bool) or params[key] >= self.params[key]:
                continue
            values = axis(self.template.params[key]["choices"])
            point = self._settle({**params, key: values[values.index(params[key]) + 1]})
            if point is not None and self.covers(point) and (format_point(point), str(table)) not in self._grown:
                yield point, f"{key} {params[key]} -> {point[key]}"

    def run(self) -> Outcome:
        self.started = started = time.monotonic()
        params, tried_points = self.params, {format_point(self.params)}
        base = self._base(params)
        figures = self._probe(params, {}, self.targets)
        for target in self.targets:
            self._trial(target, params, base[target], figures[target], True, f"the passing point: "
                        f"{figures[target].text()}")
        best = {t: (base[t], figures[t]) for t in self.targets}
        params, best = self._shrink(params, best, tried_points)
        base = self._base(params)
        stopped = self._descend(params, best, base) if self.template.launch else \
            {t: f"{self.template.ref} declares no launch settings" for t in self.targets}
        ended = ""
        while spilling := [t for t, (_, f) in best.items() if f.spills]:
            move = next(self._point_moves(params, tried_points), None)
            relief = any(best[t][1].at_model for t in spilling)
            ended = self._spent(relief) or ("" if move else "no other point of the template left to try")
            if ended:
                break
            point, changes = move
            tried_points.add(format_point(point))
            moved, moved_best = self._relieving_point(point, best, f"{', '.join(spilling)} spill at every launch "
                                                      f"setting tried: {changes}", relief)
            if moved:  # the search goes on from there: its launch settings, then its neighbouring points
                params, best = self._shrink(point, moved_best, tried_points)
                base = self._base(params)
                stopped = self._descend(params, best, base, speed=False) if self.template.launch else stopped
        for target, (_, figure) in best.items():
            if figure.spills:
                stopped[target] = f"{stopped.get(target, '')}; still {figure.text()}".strip("; ") + \
                    (f" ({ended})" if ended else "")
        # a point the spills shrank grows back, one size one step, while it stays spill-free and gets faster (or ties)
        while params != self.params and not ended and not any(f.spills for _, f in best.values()):
            table = {t: s for t, (s, _) in best.items()}
            move = next(self._growth(params, table), None)
            if move is None or self._spent(True):
                break
            point, changes = move
            tried_points.add(format_point(point))
            self._grown.add((format_point(point), str(table)))
            keys = {t: self._probe_key(point, t, s) for t, s in table.items()}
            known = all(k in self._figures for k in keys.values())
            figures = {t: self._figures[k] for t, k in keys.items()} if known else \
                self._probe(point, table, self.targets, spilling=True)  # the spill's budget: undoing its shrink
            was = {t: f for t, (_, f) in best.items()}
            moved = faster(figures, was)
            tie = not moved and as_fast(figures, was)  # a size the time does not see: back to the passing point's
            promising = not (moved or tie) and all(f.ok for f in figures.values()) and \
                any(f.spills and (format_point(point), t) not in self._tried for t, f in figures.items())
            for target in self.targets:
                self._trial(target, point, table[target], figures[target], moved or tie,
                            f"the spills shrank the point; growing it back: {changes}: {figures[target].text()}"
                            + (" (as probed before)" if known else "")
                            + (", spill-free and faster: the point moves" if moved else
                               ", spill-free and as fast, nearer the passing point: the point moves" if tie else
                               ", spilling: its launch settings are searched" if promising
                               else ""))
            grown = {t: (table[t], figures[t]) for t in self.targets}
            if moved or promising:  # a point that spills may be relieved by its own launch settings
                reasons = self._descend(point, grown, self._base(point), speed=False) if self.template.launch else \
                    stopped
                now = {t: f for t, (_, f) in grown.items()}
                moved = faster(now, was)
                tie = not moved and as_fast(now, was)
            if tie:  # spill-free everywhere: its speed search is the one at the end
                params, base, best = point, self._base(point), grown
                stopped = {} if self.template.launch else stopped
            elif moved:
                params, base, best, stopped = point, self._base(point), grown, reasons
        # the speed search of the spill-free targets the spills deferred, at the point the search ended at
        if pending := {t: best[t] for t in self.targets if t not in stopped}:
            stopped.update(self._descend(params, pending, base))
            best.update(pending)
        tuned = {}
        for target, (settings, _) in best.items():
            changed = {k: v for k, v in settings.items() if v != base[target][k]}
            if changed:
                tuned[target] = changed
        return Outcome(params=params, tuned=tuned, best={t: f for t, (_, f) in best.items()}, stopped=stopped,
                       trials=self.trials, probes=self.probes, seconds=time.monotonic() - started)
