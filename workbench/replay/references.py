"""Reference runs of the replays and their cache. A reference is keyed by everything that determines it (preset,
the architecture read from the model card, mode, steps, seed, the source of the replay model and of the blocks'
references, the torch version and, for LoRA, the base checkpoint's bytes). It is taken from the store, else from the
repository file ``replays/<model>/<preset>/<mode>-s<steps>-seed<seed>.json``, else run now: twice, and the two runs
must be bit-identical. The LoRA base checkpoint is trained once per preset (``ensure_base``)."""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import asdict, fields
from functools import cache
from pathlib import Path

import torch

from workbench.backends import Backend
from workbench.blocks import get_block
from workbench.config import Settings
from workbench.kimi_k3 import config as k3_config_module
from workbench.kimi_k3 import modeling as k3_modeling_module
from workbench.kimi_k3 import serving as k3_serving_module
from workbench.replay import arch as arch_module
from workbench.replay import data as data_module
from workbench.replay import distributed as distributed_module
from workbench.replay import launcher as launcher_module
from workbench.replay import model as model_module
from workbench.replay import mtp as mtp_module
from workbench.replay import train as train_module
from workbench.replay.arch import CALLABLE, Architecture
from workbench.replay.distributed import Layout
from workbench.replay.ops import reference_ops
from workbench.replay.presets import Preset
from workbench.replay.supervise import Event, ReplayError, launch, launch_process, training_job
from workbench.replay.train import RunResult
from workbench.store import get_engine, records

BASE_SEED = 0

def replay_folder(settings: Settings, model: str, preset: Preset) -> Path:
    return settings.replays_dir / model / preset.name


def reference_file(settings: Settings, model: str, preset: Preset, mode: str, steps: int, seed: int) -> Path:
    return replay_folder(settings, model, preset) / f"{mode}-s{steps}-seed{seed}.json"


def base_path(settings: Settings, model: str, preset: Preset) -> Path:
    return replay_folder(settings, model, preset) / f"base-seed{BASE_SEED}.pt"


LAYOUT_MODULES = (distributed_module, launcher_module)
"""What a layout's reference run computes with besides the replay model's own code (layout_key)."""


@cache
def _code_digest() -> str:
    """The replay code, the K3 model it trains and the references of every block a replay model may call, as
    sources: computed once per process."""
    h = hashlib.sha256()
    for module in (arch_module, data_module, model_module, train_module, k3_config_module, k3_modeling_module,
                   k3_serving_module):
        h.update(inspect.getsource(module).encode())
    for block in CALLABLE:
        h.update(get_block(block).reference_source().encode())
    h.update(torch.__version__.encode())
    return h.hexdigest()


def reference_key(preset: Preset, arch: Architecture, mode: str, steps: int, seed: int, base: Path | None) -> str:
    h = hashlib.sha256(json.dumps([preset.to_dict(), arch.to_dict(), mode, steps, seed], sort_keys=True).encode())
    h.update(_code_digest().encode())
    if base is not None:
        h.update(base.read_bytes())
    return h.hexdigest()[:32]


def ensure_base(settings: Settings, model: str, preset: Preset, arch: Architecture, backend: Backend,
                timeout_s: float, on_event: Event | None = None) -> Path:
    """The LoRA base checkpoint: trained once with reference blocks (preset.base_steps scratch steps) and kept beside
    the reference curves, so a replay needs no download."""
    path = base_path(settings, model, preset)
    meta = path.with_suffix(".json")
    key = reference_key(preset, arch, "base", preset.base_steps, BASE_SEED, None)
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()).get("key") == key:
        return path
    if on_event:
        on_event("base", {"path": str(path), "steps": preset.base_steps})
    job = training_job("base", preset, arch, "scratch", preset.base_steps, BASE_SEED, reference_ops(arch.blocks),
                       backend, path)
    result = launch(job, backend, timeout_s)
    meta.write_text(json.dumps({"key": key, "steps": preset.base_steps, "final_loss": result.curve[-1],
                                "curve": result.curve}, indent=1) + "\n")
    return path


def reference_run(settings: Settings, model: str, preset: Preset, arch: Architecture, mode: str, steps: int,
                  seed: int, backend: Backend, timeout_s: float, *, rerun: bool = False,
                  on_event: Event | None = None, mtp: bool = False) -> tuple[RunResult, str, dict]:
    """(result, where it came from: store | file | run, facts: key, with MTP the reference MTP curve, and, for a
    run, the repeat check). With ``mtp`` the reference trains the MTP model (workbench.replay.mtp): a key and a
    repository file (``<mode>-mtp-s<steps>-seed<seed>.json``) of its own."""
    base = ensure_base(settings, model, preset, arch, backend, timeout_s, on_event) if mode == "lora" else None
    key = reference_key(preset, arch, mode, steps, seed, base)
    if mtp:
        key = hashlib.sha256("".join([key, *mtp_module.source_digest_parts()]).encode()).hexdigest()[:32]
    label = f"{mode}-mtp" if mtp else mode
    engine = get_engine(settings.db_url)
    if not rerun:
        stored = records.find_reference_replay(engine, model, key)
        if stored is not None:
            return _run_result(stored), "store", _reference_facts(key, stored)
        path = reference_file(settings, model, preset, label, steps, seed)
        if path.is_file():
            shipped = json.loads(path.read_text())
            if shipped.get("key") == key:
                records.save_reference_replay(engine, model=model, mode=mode, preset=preset.name, seed=seed,
                                              backend=backend.name, key=key, result=shipped["result"])
                return _run_result(shipped["result"]), "file", _reference_facts(key, shipped["result"])
    if on_event:
        on_event("reference", {"steps": steps})
    job = training_job("train", preset, arch, mode, steps, seed, reference_ops(arch.blocks), backend, base, mtp=mtp)
    first, second = (_reference_payload(launch_process(job, backend, timeout_s)) for _ in range(2))
    identical = _same(_run_result(first), _run_result(second)) and first.get("mtp_curve") == second.get("mtp_curve")
    if not identical:
        raise ReplayError("the reference run is not reproducible: two runs from the same seed differ "
                          f"(first difference at step {_first_difference(_run_result(first), _run_result(second))})")
    records.save_reference_replay(engine, model=model, mode=mode, preset=preset.name, seed=seed,
                                  backend=backend.name, key=key, result=first)
    return _run_result(first), "run", {**_reference_facts(key, first), "repeat_identical": identical}


def _reference_payload(done: dict) -> dict:
    """A training process's result as a reference keeps it: the RunResult's fields, and the MTP curve if any."""
    return {**done["result"], **({"mtp_curve": done["mtp_curve"]} if "mtp_curve" in done else {})}


def _reference_facts(key: str, result: dict) -> dict:
    return {"key": key, **({"reference_mtp_curve": result["mtp_curve"]} if "mtp_curve" in result else {})}


def layout_reference_run(settings: Settings, model: str, preset: Preset, arch: Architecture, mode: str, steps: int,
                         seed: int, backend: Backend, layout: Layout, timeout_s: float, collective_timeout_s: float,
                         base: Path | None, reference_key_: str, *, rerun: bool = False,
                         on_event: Event | None = None) -> tuple[RunResult, list[list[float]], str]:
    """The reference blocks trained under ``layout`` (once, then kept in the store under a key of its own): what
    each rank's local loss should be, so a replay that leaves its band names the rank. Returns (result, rank
    curves, where it came from: store | run)."""
    key = layout_key(reference_key_, layout)
    engine = get_engine(settings.db_url)
    stored = None if rerun else records.find_reference_replay(engine, model, key)
    if stored is not None:
        return _run_result(stored), stored["rank_curves"], "store"
    if on_event:
        on_event("layout_reference", {"steps": steps, "ranks": layout.ranks})
    job = training_job("train", preset, arch, mode, steps, seed, reference_ops(arch.blocks), backend, base,
                       Layout(layout.ranks, layout.sharding, layout.experts), None, collective_timeout_s)
    done = launch_process(job, backend, timeout_s)
    records.save_reference_replay(engine, model=model, mode=mode, preset=preset.name, seed=seed,
                                  backend=backend.name, key=key,
                                  result={**done["result"], "rank_curves": done["rank_curves"]})
    return RunResult(**done["result"]), done["rank_curves"], "run"


def layout_key(reference_key_: str, layout: Layout) -> str:
    """The key of a layout's reference run: the single-process reference's key, the layout (ranks, sharding,
    experts' placement) and the sources of the modules a layout run computes with besides the replay model's
    (``LAYOUT_MODULES``: its training loop and expert-parallel MoE, the launcher), so an edit there re-runs the
    layout's reference instead of holding replays to a stale one."""
    h = hashlib.sha256(json.dumps([reference_key_, layout.ranks, layout.sharding, layout.experts]).encode())
    for module in LAYOUT_MODULES:
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:32]


def _run_result(stored: dict) -> RunResult:
    return RunResult(**{f.name: stored[f.name] for f in fields(RunResult) if f.name in stored})


def _same(a: RunResult, b: RunResult) -> bool:
    return (a.curve, a.fingerprints, a.topk_values, a.topk_ids) == (b.curve, b.fingerprints, b.topk_values, b.topk_ids)


def _first_difference(a: RunResult, b: RunResult) -> int:
    for i, (x, y) in enumerate(zip(a.curve, b.curve, strict=False)):
        if x != y:
            return i
    return min(len(a.curve), len(b.curve))


def export_reference(settings: Settings, model: str, preset: Preset, mode: str, steps: int, seed: int, key: str,
                     result: RunResult, mtp_curve: list[float] | None = None) -> Path:
    """Write the reference run to the repository file CI compares against (with MTP: its own file, the MTP curve in
    its result)."""
    path = reference_file(settings, model, preset, f"{mode}-mtp" if mtp_curve is not None else mode, steps, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {"mtp_curve": mtp_curve} if mtp_curve is not None else {}
    payload = {"key": key, "model": model, "preset": preset.name, "mode": mode, "steps": steps, "seed": seed,
               "torch": torch.__version__, "result": {**asdict(result), **extra}}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path
