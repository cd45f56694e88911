"""Promoted operators: operators/<block>/<file>.py with a manifest <file>.json beside it (template, parameters,
source hash, the run that promoted it and its verification summary)."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from workbench import syntax
from workbench.errors import WorkbenchError


def promote_file(source_path: str | Path, operators_dir: Path, block: str, manifest: dict[str, Any]) -> Path:
    folder = operators_dir / block
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / Path(source_path).name
    shutil.copyfile(source_path, dest)
    dest.with_suffix(".json").write_text(json.dumps(manifest, indent=2) + "\n")
    return dest


def launch_settings(source: str) -> dict[str, Any]:
    """How an operator's launches are set per call, read from its source (never run): its template's
    LAUNCH_SETTINGS table per target, what the port's tuning chose per target over it (TUNED_SETTINGS, where it
    chose anything) and the docstring of each ``*_launch`` rule over the shape. {} when everything is fixed."""
    found: dict[str, Any] = {}
    tables = {"LAUNCH_SETTINGS": "per_target", "TUNED_SETTINGS": "tuned"}
    for node in syntax.parse(source).body:
        name = getattr(node.targets[0], "id", None) if isinstance(node, ast.Assign) else None
        if name in tables:
            table = ast.literal_eval(node.value)
            if table or name == "LAUNCH_SETTINGS":
                found[tables[name]] = table
        elif isinstance(node, ast.FunctionDef) and node.name.endswith("_launch"):
            found.setdefault("per_shape", {})[node.name] = " ".join((ast.get_docstring(node) or "").split())
    return found


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


FORWARD_ONLY_SUFFIX = ":forward-only"
"""The key of a block's operator promoted by a forward-only port (a decode kernel), kept apart from its training one."""


def is_forward_only(manifest: dict[str, Any]) -> bool:
    return bool(manifest.get("verification", {}).get("forward_only"))


def newest_promoted(operators_dir: Path) -> dict[str, dict[str, Any]]:
    """The newest promoted operator of each block, and of each block's forward-only ports apart, by key (the block's
    name, or the name and FORWARD_ONLY_SUFFIX), in key order."""
    newest: dict[str, dict[str, Any]] = {}
    for manifest in list_promoted(operators_dir):
        newest.setdefault(manifest["block"] + (FORWARD_ONLY_SUFFIX if is_forward_only(manifest) else ""), manifest)
    return dict(sorted(newest.items()))


EVIDENCE_LEVELS = ("interpreter only", "compiles on every target", "spill-free on every target", "verified on a GPU")
"""What a promoted operator has shown, weakest first: verified on the interpreter only (or compiled for some
targets); its kernels compiled for every required target; and without spills at the model and smoke suites;
verified on a GPU backend in bfloat16 at the model suite."""


def operator_evidence(manifest: dict[str, Any]) -> dict[str, Any]:
    """Where a promoted operator has been shown to work, from its manifest: the verification backend, dtypes and
    suites; the targets it compiles on and is spill-free on (at the model and smoke suites); whether a GPU verified
    it; the strongest level of EVIDENCE_LEVELS it reaches."""
    verification = manifest.get("verification", {})
    found = manifest.get("target_report", {})
    targets = found.get("targets", [])
    gpu = verification.get("backend") == "cuda" and "bfloat16" in verification.get("dtypes", []) \
        and "model" in verification.get("suites", [])
    level = EVIDENCE_LEVELS[0]
    if targets and set(targets) <= set(found.get("compiles_on", [])):
        level = EVIDENCE_LEVELS[2] if set(targets) <= set(found.get("spill_free_on", [])) else EVIDENCE_LEVELS[1]
    if gpu:
        level = EVIDENCE_LEVELS[3]
    return {"backend": verification.get("backend", ""), "dtypes": verification.get("dtypes", []),
            "suites": verification.get("suites", []), "targets": targets,
            "compiles_on": found.get("compiles_on", []), "spill_free_on": found.get("spill_free_on", []),
            "gpu_verified": gpu, "findings": found.get("findings", []), "strongest": level,
            "backward": "not verified" if verification.get("forward_only") else "verified",
            "replayed": manifest.get("replay") or {}}


def evidence_line(manifest: dict[str, Any]) -> str:
    """One line of evidence: "interpreter float32/float16 smoke+edge; compiles 5/5 (...); spill-free 2/5 (...);
    GPU bf16 model: not yet"."""
    e = operator_evidence(manifest)
    n = len(e["targets"])
    compiled = f"compiles {len(e['compiles_on'])}/{n}" + (f" ({', '.join(e['compiles_on'])})" if e["compiles_on"]
                                                          else "") if n else "not compiled for any target"
    spill_free = f"; spill-free {len(e['spill_free_on'])}/{n}" if n else ""
    forward = " (forward only)" if e["backward"] == "not verified" else ""
    replay = e["replayed"]
    replayed = f"replayed ({replay['steps']} {replay['mode']} steps, replay #{replay['replay_id']})" \
        if replay.get("replay_id") else "replay: not yet"
    return (f"{e['backend']} {'/'.join(e['dtypes'])} {'+'.join(e['suites'])}{forward}; {compiled}{spill_free}; "
            f"GPU bf16 model: {'verified' if e['gpu_verified'] else 'not yet'}; {replayed}")


def import_operator(path: str | Path, module_name: str, block: str | None = None) -> ModuleType:
    """An operator file imported as the module ``module_name`` (registered in sys.modules, as a dataclass or a
    Triton kernel in it needs); with ``block``, it must define BLOCK = ``block`` and a callable run. The file is
    trusted: a promoted operator or the user's own (candidates run in the verifier's sandbox, never through here)."""
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise WorkbenchError(f"cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    if block is not None and (getattr(module, "BLOCK", None) != block or not callable(getattr(module, "run", None))):
        raise WorkbenchError(f"{path} does not define BLOCK = '{block}' and run(...)")
    return module
