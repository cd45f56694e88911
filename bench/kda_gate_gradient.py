"""The conditioning of kda's gate gradient, and how close the promoted operator's float32 comes to the float64 truth
at the decay rates the families use: fla's test gates (logsigmoid(N(0, 1)) / 16, Kimi Linear's range) and
Qwen3-Next's (g = -exp(A_log) * softplus(a + dt_bias), one decay per head, A up to 16: g down to about -35 per token).

Per decay range it prints the worst head's relative error of the A_log gradient (sum over tokens of dg * g, dg the
gradient of the per-token log decays) and of sum |dg|, for the operator in float32 on the Triton interpreter and
for the block's torch reference in float32 (autograd through the recurrence, what a torch path computes), both
against the reference in float64; and the conditioning: the size of the terms kda's backward sums into it
(sum over tokens of (|q . dq| + |k . dk|) |g|) over |dA_log|, for the worst head.

    python bench/kda_gate_gradient.py [--tokens 64] [--operator operators/kda/<file>.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from workbench.blocks.kda import reference  # noqa: E402
from workbench.operators import newest_promoted  # noqa: E402

B, H, HV, K, V = 1, 2, 4, 64, 64


def gates(kind: str, t: int, gen: torch.Generator) -> torch.Tensor:
    """[B, T, HV, K] log decays per token: fla's test gates, or Qwen3-Next's per-head decay broadcast over K."""
    if kind == "fla":  # q/k U(0, 1) then L2-normalised, as fla's tests draw them; "signed": N(0, 1)
        return F.logsigmoid(torch.randn(B, t, HV, K, generator=gen)) / 16
    a_log = torch.log(torch.tensor([1.0, 4.0, 9.0, 16.0]))  # A per value head, up to Qwen3-Next's 16
    a = torch.randn(B, t, HV, generator=gen) * 2
    per_head = -a_log.exp() * F.softplus(a)
    return per_head[..., None].expand(B, t, HV, K).contiguous()


def grads(run, inputs: dict, dtype: torch.dtype, d_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """dq, dk (per value head's q/k head) and dg of ``run`` in ``dtype`` (float64 copies)."""
    leaves = {k: (v.detach().to(dtype).clone().requires_grad_(k in "qkg") if torch.is_tensor(v) else v)
              for k, v in inputs.items()}
    out, _ = run(**leaves)
    out.backward(d_out.to(dtype))
    return {k: leaves[k].grad.double() for k in "qkg"}


def per_head(x: torch.Tensor) -> torch.Tensor:
    """[B, T, HV, K] summed to [HV]."""
    return x.sum(dim=(0, 1, 3))


def worst(x: torch.Tensor, truth: torch.Tensor) -> float:
    """The largest relative error of any head."""
    return ((x - truth).abs() / truth.abs().clamp_min(1e-300)).max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--operator", type=Path, default=None)
    args = parser.parse_args()
    path = args.operator or Path(newest_promoted(Path(__file__).resolve().parents[1] / "operators")["kda"]["path"])
    spec = importlib.util.spec_from_file_location("kda_operator", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(f"operator {path.name}, B={B} T={args.tokens} H={H} HV={HV} K={K} V={V}\n")
    print("| gates | conditioning of dA_log | sum |dg| rel err: operator / torch f32 | "
          "dA_log rel err: operator / torch f32 |")
    print("|---|---|---|---|")
    for kind, draw in (("fla", torch.rand), ("qwen3_next", torch.rand), ("qwen3_next, signed q/k", torch.randn)):
        gen = torch.Generator().manual_seed(0)
        q = F.normalize(draw(B, args.tokens, H, K, generator=gen), dim=-1)
        k = F.normalize(draw(B, args.tokens, H, K, generator=gen), dim=-1)
        v = torch.rand(B, args.tokens, HV, V, generator=gen)
        g = gates(kind.split(",")[0], args.tokens, gen)
        beta = torch.sigmoid(torch.randn(B, args.tokens, HV, generator=gen))
        inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "scale": K ** -0.5, "initial_state": None}
        d_out = torch.randn(B, args.tokens, HV, V, generator=gen)
        truth = grads(reference, inputs, torch.float64, d_out)
        ours = grads(module.run, inputs, torch.float32, d_out)
        torch32 = grads(reference, inputs, torch.float32, d_out)
        gd = g.double()
        # the terms summed into each head's dA_log = sum dg * g: the products q . dq and k . dk of every token
        # (kda's backward forms dg from them; a token's pair with itself enters both and cancels)
        expand = HV // H
        qdq = (q.double().repeat_interleave(expand, 2) * truth["q"].repeat_interleave(expand, 2) / expand).abs()
        kdk = (k.double().repeat_interleave(expand, 2) * truth["k"].repeat_interleave(expand, 2) / expand).abs()
        a_truth = per_head(truth["g"] * gd)
        conditioning = (per_head((qdq + kdk) * gd.abs()) / a_truth.abs()).max().item()
        print(f"| {kind} | {conditioning:.3g} | {worst(per_head(ours['g'].abs()), per_head(truth['g'].abs())):.2e} "
              f"/ {worst(per_head(torch32['g'].abs()), per_head(truth['g'].abs())):.2e} | "
              f"{worst(per_head(ours['g'] * gd), a_truth):.2e} / {worst(per_head(torch32['g'] * gd), a_truth):.2e} |")
    print(f"\n`python bench/kda_gate_gradient.py --tokens {args.tokens}` (float32 on the Triton interpreter; "
          "relative errors: max |x - truth| / max |truth|)")


if __name__ == "__main__":
    main()
