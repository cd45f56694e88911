"""One module per transformers model family (``model_type``): ``MODEL_CLASS`` (its causal LM class name),
``apply(patcher)`` (swaps the catalog's ops into the family's modules and reports each one), and ``tiny(full)`` (the
config fields of a tiny instance of the same architecture, for ``workbench parity``). Glue shared by families lives
in ``_common``."""
