"""The catalog's references against the published modules that compute the same math, in float64 (transformers'
float32 casts made float64): the worst relative error of the outputs and of the gradients per block and counterpart.

    python bench/reference_parity.py
"""

from __future__ import annotations

from workbench.integrations.references import compare_all


def main() -> None:
    print("| block | published counterpart | variant | outputs (max rel) | gradients (max rel) | note |")
    print("|---|---|---|---|---|---|")
    for r in compare_all():
        print(f"| {r.block} | {r.counterpart} | {'same' if r.same else 'differs'} | {r.output_rel:.1e} | "
              f"{r.grad_rel:.1e} | {r.note} |")


if __name__ == "__main__":
    main()
