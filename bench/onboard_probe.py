"""Onboarding by probe over families transformers ships: each family's card from its config class's defaults (the
bare model_type, as a new user would start), its claims and its module rows, and the seconds it took on this
machine (imports included for the first family).

    python bench/onboard_probe.py                      # the unregistered families, then the registered ones
    python bench/onboard_probe.py glm4_moe gpt_oss     # these

claims: the card's blocks with a spec; proven: those a probe row proves; differs: those marked another variant (or
computed by no module); gaps: blocks without a spec. Module rows: covered (probed: proven by a measurement of their
own; the rest are activations and convolutions inside a covered parent), differs, no spec, framework; without a
row: module classes of the full model (built on the meta device, counted independently here) the card has no row
for (must be 0). For a registered family, "swaps proven" counts the module classes its hand-written patch replaces
that the probe proves (nothing it had right lost).
"""

from __future__ import annotations

import sys
import time

UNREGISTERED = ("glm4_moe", "ernie4_5_moe", "minimax_m2", "gpt_oss", "mixtral", "qwen3_moe", "deepseek_v4",
                "longcat_flash", "olmoe", "exaone_moe", "solar_open", "bailing_hybrid", "hy_v4")
REGISTERED = ("deepseek_v3", "deepseek_v32", "glm5_next", "glm_moe_dsa", "inkling2", "kimi_linear", "qwen3_next")


def classes_of(model_type: str) -> set[str]:
    """The module classes of the family's full model (meta device), counted without the probe."""
    from transformers import CONFIG_MAPPING

    from workbench.integrations import tiny

    return {type(m).__name__ for m in tiny.build(CONFIG_MAPPING[model_type](), whole=True).modules()}


def family_swaps(model_type: str) -> set[str]:
    """The module classes a registered family's own patch replaces (every block taken as promoted)."""
    import torch
    from transformers import CONFIG_MAPPING

    from workbench.integrations import tiny
    from workbench.integrations.transformers import Patcher, PatchReport, family

    config = tiny.language_config(CONFIG_MAPPING[model_type]())
    small, _ = tiny.tiny_config(config)
    with torch.device("meta"):
        model = tiny.model_class(small)(small)
    report = PatchReport(model_type, type(model).__name__)
    family(model_type).apply(Patcher(model, None, report, assume_promoted=True))
    return {r.cls for r in report.replaced}


def row(model_type: str, registered: bool) -> str:
    from workbench.onboard import onboard

    started = time.monotonic()
    card = onboard(model_type)
    seconds = time.monotonic() - started
    blocks = card["blocks"].values()
    claims = [b for b in blocks if "gap" not in b]
    proven = sum(str(b.get("evidence", "")).startswith("probe:") and "differs" not in b for b in claims)
    differs = sum("differs" in b for b in claims)
    modules = card["transformers"]["modules"]
    counts = card["probe"]["counts"]
    missing = classes_of(model_type) - {m["cls"] for m in modules}
    swaps = ""
    if registered:
        covered = {m["cls"] for m in modules if m["status"] == "covered"}
        swapped = family_swaps(model_type)
        swaps = f" | {len(swapped & covered)} of {len(swapped)}"
    return (f"| {model_type} | {card['transformers']['class']} | {len(claims)} | {proven} | {differs} | "
            f"{len(card['blocks']) - len(claims)} | {counts['covered']} ({counts['probed']}) | {counts['differs']} | "
            f"{counts['no spec']} | {counts['framework']} | {len(missing)} | {seconds:.1f}{swaps} |")


def main() -> None:
    chosen = sys.argv[1:]
    groups = [("unregistered", [m for m in UNREGISTERED if not chosen or m in chosen]),
              ("registered", [m for m in REGISTERED if not chosen or m in chosen])]
    for label, families in groups:
        if not families:
            continue
        extra = " swaps proven |" if label == "registered" else ""
        print(f"\n{label} families\n")
        print("| model_type | class | claims | proven | differs | gaps | covered (probed) | differs | no spec | "
              f"framework | without a row | seconds |{extra}")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if extra else ""))
        for model_type in families:
            print(row(model_type, label == "registered"), flush=True)


if __name__ == "__main__":
    main()
