"""Where a candidate runs now (a backend) and where it must run (a target).

A backend names the device tensors live on, the environment the sandbox sets before ``triton`` is imported, the
dtypes and shape suites it can verify (Triton on a CUDA GPU, or the Triton interpreter on CPU), and what one
verification asks of a Ray node (``resources``, Ray's names: "CPU", "GPU", or an accelerator's own such as "NPU" for
Ascend), so that N devices run N verifications and each sees only its own (workbench.executor).

A target is a GPU architecture that every candidate is compiled for ahead of time, from any machine (Triton's
``GPUTarget``: no GPU and no driver needed), with the per-SM limits that turn what the compiler reports (registers,
shared memory, warps) into an occupancy, the instruction names that show a ``tl.dot`` reached the tensor cores, and
the public peaks the cost model's roofline divides by. A target is one entry of ``TARGETS``: the compile worker,
the cost model and the benchmarks read it from there. New accelerators (triton-ascend, MUSA) are new entries here;
blocks, templates and the agent never look at the hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.config import Settings
from workbench.errors import WorkbenchError


@dataclass(frozen=True)
class Backend:
    name: str
    device: str
    dtypes: tuple[str, ...]
    suites: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1})


INTERPRETER = Backend(
    name="interpreter",
    device="cpu",
    # bfloat16 arithmetic is wrong in the interpreter (bit patterns treated as integers): GPU only.
    dtypes=("float32", "float16"),
    # the model card's sizes take hours on the interpreter: GPU only.
    suites=("smoke", "edge"),
    env={"TRITON_INTERPRET": "1"},
)

CUDA = Backend(
    name="cuda",
    device="cuda",
    dtypes=("float32", "float16", "bfloat16"),
    suites=("smoke", "edge", "model"),
    resources={"CPU": 1, "GPU": 1},  # Ray sets CUDA_VISIBLE_DEVICES to the task's GPU; the sandbox passes it on
)

BACKENDS = {b.name: b for b in (INTERPRETER, CUDA)}


@dataclass(frozen=True)
class Peaks:
    """One SKU's public peak figures (one GPU, dense, no sparsity): HBM bytes/s, bf16 tensor FLOP/s, fp32 vector
    FLOP/s, SMs (CUs on AMD), and where each number comes from. ``device``: the SKU the figures are of (a target
    architecture spans several: sm_90a is H100 and H200)."""

    device: str
    hbm_bytes_s: float
    bf16_flops: float
    fp32_flops: float
    sms: int
    source: str


@dataclass(frozen=True)
class Target:
    """A GPU architecture Triton compiles for. backend/arch/warp_size: Triton's ``GPUTarget``. Per SM (per CU on
    AMD): registers (32-bit, the whole register file), shared memory (bytes, LDS on AMD), the most resident CTAs
    and warps (waves). tensor_core_ops: instruction names whose presence in the PTX / AMDGCN means a ``tl.dot``
    reached the tensor cores (matrix cores). Limits from the vendors' public tuning guides and data sheets."""

    name: str
    device: str
    backend: str
    arch: int | str
    warp_size: int
    registers_per_sm: int
    shared_per_sm: int
    max_ctas_per_sm: int
    max_warps_per_sm: int
    tensor_core_ops: tuple[str, ...]
    source: str
    peaks: Peaks

    def occupancy(self, registers: int | None, shared_bytes: int, num_warps: int) -> int:
        """Resident CTAs per SM for a kernel using ``registers`` per thread, ``shared_bytes`` of shared memory and
        ``num_warps`` warps (the CUDA occupancy calculator's rule; on AMD VGPRs per lane in granules of 8, 512 per
        SIMD lane, four SIMDs per CU). 0: the kernel cannot be resident at all."""
        limits = [self.max_ctas_per_sm, self.max_warps_per_sm // num_warps]
        if registers:
            if self.backend == "cuda":  # registers are allocated per warp in units of 256
                per_warp = -(-registers * self.warp_size // 256) * 256
                limits.append(self.registers_per_sm // (per_warp * num_warps))
            else:  # waves per SIMD from the VGPRs one lane needs; a CTA's waves spread over the 4 SIMDs
                per_lane = -(-registers // 8) * 8
                waves_per_simd = min(self.max_warps_per_sm // 4, 512 // per_lane)
                limits.append(4 * waves_per_simd // num_warps)
        if shared_bytes:
            reserved = 1024 if self.backend == "cuda" else 0  # the CUDA runtime keeps 1 KB per CTA
            limits.append(self.shared_per_sm // (shared_bytes + reserved))
        return max(0, min(limits))


_NV_MMA = ("mma.sync", "wgmma.mma_async", "tcgen05.mma")
_AMD_MMA = ("v_mfma", "v_wmma")
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("sm_80", "A100", "cuda", 80, 32, 65536, 167936, 32, 64, _NV_MMA,
           "NVIDIA A100 Tensor Core GPU Architecture whitepaper; CUDA C++ Programming Guide, compute capability 8.0",
           Peaks("A100 SXM 80GB", 2.039e12, 312e12, 19.5e12, 108,
                 "NVIDIA A100 Tensor Core GPU data sheet (2.039 TB/s HBM2e, BF16 312 TFLOPS, FP32 19.5); "
                 "A100 architecture whitepaper (108 SMs)")),
    Target("sm_90a", "H100/H200", "cuda", 90, 32, 65536, 233472, 32, 64, _NV_MMA,
           "NVIDIA H100 Tensor Core GPU Architecture whitepaper; Hopper Tuning Guide (228 KB shared per SM)",
           Peaks("H200 SXM", 4.8e12, 989e12, 67e12, 132,
                 "NVIDIA H200 Tensor Core GPU data sheet (4.8 TB/s HBM3e, BF16 989 TFLOPS dense, TF32 494, "
                 "FP32 67); H100 whitepaper (132 SMs)")),
    Target("sm_100a", "B200", "cuda", 100, 32, 65536, 233472, 32, 64, _NV_MMA,
           "CUDA C++ Programming Guide, compute capability 10.0; Blackwell Tuning Guide",
           Peaks("B200", 8.0e12, 2250e12, 80e12, 148,
                 "NVIDIA DGX B200 / HGX B200 data sheet, per GPU (8 TB/s HBM3e, BF16 2.25 PFLOPS dense, "
                 "FP32 80 TFLOPS); Blackwell architecture brief (148 SMs)")),
    Target("gfx942", "MI300X", "hip", "gfx942", 64, 4 * 512 * 64, 65536, 32, 32, _AMD_MMA,
           "AMD CDNA 3 ISA reference; AMD Instinct MI300X data sheet (64 KB LDS per CU)",
           Peaks("MI300X", 5.3e12, 1307.4e12, 163.4e12, 304,
                 "AMD Instinct MI300X data sheet (5.3 TB/s HBM3, BF16 1307.4 TFLOPS dense, TF32 653.7, "
                 "FP32 vector 163.4, 304 CUs)")),
    Target("gfx950", "MI355X", "hip", "gfx950", 64, 4 * 512 * 64, 163840, 32, 32, _AMD_MMA,
           "AMD CDNA 4 ISA reference; AMD Instinct MI355X data sheet (160 KB LDS per CU)",
           Peaks("MI355X", 8.0e12, 2516.6e12, 157.3e12, 256,
                 "AMD Instinct MI355X data sheet (8 TB/s HBM3E, BF16 2.5 PFLOPS dense, FP32 vector 157.3 "
                 "TFLOPS, 256 CUs)")),
)}
DEFAULT_TARGETS = ("sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950")


def get_targets(names: list[str] | tuple[str, ...] | None = None) -> list[Target]:
    """The targets named (default: DEFAULT_TARGETS); an empty list compiles for none. Unknown names are a
    WorkbenchError listing the known ones."""
    names = DEFAULT_TARGETS if names is None else [n for n in names if n]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise WorkbenchError(f"unknown target '{unknown[0]}' (known: {', '.join(TARGETS)})")
    return [TARGETS[n] for n in dict.fromkeys(names)]


def cuda_target_name(major: int, minor: int) -> str:
    """The target name of a CUDA compute capability: sm_80, and the arch-specific sm_90a / sm_100a from 9.0 on
    (the instructions the workbench's kernels may use there: wgmma, tcgen05)."""
    arch = major * 10 + minor
    return f"sm_{arch}{'a' if arch >= 90 else ''}"


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def get_backend(name: str | None = None) -> Backend:
    """``name`` or $WORKBENCH_BACKEND; "auto" (the default) is cuda when a GPU is visible, else the interpreter."""
    name = name or Settings.load().backend
    if name == "auto":
        return CUDA if cuda_available() else INTERPRETER
    if name not in BACKENDS:
        raise WorkbenchError(f"unknown backend '{name}' (known: auto, {', '.join(BACKENDS)})")
    if name == "cuda" and not cuda_available():
        raise WorkbenchError("backend 'cuda' asked for, but torch sees no CUDA device")
    return BACKENDS[name]
