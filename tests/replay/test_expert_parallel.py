"""The expert-parallel MoE layer (workbench.replay.distributed.ExpertParallelMoE) on 2 gloo ranks against the same
layer with every expert local on all the tokens: outputs and every gradient, with the dispatch in one chunk and in
several (chunk c+1's All-to-All in flight while chunk c's experts compute)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workbench.replay.arch import architecture
from workbench.replay.distributed import ExpertParallelMoE
from workbench.replay.launcher import free_port
from workbench.replay.model import moe_layers, replay_model
from workbench.replay.ops import load_ops, reference_ops
from workbench.replay.presets import get_preset
from workbench.replay.train import use_ops

WORLD = 2
TOKENS = 24  # per rank
CHUNKS = (1, 2, 3)


def _relative(found: torch.Tensor, truth: torch.Tensor) -> float:
    return float((found.detach() - truth).abs().max() / truth.abs().max())


def _errors(rank: int, port: int, results) -> None:
    """On one rank: {chunks: {quantity: max abs difference from the all-local layer over its max abs}}."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    preset = get_preset("tiny")
    arch = architecture("kimi-k3.1-pro", preset.layers)  # latent MoE with SiTU experts
    torch.manual_seed(0)
    model = replay_model(preset, arch)
    use_ops(model, load_ops(reference_ops(arch.blocks)))
    layer = moe_layers(model)[0]
    x_all = torch.randn(WORLD * TOKENS, preset.hidden)
    dy_all = torch.randn(WORLD * TOKENS, preset.hidden)
    truth = copy.deepcopy(layer)
    x_truth = x_all.clone().requires_grad_()
    y_truth = truth(x_truth)
    (y_truth * dy_all).sum().backward()
    rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
    local = layer.experts.num_experts // WORLD
    experts = slice(rank * local, (rank + 1) * local)
    found = {}
    for chunks in CHUNKS:
        ep = copy.deepcopy(layer)
        ExpertParallelMoE.adopt(ep, dist.group.WORLD, chunks)
        x = x_all[rows].clone().requires_grad_()
        y = ep(x)
        (y * dy_all[rows]).sum().backward()
        router_grad, counts = ep.gate.weight.grad.clone(), ep.gate.last_counts.clone()
        dist.all_reduce(router_grad)  # each rank's tokens contribute their share
        dist.all_reduce(counts)
        found[chunks] = {
            "y": _relative(y, y_truth[rows].detach()),
            "dx": _relative(x.grad, x_truth.grad[rows]),
            "dw1": _relative(ep.experts.w1.grad, truth.experts.w1.grad[experts]),
            "dw3": _relative(ep.experts.w3.grad, truth.experts.w3.grad[experts]),
            "dw2": _relative(ep.experts.w2.grad, truth.experts.w2.grad[experts]),
            "d_router": _relative(router_grad, truth.gate.weight.grad),
            "counts": float((counts - truth.gate.last_counts).abs().max()),
        }
    results[rank] = found
    dist.destroy_process_group()


def _worker(rank: int, port: int, results) -> None:
    _errors(rank, port, results)


@pytest.mark.slow  # two processes
def test_the_expert_parallel_layer_matches_every_expert_local_in_one_or_more_chunks():
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_worker, args=(free_port(), results), nprocs=WORLD, start_method="spawn")
        found = dict(results)
    assert set(found) == set(range(WORLD))
    for rank, per_chunks in found.items():
        # one chunk: the experts see the same rows in the same order as the all-local layer, so bit for bit; only
        # the router's gradient is summed over the ranks (another order)
        assert {q: per_chunks[1][q] for q in ("y", "dx", "dw1", "dw3", "dw2", "counts")} == dict.fromkeys(
            ("y", "dx", "dw1", "dw3", "dw2", "counts"), 0.0), rank
        for chunks, errors in per_chunks.items():
            assert errors["counts"] == 0, (rank, chunks)
            for quantity, error in errors.items():
                assert error <= 1e-6, (rank, chunks, quantity, error)
