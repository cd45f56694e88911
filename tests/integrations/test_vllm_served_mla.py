"""The MLA models served by vLLM with the plugin: deepseek_v3 (its attention through CPU_MLA, its experts through
the unquantized method) and deepseek_v3-mxfp4 (the same with the experts in MXFP4), held as test_vllm_parity.py
holds GPT-OSS. A file of their own, so that the suite's two workers can serve them beside that one."""

from __future__ import annotations

import pytest
from test_vllm_parity import assert_served_as_shipped


@pytest.mark.slow
@pytest.mark.interpreter
@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v3-mxfp4"])
def test_an_mla_model_served_by_vllm_with_the_plugin_computes_what_vllm_computes_as_shipped(model_type):
    assert_served_as_shipped(model_type)
