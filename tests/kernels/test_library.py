"""The kernels library's registration, operator lookup, layers and replay seam, in process (nothing here imports an
operator, so no Triton kernel runs: tests/kernels/test_kernels.py runs them)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import workbench.kernels as wk
from workbench.blocks import REGISTRY, get_block
from workbench.errors import WorkbenchError
from workbench.operators import newest_promoted, promote_file

OPERATORS = Path(__file__).resolve().parents[2] / "operators"


@pytest.fixture(autouse=True)
def settings_folder():
    """Every test leaves the library on the settings' operators folder."""
    yield
    wk.set_operators_dir(None)


def test_every_block_of_the_catalog_has_its_op_and_a_registered_schema():
    """One op per block of the catalog (workbench.kernels.<block>, from the registry: adding a block adds it); its ops
    take the reference's arguments by name, in order, with the non-tensor ones (eps, topk, reduction, ...) in the
    schema."""
    promoted = {key for key in newest_promoted(OPERATORS) if ":" not in key}
    assert promoted and promoted <= set(wk.OPS) and set(wk.OPS) == set(REGISTRY)
    for block, op in wk.OPS.items():
        assert getattr(wk, block) is op and op.block == block
        schema = getattr(torch.ops.workbench, block).default._schema
        names = list(inspect.signature(get_block(block).reference).parameters)
        assert [a.name for a in schema.arguments] == names, block
        spec = get_block(block)
        assert len(schema.returns) == len(spec.outputs) - len(spec.updated_in_place), block  # caches: arguments
        assert {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write} == \
            set(spec.updated_in_place), block
        if spec.grad_inputs:
            backward = getattr(torch.ops.workbench, f"{block}_backward").default._schema
            assert [a.name for a in backward.arguments] == ["grads", "needs", *names], block
        else:  # a block without gradients (a decode step) has no backward op
            assert not hasattr(torch.ops.workbench, f"{block}_backward"), block
    types = {a.name: str(a.type) for a in torch.ops.workbench.moe_router.default._schema.arguments}
    assert types == {"x": "Tensor", "weight": "Tensor", "bias": "Tensor", "topk": "int", "score_func": "str",
                     "norm_lambda": "Optional[float]", "renormalize": "bool", "route_scale": "float",
                     "n_group": "int", "topk_group": "int"}
    defaults = {a.name: a.default_value for a in torch.ops.workbench.moe_router.default._schema.arguments}
    assert (defaults["n_group"], defaults["topk_group"]) == (1, 1)  # the reference's defaults


def test_ops_take_the_newest_operator_of_the_configured_folder(tmp_path, monkeypatch):
    """Default folder: $WORKBENCH_OPERATORS; set_operators_dir overrides it; a folder without the block's operator is
    one clear error at the call."""
    monkeypatch.setenv("WORKBENCH_OPERATORS", str(OPERATORS))
    wk.set_operators_dir(None)
    assert wk.operators_dir() == OPERATORS
    assert wk.rmsnorm.operator_path() == str(Path(newest_promoted(OPERATORS)["rmsnorm"]["path"]).resolve())
    wk.set_operators_dir(tmp_path)
    with pytest.raises(WorkbenchError, match=f"no promoted operator for 'rmsnorm' in {tmp_path}"):
        wk.rmsnorm.operator_path()


def test_a_forward_only_port_backs_its_own_op_and_never_the_training_one(tmp_path):
    """Operators are keyed as newest_promoted keys them: a decode (forward-only) port backs
    workbench::<block>_forward_only, registered at first use without autograd; the training op keeps the training
    operator even when the decode one is newer."""
    for name, stamp, forward_only in (("rmsnorm_train.py", "1", False), ("rmsnorm_decode.py", "2", True)):
        (tmp_path / name).write_text("BLOCK = 'rmsnorm'\n")
        promote_file(tmp_path / name, tmp_path / "operators", "rmsnorm",
                     {"block": "rmsnorm", "promoted_at": stamp, "verification": {"forward_only": forward_only}})
    wk.set_operators_dir(tmp_path / "operators")
    assert wk.rmsnorm.operator_path().endswith("rmsnorm_train.py")
    decode = wk.rmsnorm.forward_only
    assert decode is wk.rmsnorm.forward_only and decode.op is torch.ops.workbench.rmsnorm_forward_only
    assert decode.operator_path().endswith("rmsnorm_decode.py") and decode.backward_op is None


def test_fake_implementations_trace_on_meta_tensors():
    """The fake implementations alone (no operator loaded): meta inputs give the reference's output shapes and
    dtypes, the loss blocks (whose reference is data-dependent) a 0-dim float32 loss."""
    y = wk.rmsnorm(torch.empty(3, 5, 64, device="meta"), torch.empty(64, device="meta"), 1e-6)
    assert (y.shape, y.dtype, y.device.type) == ((3, 5, 64), torch.float32, "meta")
    loss = wk.vocab_blockwise_ce(torch.empty(8, 32, dtype=torch.float16, device="meta"),
                                 torch.empty(64, 32, dtype=torch.float16, device="meta"),
                                 torch.empty(8, dtype=torch.int64, device="meta"), -100, "mean")
    assert (loss.shape, loss.dtype) == ((), torch.float32)


def test_layers_hold_their_parameters_and_check_their_arguments():
    norm = wk.RMSNorm(64, eps=1e-5, dtype=torch.float16)
    assert norm.weight.shape == (64,) and norm.weight.dtype == torch.float16 and bool((norm.weight == 1).all())
    assert "64, eps=1e-05" in repr(norm)
    mlp = wk.SiTUMLP(64, 32)
    assert dict((n, tuple(p.shape)) for n, p in mlp.named_parameters()) == {
        "gate_proj.weight": (32, 64), "up_proj.weight": (32, 64), "down_proj.weight": (64, 32)}
    assert (mlp.beta, mlp.linear_beta) == (4.0, 25.0)
    assert len(list(wk.SwiGLUMLP(64, 32).parameters())) == 3
    assert wk.LinearCrossEntropyLoss(block="seq_chunked_ce").block == "seq_chunked_ce"
    with pytest.raises(ValueError, match="reduction must be one of"):
        wk.LinearCrossEntropyLoss(reduction="none")
    with pytest.raises(ValueError, match="block must be one of"):
        wk.LinearCrossEntropyLoss(block="rmsnorm")


def test_the_library_ops_word_of_the_replay(tmp_path):
    """--ops library: every promoted block through the library (a "library:" target), the others on their
    reference; the record names the files; a target the library would not resolve to is refused."""
    from workbench.replay.arch import architecture
    from workbench.replay.ops import LIBRARY_PREFIX, REFERENCE, describe, load_ops, operator_file, resolve_ops

    blocks = architecture("kimi-k3.1-pro", "KF").blocks
    source = tmp_path / "rmsnorm_candidate.py"
    source.write_text("BLOCK = 'rmsnorm'\n")
    promoted = promote_file(source, tmp_path / "operators", "rmsnorm", {"block": "rmsnorm", "promoted_at": "1"})
    chosen = resolve_ops(["library"], tmp_path / "operators", blocks)
    assert chosen["rmsnorm"] == LIBRARY_PREFIX + str(promoted) and chosen["kda"] == REFERENCE
    assert operator_file(chosen["rmsnorm"]) == str(promoted) and operator_file(REFERENCE) is None
    assert describe(chosen)["rmsnorm"] == "library:rmsnorm_candidate.py"
    assert load_ops({"rmsnorm": chosen["rmsnorm"]})["rmsnorm"] is wk.rmsnorm
    older = tmp_path / "operators" / "rmsnorm" / "older.py"
    older.write_text("BLOCK = 'rmsnorm'\n")
    with pytest.raises(WorkbenchError, match="the kernels library's rmsnorm op runs .*rmsnorm_candidate.py"):
        load_ops({"rmsnorm": LIBRARY_PREFIX + str(older)})
