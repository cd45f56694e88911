"""Promoted operators: operators/<block>/<file>.py with a manifest <file>.json beside it (template, parameters,
source hash, the run that promoted it and its verification summary)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


def promote_file(source_path: str | Path, operators_dir: Path, block: str, manifest: dict[str, Any]) -> Path:
    folder = operators_dir / block
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / Path(source_path).name
    shutil.copyfile(source_path, dest)
    dest.with_suffix(".json").write_text(json.dumps(manifest, indent=2) + "\n")
    return dest


def list_promoted(operators_dir: Path, block: str | None = None) -> list[dict[str, Any]]:
    """Manifests (with "path") of the promoted operators, newest first; unreadable manifests are skipped."""
    pattern = f"{block}/*.json" if block else "*/*.json"
    found = []
    for manifest in operators_dir.glob(pattern):
        source = manifest.with_suffix(".py")
        try:
            data = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and source.is_file():
            found.append({**data, "path": str(source)})
    return sorted(found, key=lambda m: m.get("promoted_at", ""), reverse=True)
