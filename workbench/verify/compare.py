"""Numerics of one output or gradient against the float64 truth and the same-precision reference."""

from __future__ import annotations

import torch

from workbench.blocks.base import Tolerance


def compare(out: torch.Tensor | None, truth: torch.Tensor, ref_lowp: torch.Tensor, tol: Tolerance,
            expect_dtype: torch.dtype) -> dict:
    """Figures and verdict for one quantity.

    out: the candidate's tensor (None when no gradient reached the input); truth: float64; ref_lowp: the reference
    computed in the candidate's precision. Returns the keyword fields of a Check (passed, reason, max_abs, max_rel,
    err_ratio, ref_err, bound, nonfinite).
    """
    if out is None:
        return {"passed": False, "reason": "no gradient reached this input"}
    if not isinstance(out, torch.Tensor):
        return {"passed": False, "reason": f"returned {type(out).__name__}, expected a tensor"}
    if tuple(out.shape) != tuple(truth.shape):
        return {"passed": False, "reason": f"shape {tuple(out.shape)}, expected {tuple(truth.shape)}"}
    if out.dtype != expect_dtype:
        return {"passed": False, "reason": f"dtype {out.dtype}, expected {expect_dtype}"}
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
