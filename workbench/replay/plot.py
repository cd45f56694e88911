"""The replay plot (PNG): the reference curve with its band, the operator curve, and where it left the band."""

from __future__ import annotations

from pathlib import Path

from workbench.replay.presets import Preset


def draw(curve: list[float], reference: list[float], preset: Preset, left_band_step: int | None, path: Path,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = range(len(reference))
    width = [preset.band_atol + preset.band_rtol * abs(r) for r in reference]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True, height_ratios=[3, 1])
    top.fill_between(steps, [r - w for r, w in zip(reference, width, strict=True)],
                     [r + w for r, w in zip(reference, width, strict=True)], color="#b0bec5", alpha=0.5,
                     label=f"band ({preset.band_rtol:g} rel + {preset.band_atol:g})")
    top.plot(steps, reference, color="#37474f", linewidth=1.5, label="reference")
    top.plot(range(len(curve)), curve, color="#ef6c00", linewidth=1.2, linestyle="--", label="operators")
    top.set_ylabel("training loss")
    top.set_title(title, fontsize=10)
    deviation = [(c - r) / w for c, r, w in zip(curve, reference, width, strict=False)]
    bottom.axhspan(-1, 1, color="#b0bec5", alpha=0.5)
    bottom.plot(range(len(deviation)), deviation, color="#ef6c00", linewidth=1.2)
    bottom.set_ylabel("(ops - ref) / band")
    bottom.set_xlabel("step")
    if left_band_step is not None:
        for axis in (top, bottom):
            axis.axvline(left_band_step, color="#c62828", linewidth=1)
        top.annotate(f"left the band at step {left_band_step}", (left_band_step, curve[left_band_step]),
                     textcoords="offset points", xytext=(8, 8), color="#c62828", fontsize=9)
    top.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
