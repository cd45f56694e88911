"""Hold a replay against its reference: every step inside the band, the final loss within tolerance, no NaN, the
trained parameters and the eval top-k log-probs close (Liger's convergence-test checks)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from workbench.replay.presets import Preset
from workbench.replay.train import RunResult
from workbench.vocabulary import ReplayStatus


@dataclass
class Judgement:
    """status "pass" or "fail"; reason: one line; left_band_step: the first step outside the band (None if none);
    checks: {name: {"passed", ...figures}}."""

    status: str
    reason: str
    left_band_step: int | None = None
    max_deviation: float = 0.0
    checks: dict[str, dict] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == ReplayStatus.PASS


def band_width(reference: float, preset: Preset) -> float:
    return preset.band_atol + preset.band_rtol * abs(reference)


def judge(run: RunResult, reference: RunResult, preset: Preset) -> Judgement:
    checks: dict[str, dict] = {}
    n = len(reference.curve)
    # the curve: as long as the reference's, finite, inside the band at every step
    deviations = [abs(a - b) / band_width(b, preset) for a, b in zip(run.curve, reference.curve, strict=False)]
    outside = [i for i, d in enumerate(deviations) if d > 1]
    left = outside[0] if outside else None
    max_dev = max((abs(a - b) / abs(b) for a, b in zip(run.curve, reference.curve, strict=False)), default=0.0)
    checks["finite"] = {"passed": run.nonfinite_step is None, "nonfinite_step": run.nonfinite_step}
    checks["length"] = {"passed": len(run.curve) == n, "steps": len(run.curve), "reference_steps": n}
    checks["band"] = {"passed": left is None, "left_band_step": left, "steps_outside": len(outside),
                      "rtol": preset.band_rtol, "atol": preset.band_atol, "max_relative_deviation": max_dev}
    if run.curve and reference.curve and len(run.curve) == n:
        final, ref_final = run.curve[-1], reference.curve[-1]
        checks["final_loss"] = {"passed": abs(final - ref_final) <= preset.final_rtol * abs(ref_final),
                                "loss": final, "reference": ref_final, "rtol": preset.final_rtol}
    checks["parameters"] = _parameters(run, reference, preset)
    checks["eval_topk"] = _topk(run, reference, preset)
    failed = [name for name, c in checks.items() if not c["passed"]]
    if not failed:
        return Judgement(ReplayStatus.PASS, f"inside the band at all {n} steps (largest deviation {max_dev:.2e}), "
                                            f"final loss {run.curve[-1]:.4f} vs {reference.curve[-1]:.4f}", None,
                         max_dev, checks)
    return Judgement(ReplayStatus.FAIL, _reason(failed[0], checks, run, reference), left, max_dev, checks)


def _parameters(run: RunResult, reference: RunResult, preset: Preset) -> dict:
    """Each trained tensor's fingerprint [norm, <param, signs>] within param_rtol of the reference tensor's norm."""
    if run.nonfinite_step is not None or set(run.fingerprints) != set(reference.fingerprints):
        return {"passed": False, "worst": None, "worst_error": math.inf}
    worst, worst_err = None, 0.0
    for name, (ref_norm, ref_dot) in reference.fingerprints.items():
        norm, dot = run.fingerprints[name]
        scale = max(ref_norm, 1e-12)
        err = max(abs(norm - ref_norm), abs(dot - ref_dot)) / scale
        if err > worst_err or worst is None:
            worst, worst_err = name, err
    return {"passed": worst_err <= preset.param_rtol, "worst": worst, "worst_error": worst_err,
            "rtol": preset.param_rtol}


def _topk(run: RunResult, reference: RunResult, preset: Preset) -> dict:
    """Eval top-k: the same ids per token (as sets) and log-probs within topk_atol where the ids agree."""
    if not run.topk_ids or len(run.topk_ids) != len(reference.topk_ids):
        return {"passed": False, "id_agreement": 0.0, "worst_logprob_error": math.inf}
    same, total, worst = 0, 0, 0.0
    for ids, values, ref_ids, ref_values in zip(run.topk_ids, run.topk_values, reference.topk_ids,
                                                reference.topk_values, strict=True):
        ref = dict(zip(ref_ids, ref_values, strict=True))
        for i, v in zip(ids, values, strict=True):
            total += 1
            if i in ref:
                same += 1
                worst = max(worst, abs(v - ref[i]))
    agreement = same / max(total, 1)
    # a near-tie at the k-th place may swap one id for another: allow one in a hundred
    return {"passed": agreement >= 0.99 and worst <= preset.topk_atol, "id_agreement": agreement,
            "worst_logprob_error": worst, "atol": preset.topk_atol}


def _reason(name: str, checks: dict, run: RunResult, reference: RunResult) -> str:
    c = checks[name]
    if name == "finite":
        return f"non-finite loss at step {c['nonfinite_step']}"
    if name == "length":
        return f"{c['steps']} steps recorded, the reference has {c['reference_steps']}"
    if name == "band":
        step = c["left_band_step"]
        return (f"left the band at step {step}: loss {run.curve[step]:.6f} vs reference {reference.curve[step]:.6f} "
                f"({c['steps_outside']} steps outside, band {c['rtol']:g} relative + {c['atol']:g})")
    if name == "final_loss":
        return f"final loss {c['loss']:.6f} vs reference {c['reference']:.6f} (tolerance {c['rtol']:g} relative)"
    if name == "parameters":
        return (f"trained parameter {c['worst']} differs by {c['worst_error']:.2e} of its norm "
                f"(tolerance {c.get('rtol')})")
    return (f"eval top-k log-probs differ: ids agree on {c['id_agreement']:.1%}, worst log-prob error "
            f"{c['worst_logprob_error']:.2e} (tolerance {c.get('atol')})")


def judge_ranks(rank_curves: list[list[float]], reference_rank_curves: list[list[float]], preset: Preset) -> dict:
    """Each rank's local loss per step against the same rank's under the reference (the band of ``judge``): the
    first step where a rank leaves its band, and the rank furthest outside it there (a defect on one rank shows
    first in that rank's loss). Figures: the largest relative deviation of each rank."""
    worst = [max((abs(a - b) / abs(b) for a, b in zip(run, ref, strict=False)), default=0.0)
             for run, ref in zip(rank_curves, reference_rank_curves, strict=False)]
    check = {"passed": len(rank_curves) == len(reference_rank_curves), "step": None, "rank": None,
             "max_relative_deviation": worst}
    steps = min((len(c) for c in [*rank_curves, *reference_rank_curves]), default=0)
    for step in range(steps):
        outside = [(abs(run[step] - ref[step]) / band_width(ref[step], preset), rank)
                   for rank, (run, ref) in enumerate(zip(rank_curves, reference_rank_curves, strict=False))]
        excess, rank = max(outside)
        if excess > 1:
            return {**check, "passed": False, "step": step, "rank": rank, "loss": rank_curves[rank][step],
                    "reference": reference_rank_curves[rank][step]}
    return check


def judge_curve(curve: list[float], reference: list[float], preset: Preset) -> dict:
    """A second loss curve (the MTP loss) against its reference: as long, finite, inside the band at every step."""
    deviations = [abs(a - b) / band_width(b, preset) for a, b in zip(curve, reference, strict=False)]
    outside = [i for i, (d, a) in enumerate(zip(deviations, curve, strict=True)) if d > 1 or not math.isfinite(a)]
    worst = max((abs(a - b) / abs(b) for a, b in zip(curve, reference, strict=False)), default=0.0)
    return {"passed": not outside and len(curve) == len(reference), "left_band_step": outside[0] if outside else None,
            "steps": len(curve), "reference_steps": len(reference), "max_relative_deviation": worst}
