"""The kernels a decoder layer launches by its structure (trtkv.plan.layer_ops), as aiconfigurator-core 0.12.0 lists a
layer's generation ops: every layer was priced as a dense GQA layer's 4 GEMMs and 5 kernels on d2b3715, so DeepSeek's
MLA + shared-expert layer (8 GEMMs) was under-priced at a small batch (TensorRT-LLM DeepSeek-R1 TP8/EP8 on H200, TPOT
-20.6% at concurrency 1, now -6%) and a MoE layer without shared experts over-priced by one GEMM. The weights every TP
rank holds whole (MLA's down-projections, routers) were divided by TP on 9fc1850: DeepSeek-R1 TP8/EP8 TPOT -6.2% / -2.6%
-> -4.3% / -1.0%, SGLang DeepSeek-V3 TP8 on H20 ITL -39.5% -> -38.1% (tests/plan/test_published_speed.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.speed_cases import recipe_for
from trtkv.kvcache.formats import KVFormat
from trtkv.plan import speed
from trtkv.plan.estimate import kv_cost, model_shape
from trtkv.plan.layer_ops import layer_ops, replicated_parameters
from trtkv.plan.model import resolve_architecture


def _arch(config: str):
    return resolve_architecture(recipe_for(f"tests/data/configs/{config}", "H200-141GB", "vllm", "bf16", 1024, 64, [1],
                                           8192))


@pytest.mark.parametrize(("config", "gemms", "kernels"), [
    ("llama3_1_8b", 4, 5),  # QKV, O, gate/up, down; norm, RoPE, KV write, norm + residual, SiLU-and-mul
    ("qwen3_30b_a3b", 3, 4),  # QKV, O, router: the experts are the fused MoE op, their SiLU inside it
    ("gpt_oss_120b", 3, 4),
    # MLA (down, q up, absorbed K, absorbed V, O) and q's latent norm; 58 MoE layers with router and shared expert
    # (3 GEMMs, its SiLU), the first 3 dense (2)
    ("deepseek_v3", 5 + (58 * 3 + 3 * 2) / 61, 4 + 1 + 1),
])
def test_a_layer_is_priced_by_the_kernels_it_runs(config: str, gemms: float, kernels: float) -> None:
    arch = _arch(config)
    assert layer_ops(arch) == pytest.approx((gemms, kernels))
    recipe = recipe_for(f"tests/data/configs/{config}", "H200-141GB", "vllm", "bf16", 1024, 64, [1], 8192)
    m = model_shape(arch, recipe)
    assert (m.gemm_calls, m.layer_kernels) == pytest.approx((gemms, kernels))


def test_the_fixed_costs_follow_the_count() -> None:
    # the same step with DeepSeek's count and a dense layer's differs by the extra calls' fixed costs, nothing else
    recipe = recipe_for("tests/data/configs/deepseek_v3", "H200-141GB", "vllm", "bf16", 1024, 64, [1], 8192)
    arch = resolve_architecture(recipe)
    k = speed.kernels_for(recipe.hardware.gpu, "vllm")
    m = model_shape(arch, recipe)
    kv = kv_cost(arch, recipe, KVFormat.BF16, ())
    dense = replace(m, gemm_calls=speed.GEMMS_PER_LAYER, layer_kernels=speed.ELEMENTWISE_KERNELS)
    ours, theirs = speed.step_time(k, m, kv, [1024.0]), speed.step_time(k, dense, kv, [1024.0])
    fixed = k.gemm_fixed_ms[f"gemm_memory.{m.weight_dtype}"]
    assert ours.gemm_ms - theirs.gemm_ms == pytest.approx((m.gemm_calls - 4) * m.num_layers * fixed)
    assert ours.other_ms - theirs.other_ms == pytest.approx(1 * m.num_layers * k.op_latency_ms)


def test_mla_down_projections_and_routers_are_whole_on_every_tp_rank() -> None:
    # DeepSeek-V3: 61 MLA layers' fused q_a/kv_a down-projection (7168 -> 1536 + 512 + 64) and 58 routers (7168 -> 256)
    arch = _arch("deepseek_v3")
    whole = 61 * 7168 * (1536 + 512 + 64) + 58 * 7168 * 256
    assert replicated_parameters(arch, 1536) == whole
    assert replicated_parameters(arch, None) == whole - 61 * 7168 * 1536  # no q latent: q_proj is column-parallel
    assert replicated_parameters(_arch("llama3_1_8b"), None) == 0
    shapes = {tp: model_shape(arch, recipe_for("tests/data/configs/deepseek_v3", "H200-141GB", "sglang", "bf16", 1024,
                                               64, [1], 8192, tp=tp)) for tp in (1, 8)}
    # per GPU at TP8: the rest split eight ways, the replicated weights whole, at the same bytes per parameter
    assert shapes[8].gemm_params == pytest.approx((shapes[1].gemm_params - whole) / 8 + whole)
    per_param = shapes[1].weight_bytes / shapes[1].gemm_params
    assert shapes[8].weight_bytes / shapes[8].gemm_params == pytest.approx(per_param, rel=0.02)
