"""workbench: port a model's architecture blocks to Triton kernels, prove each port right, track it."""

__version__ = "0.1.0"
