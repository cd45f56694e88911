"""Which passing candidate the agent prefers: spill-free on every required target at the model and smoke suites
first (the gate), then the shortest time, then the smallest worst error. The time is the measured one (the model suite
timed on the backend's GPU, workbench.perf.measure) when the candidates were measured, else the cost model's
modelled time on the ranking target (workbench.perf.cost). The reason is said, for the run's trace."""

from __future__ import annotations

from workbench.agent.state import Attempt

RANK_TARGETS = ("sm_90a", "gfx942", "sm_100a", "gfx950", "sm_80")  # the first of these that is required ranks


def rank_target(targets: list[str]) -> str | None:
    return next((t for t in RANK_TARGETS if t in targets), None)


def _measured(attempt: Attempt) -> float:
    return (attempt.get("measured") or {}).get("time_ms") or float("inf")


def _modelled(attempt: Attempt, target: str | None) -> float:
    figure = (attempt.get("modelled") or {}).get(target or "", {})
    return figure.get("time_ms") or float("inf")


def rank_passing(passing: list[Attempt], targets: list[str]) -> tuple[list[Attempt], str]:
    """(passing candidates, best first; why). A candidate is spill-free when its target report lists every required
    target in spill_free_on. Where any candidate was measured, measured times rank (one that was not, or whose
    timing failed, after those that were); the modelled ones never mix with them."""
    target = rank_target(targets)
    measured = any(a.get("measured") for a in passing)

    def time_of(a: Attempt) -> float:
        return _measured(a) if measured else _modelled(a, target)

    def shown(a: Attempt) -> str:
        t = time_of(a)
        if measured:
            figure = a.get("measured") or {}
            return f"{t:.3f} ms measured on {figure['device']}" if t != float("inf") else \
                f"not measured ({figure.get('error', 'no timing')})"
        return f"{t:.3f} ms modelled on {target}" if target and t != float("inf") else "no modelled time"

    def spill_free(a: Attempt) -> bool:
        return set(targets) <= set(a.get("target_report", {}).get("spill_free_on", []))

    ranked = sorted(passing, key=lambda a: (not spill_free(a), time_of(a), a["worst_ratio"]))
    if len(ranked) < 2:
        return ranked, ""
    lines = [f"#{a['iteration']} {a['template']} {shown(a)}, {'spill-free' if spill_free(a) else 'spills'}, "
             f"worst error {a['worst_ratio']:.2f}" for a in ranked]
    gate = "spill-free on every required target first" if any(spill_free(a) for a in ranked) else \
        "none spill-free on every required target"
    return ranked, f"ranked {len(ranked)} passing ({gate}, then {'measured' if measured else 'modelled'} " \
                   f"time): " + "; ".join(lines)
