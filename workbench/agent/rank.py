"""Which passing candidate the agent prefers: spill-free on every required target at the model suite first (the
gate), then the shortest modelled time on the ranking target (workbench.perf.cost; measured times do not take
their place on a GPU backend yet), then the smallest worst error. The reason is said, for the run's trace."""

from __future__ import annotations

from workbench.agent.state import Attempt

RANK_TARGETS = ("sm_90a", "gfx942", "sm_100a", "gfx950", "sm_80")  # the first of these that is required ranks


def rank_target(targets: list[str]) -> str | None:
    return next((t for t in RANK_TARGETS if t in targets), None)


def _time(attempt: Attempt, target: str | None) -> float:
    figure = (attempt.get("modelled") or {}).get(target or "", {})
    return figure.get("time_ms") or float("inf")


def rank_passing(passing: list[Attempt], targets: list[str]) -> tuple[list[Attempt], str]:
    """(passing candidates, best first; why). A candidate is spill-free when its evidence lists every required
    target in spill_free_on."""
    target = rank_target(targets)

    def spill_free(a: Attempt) -> bool:
        return set(targets) <= set(a.get("evidence", {}).get("spill_free_on", []))

    ranked = sorted(passing, key=lambda a: (not spill_free(a), _time(a, target), a["worst_ratio"]))
    if len(ranked) < 2:
        return ranked, ""
    lines = []
    for a in ranked:
        t = _time(a, target)
        shown = f"{t:.3f} ms modelled on {target}" if target and t != float("inf") else "no modelled time"
        lines.append(f"#{a['iteration']} {a['template']} {shown}, {'spill-free' if spill_free(a) else 'spills'}, "
                     f"worst error {a['worst_ratio']:.2f}")
    gate = "spill-free on every required target first" if any(spill_free(a) for a in ranked) else \
        "none spill-free on every required target"
    return ranked, f"ranked {len(ranked)} passing ({gate}, then modelled time): " + "; ".join(lines)
