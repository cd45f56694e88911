"""Numerics shared by the block catalog and the verifier: the tolerance rule, the upcast references compute in, and
the comparison of one output or gradient against the float64 truth and the same-precision reference (the
prologue every comparator starts with, then the default comparison). Imports nothing of the workbench."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    """How close a candidate must come to the float64 truth.

    A value passes when ``|out - truth|.max() <= factor * |ref_lowp - truth|.max() + atol + rtol * |truth|.max()``:
    at most ``factor`` times the error the reference itself makes in the candidate's precision (the FlashAttention
    rule), plus a small floor that keeps exact-in-float32 cases from demanding bit equality.
    """

    factor: float
    atol: float
    rtol: float

    def bound(self, ref_err: float, scale: float) -> float:
        return self.factor * ref_err + self.atol + self.rtol * scale


DEFAULT_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(factor=2.0, atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(factor=2.0, atol=1e-4, rtol=1e-3),
    torch.bfloat16: Tolerance(factor=2.0, atol=1e-3, rtol=8e-3),
}


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    return DEFAULT_TOLERANCES[dtype]


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float32 for low-precision tensors, float64 stays float64: references upcast with this, never to a fixed type."""
    return torch.promote_types(t.dtype, torch.float32)


def contract_problem(out, truth: torch.Tensor, expect_dtype: torch.dtype, *, missing: str) -> str | None:
    """What makes ``out`` incomparable with ``truth`` (the prologue of every comparator), or None: nothing
    returned (``missing`` says it), not a tensor, another shape, another dtype."""
    if out is None:
        return missing
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a tensor"
    if tuple(out.shape) != tuple(truth.shape):
        return f"shape {tuple(out.shape)}, expected {tuple(truth.shape)}"
    if out.dtype != expect_dtype:
        return f"dtype {out.dtype}, expected {expect_dtype}"
    return None


def compare(out: torch.Tensor | None, truth: torch.Tensor, ref_lowp: torch.Tensor, tol: Tolerance,
            expect_dtype: torch.dtype) -> dict:
    """Figures and verdict for one quantity.

    out: the candidate's tensor (None when no gradient reached the input); truth: float64; ref_lowp: the reference
    computed in the candidate's precision. Returns the keyword fields of a Check (passed, reason, max_abs, max_rel,
    err_ratio, ref_err, bound, nonfinite).
    """
    problem = contract_problem(out, truth, expect_dtype, missing="no gradient reached this input")
    if problem:
        return {"passed": False, "reason": problem}
    if truth.numel() == 0:
        return {"passed": True, "max_abs": 0.0, "max_rel": 0.0, "err_ratio": 0.0, "ref_err": 0.0, "bound": 0.0}

    o = out.detach().to("cpu", torch.float64)
    t = truth.detach().to("cpu", torch.float64)
    r = ref_lowp.detach().to("cpu", torch.float64)
    finite_truth = torch.isfinite(t)
    bad = finite_truth & ~torch.isfinite(o)
    # Where the truth itself is not finite the candidate must match it exactly (same inf, or NaN).
    mismatch_nonfinite = ~finite_truth & ~((o == t) | (torch.isnan(o) & torch.isnan(t)))
    nonfinite = int(bad.sum()) + int(mismatch_nonfinite.sum())

    tf, of, rf = t[finite_truth], o[finite_truth], r[finite_truth]
    err = torch.where(torch.isfinite(of), (of - tf).abs(), torch.inf)  # a NaN output is an infinite error
    scale = float(tf.abs().max()) if tf.numel() else 0.0
    max_abs = float(err.max()) if err.numel() else 0.0
    ref_err_t = (rf - tf).abs()
    ref_err = float(ref_err_t[torch.isfinite(ref_err_t)].max()) if torch.isfinite(ref_err_t).any() else 0.0
    bound = tol.bound(ref_err, scale)
    figures = {
        "max_abs": max_abs,
        "max_rel": float((err / (tf.abs() + tol.atol)).max()) if err.numel() else 0.0,
        "err_ratio": float(err.pow(2).mean().sqrt() / (tf.pow(2).mean().sqrt() + 1e-8)) if err.numel() else 0.0,
        "ref_err": ref_err,
        "bound": bound,
        "nonfinite": nonfinite,
    }
    if nonfinite:
        return {"passed": False, "reason": f"{nonfinite} NaN/Inf where the reference is finite", **figures}
    if not max_abs <= bound:
        return {"passed": False, "reason": f"max abs err {max_abs:.3g} > bound {bound:.3g} "
                f"(reference's own {expect_dtype_name(expect_dtype)} err {ref_err:.3g})", **figures}
    return {"passed": True, **figures}


def expect_dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
