"""Integrations with the code users run: the ported kernels swapped into a published model implementation
(``workbench.integrations.transformers``: ``apply_workbench_kernels``), and the parity check that holds the patched
model to the model as shipped (``workbench.integrations.parity``). Integrations depend on the catalog and the
kernels library, never the reverse."""
