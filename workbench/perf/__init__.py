"""Speed on the targets: the cost model (modelled, no GPU), the timing protocol (measured, on a GPU) and the
``workbench bench`` tables built from both."""
