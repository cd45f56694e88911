"""The promoted operators as a library a training framework imports: one opaque ``torch.library`` custom op per block
(namespace ``workbench``), with its autograd and a fake implementation, so it runs under
``torch.compile(fullgraph=True)`` without graph breaks, and nn.Module layers over them.

    import workbench.kernels as wk                      # registers every op; imports no operator yet

    y = wk.rmsnorm(x, weight, 1e-6)                     # or torch.ops.workbench.rmsnorm(x, weight, 1e-6)
    norm = wk.RMSNorm(hidden_size, eps=1e-6)            # layers: RMSNorm, SiTUMLP, SwiGLUMLP, LinearCrossEntropyLoss
    loss = wk.LinearCrossEntropyLoss()(hidden, lm_head.weight, targets)
    model = torch.compile(model, fullgraph=True)

Each op takes exactly the arguments of the block's reference (workbench/blocks/<block>.py) in its order, tensors and
non-tensors (eps, scale, topk, reduction, ...) alike, and returns its outputs. Gradients come from the operator's own
backward kernels: in eager mode on the autograd graph the forward kept (forward plus backward launch what the operator
alone launches); under torch.compile through ``torch.ops.workbench.<block>_backward``, an opaque backward op that runs
the operator's forward again first (workbench/kernels/_ops.py says why). ``workbench.kernels.<block>`` is the block's
op (a BlockOp), one per block of the catalog (workbench.blocks.REGISTRY: adding a block adds its op); ``OPS`` holds
them all by block name.

Operators come from the operators folder: ``$WORKBENCH_OPERATORS``, else ``./operators`` (workbench.config), or the
folder given to ``set_operators_dir(folder)``; each op takes the newest operator promoted for its block, imported at
its first call; ``wk.rmsnorm.forward_only`` is the block's forward-only (decode) operator where one was promoted.
The operators are Triton kernels: on a GPU they compile; on CPU they run only through the Triton interpreter, which
needs ``TRITON_INTERPRET=1`` in the environment before anything imports triton (torch.compile and AdamW import it).
There, an op whose kernels would run ``tl.dot`` on bfloat16 operands (which the interpreter multiplies wrong, triton
issue #11584) refuses with ``workbench.kernels._ops.InterpreterBFloat16Error``, one line: float32 or float16 on CPU.
"""

from workbench.kernels._ops import OPS, BlockOp, operators_dir, set_operators_dir
from workbench.kernels.layers import LinearCrossEntropyLoss, RMSNorm, SiTUMLP, SwiGLUMLP

globals().update(OPS)  # workbench.kernels.<block>: the block's op

__all__ = ["OPS", "BlockOp", "LinearCrossEntropyLoss", "RMSNorm", "SiTUMLP", "SwiGLUMLP", "operators_dir",
           "set_operators_dir", *OPS]
