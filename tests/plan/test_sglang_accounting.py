"""`trtkv plan` on an SGLang recipe: capacity follows SGLang's own token-pool sizing, named as SGLang's, with the bytes
per token SGLang 0.5.23's pool configurator computes (KV heads per TP rank x (K + V head dim) x layers x element bytes)."""

from __future__ import annotations

import pytest

from trtkv.plan.model import recipe_accounting
from trtkv.plan.planner import plan
from trtkv.plan.result import PlanModel
from trtkv.recipe import load_recipe
from trtkv.recipe.attention import Accounting

RECIPE = "llama70b_fp8kv_sglang"


def sglang_cell_size(model: PlanModel, tp: int, element_bytes: int) -> int:
    """sglang 0.5.23 pool_configurator._compute_cell_size for MHA, written out: n x (head_dim + v_head_dim) x layers x kv_size."""
    n = max(1, model.num_kv_heads // tp)
    return n * (model.head_dim + model.head_dim) * model.num_layers * element_bytes


@pytest.mark.parametrize("overrides,fmt,element_bytes", [([], "fp8", 1), (["quantization.kv_cache=none"], "fp16", 2)])
def test_sglang_capacity_is_labelled_sglangs_and_counts_its_cell_size(overrides: list[str], fmt: str,
                                                                      element_bytes: int) -> None:
    p = plan(load_recipe(RECIPE, overrides))
    assert "SGLang" in p.attention.accounting and "TensorRT-LLM" not in p.attention.accounting
    row = next(f for f in p.formats if f.format == fmt)
    assert "SGLang" in row.accounting and "TensorRT-LLM" not in row.accounting
    assert recipe_accounting(load_recipe(RECIPE, overrides))[0] is Accounting.EXACT  # SGLang counts exact's bytes
    assert row.bytes_per_token_per_gpu == sglang_cell_size(p.model, p.hardware.tp_size, element_bytes)


def test_other_backends_keep_their_own_labels() -> None:
    assert "TensorRT-LLM" in plan(load_recipe("llama70b_fp8kv")).attention.accounting
    assert "SGLang" not in plan(load_recipe("llama70b_fp8kv", ["build.backend=vllm"])).attention.accounting
