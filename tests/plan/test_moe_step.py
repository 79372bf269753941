"""A mixture-of-experts step priced by what it touches (trtkv.plan.moe_step, issue #49): the routed experts a step's
tokens reach under uniform routing, their stored bytes, prefill FLOPs from the active parameters, the all-to-all of EP
with attention DP, and KV formats that differ where attention bytes do. Shown failing on main's code (42c69aa), whose
step read every expert: gpt-oss-120b's 8K TTFT on one H200 was 2,570 ms and its decode step did not depend on the
batch's experts."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from tests.support import speed_cases as sc
from trtkv.checkpoints import read_model_facts
from trtkv.core.errors import TrtkvError
from trtkv.kvcache.formats import KVFormat
from trtkv.plan import moe_step, moe_tables, speed
from trtkv.plan.estimate import estimate, kv_cost, model_shape
from trtkv.plan.model import resolve_architecture
from trtkv.plan.planner import plan
from trtkv.platform.hardware import GPU

GPT_OSS = "tests/data/configs/gpt_oss_120b"
QWEN_MOE = "tests/data/configs/qwen3_30b_a3b"


def shape_for(config: str, gpu: str = "H200-141GB", tp: int = 1, ep: int = 1, dp: int = 1, isl: int = 8192):
    recipe = sc.recipe_for(config, gpu, "vllm", "bf16", isl, 256, [1], 8192, tp=tp)
    arch = resolve_architecture(recipe)
    return recipe, arch, model_shape(arch, recipe, ep, dp)


def test_distinct_experts_is_the_uniform_closed_form() -> None:
    assert moe_step.distinct_experts(128, 4, 1) == pytest.approx(4)
    assert moe_step.distinct_experts(128, 4, 0) == 0
    # E (1 - (1 - k/E)^N): 8 tokens of top-8 over 128 reach 128 (1 - (120/128)^8) = 50.5, not 64 (overlaps)
    assert moe_step.distinct_experts(128, 8, 8) == pytest.approx(128 * (1 - (120 / 128) ** 8))
    assert moe_step.distinct_experts(128, 4, 4096) == pytest.approx(128, rel=1e-9)
    counts = [moe_step.distinct_experts(128, 4, n) for n in (1, 2, 8, 32, 128)]
    assert counts == sorted(counts) and counts[-1] < 128


def test_the_busiest_ep_rank_sets_the_step_under_uniform_routing() -> None:
    # one rank: the closed form itself
    assert moe_step.rank_load(128, 8, 16) == (moe_step.distinct_experts(128, 8, 16), 128)
    # DeepSeek-R1 at EP8 (256 experts, top 8), one token: 8 experts over 8 ranks average 1 a rank, but the step waits
    # for the rank that drew the most (about 2.5 of its 32)
    busiest, pairs = moe_step.rank_load(256, 8, 1, 8)
    assert 2.0 < busiest < 3.0 and pairs == 1
    # a large batch touches every expert: the busiest rank's share is the mean share
    assert moe_step.rank_load(256, 8, 4096, 8)[0] == pytest.approx(32, rel=1e-6)
    shares = [moe_step.rank_load(128, 4, n, 2)[0] / (moe_step.distinct_experts(128, 4, n) / 2) for n in (1, 8, 64, 512)]
    assert shares == sorted(shares, reverse=True) and shares[0] > 1.3 and shares[-1] == pytest.approx(1, abs=1e-3)


def test_aiconfigurators_power_law_as_its_collector_draws_it() -> None:
    law = moe_step.POWER_LAW
    # N k <= E: loads drawn on [0.01, 2], far more skewed than uniform: Qwen3-30B-A3B's 16 tokens reach ~50 of 128
    qwen, pairs = moe_step.rank_load(128, 8, 16, 1, law)
    assert 40 < qwen < 60 < moe_step.distinct_experts(128, 8, 16) and pairs == 128
    # N k > E: loads on [1, 0.8 N], every expert at least ~1/N of the hottest: gpt-oss-20b's 16 tokens reach
    # nearly all 32 experts, at least as many as uniform's 28
    assert moe_step.rank_load(32, 4, 16, 1, law)[0] >= moe_step.distinct_experts(32, 4, 16)
    # a token reaches an expert once: one token reads its k experts under any draw
    assert moe_step.rank_load(128, 8, 1, 1, law) == (8, 8)
    # under EP the busiest rank takes more than its share of the token-expert pairs
    _, busy = moe_step.rank_load(128, 4, 64, 2, law)
    assert busy > 64 * 4 / 2
    # seeded: the same answer each time
    moe_step._power_law.cache_clear()
    assert moe_step.rank_load(128, 8, 16, 1, law) == (qwen, pairs)
    with pytest.raises(TrtkvError) as e:
        moe_step.rank_load(128, 8, 16, 1, "zipf")
    assert "'zipf'" in str(e.value) and "uniform, power_law_1.2" in str(e.value) and "Next:" in str(e.value)


def test_gpt_oss_experts_are_stored_mxfp4_and_priced_apart_from_attention() -> None:
    recipe, arch, m = shape_for(GPT_OSS)
    moe = m.moe
    assert moe is not None and (moe.experts, moe.top_k, moe.layers) == (128, 4, 36)
    # E2M1 + one E8M0 scale per 32 weights, as its quantization_config says; the rest 16-bit
    assert moe.bytes_per_param == read_model_facts(sc.ROOT / GPT_OSS).quant.weight_bytes == 0.5 + 1 / 32
    assert moe.total_params == pytest.approx(arch.expert_parameters)
    # the dense part (attention, routers, LM head) keeps its 16-bit bytes: weight_bytes / gemm_params ~ 2 B
    assert m.weight_bytes / m.gemm_params == pytest.approx(2.0, rel=0.05)
    assert m.gemm_params < 0.05 * arch.parameters()


def test_a_decode_step_reads_the_experts_its_batch_routes_to() -> None:
    _, _, m = shape_for(GPT_OSS)
    k = speed.kernels_for(GPU.H200_141GB, "vllm")
    one, _ = moe_step.routed_ms(k, m.moe, 1)
    eight, _ = moe_step.routed_ms(k, m.moe, 8)
    many, _ = moe_step.routed_ms(k, m.moe, 256)
    assert one < eight < many
    # one token reads 4 of 128 experts: its expert time is the shape's own balanced row at one token (aiconfigurator-core
    # 0.12.0 h200_sxm/moe/vllm/0.24.0/moe_perf.parquet, w4a16_mxfp4 2880/2880/4/128, moe_tp 1, EP 1: 0.06086 ms a layer;
    # trtkv.plan.moe_tables.decode_row_ms), not 128 experts' bytes
    fused = k.moe_tables[m.moe.table]
    all_bytes = m.moe.total_params * m.moe.bytes_per_param
    floor = all_bytes / (k.mem_bw * min(1.0, fused["mem_efficiency"])) * 1e3
    assert one == pytest.approx(m.moe.layers * 0.06086, rel=1e-3)
    assert one < floor / 4
    # a shape the table lacks (64 experts): the bytes of 4 experts per layer plus the fused MoE op's fixed cost and its
    # cost per expert touched (the per-dtype fit of the same table)
    other = replace(m.moe, experts=64)
    assert moe_tables.decode_row_ms(k, other, other.table, 4) is None
    per_layer = fused["fixed_ms"] + 4 * fused["per_expert_ms"]
    assert moe_step.routed_ms(k, other, 1)[0] == pytest.approx(floor * 4 / 128 + m.moe.layers * per_layer, rel=1e-6)


def test_prefill_flops_come_from_the_active_parameters() -> None:
    """Issue #49: gpt-oss-120b on one H200, 8K in: 2,570 ms on main where 2 x 5.1e9 x 8,192 FLOP takes ~0.1 s."""
    recipe, arch, m = shape_for(GPT_OSS)
    k = speed.kernels_for(GPU.H200_141GB, "vllm")
    kv = kv_cost(arch, recipe, KVFormat.BF16, ())
    prefill = speed.step_time(k, m, kv, [], 8192, 0)
    # the active parameters' FLOPs: at the dense GEMMs' efficiency at best, at the fused MoE op's at worst
    fast = 2 * 5.1e9 * 8192 / (k.flops["bfloat16"] * k.efficiency("gemm_compute", "bfloat16")) * 1e3
    slow = 2 * 5.1e9 * 8192 / (k.flops["bfloat16"] * k.moe_tables[m.moe.table]["compute_efficiency"]) * 1e3
    assert 0.75 * fast < prefill.gemm_ms < 1.25 * slow < 400
    assert speed.serve(k, m, kv, 8192, 256, 1, 8192).ttft_ms < 400


def test_kv_formats_differ_where_attention_bytes_do() -> None:
    """The experts no longer swamp the cache: FP8 KV's decode step is faster than BF16's at a long context."""
    recipe, arch, m = shape_for(QWEN_MOE, gpu="H100-80GB", isl=32768)
    k = speed.kernels_for(GPU.H100_80GB, "vllm")
    steps = {f: speed.step_time(k, m, kv_cost(arch, recipe, f, ()), [32768.0] * 8).total_ms
             for f in (KVFormat.BF16, KVFormat.FP8)}
    assert steps[KVFormat.FP8] < 0.85 * steps[KVFormat.BF16]


def test_expert_parallel_splits_the_experts_and_attention_dp_adds_the_all_to_all() -> None:
    k = speed.kernels_for(GPU.B200, "trtllm")
    _, _, ep1 = shape_for(GPT_OSS, gpu="B200")
    _, _, dep2 = shape_for(GPT_OSS, gpu="B200", ep=2, dp=2)
    _, _, tep2 = shape_for(GPT_OSS, gpu="B200", tp=2, ep=2)
    assert (dep2.moe.moe_tp, tep2.moe.moe_tp) == (1, 1)
    solo, comm_solo = moe_step.routed_ms(k, ep1.moe, 64)
    half, comm_dep = moe_step.routed_ms(k, dep2.moe, 32)  # 32 per rank, 64 in the expert group
    _, comm_tep = moe_step.routed_ms(k, tep2.moe, 64)
    assert half < solo and comm_solo == 0 and comm_tep == 0 < comm_dep
    # the all-to-all runs twice per MoE layer (dispatch, combine), at least one collective floor each
    assert comm_dep >= 2 * dep2.moe.layers * k.ar_floor_ms


def test_expert_parallel_must_divide_the_gpus_and_the_experts() -> None:
    with pytest.raises(TrtkvError) as e:
        moe_step.check_parallel(2, 3, 1, 128)
    assert "expert parallel size 3" in str(e.value) and "Next: pick an EP among 1, 2" in str(e.value)
    with pytest.raises(TrtkvError):
        shape_for(GPT_OSS, tp=2, ep=4)


def test_estimate_states_the_routing_assumption_and_its_effect() -> None:
    recipe = sc.recipe_for(QWEN_MOE, "H100-80GB", "vllm", "bf16", 2048, 256, [1, 32], 8192)
    notes = " ".join(estimate(recipe, plan(recipe), use_aiconfigurator=False).notes)
    assert "uniform routing" in notes and "E (1 - (1 - k/E)^N)" in notes
    assert "concurrency 1: 8, concurrency 32: 112 of 128" in notes
    assert "multi-node wide EP and speculative decoding are not modelled" in notes
    # the effect: the experts and the ITL under aiconfigurator's power law beside the default's
    power = re.search(r"power-law expert load \(alpha 1\.2.*?\) they would be (\d+), (\d+) and ITL "
                      r"([\d.]+) -> ([\d.]+) ms \(([+-]\d+)%\), ([\d.]+) -> ([\d.]+) ms", notes)
    assert power, notes
    one, many = int(power[1]), int(power[2])
    assert one == 8 and many < 112  # one token reads its k either way; 32 tokens fewer under the skew
    assert float(power[7]) < float(power[6])  # fewer experts read: a faster decode step at 32
    rows = estimate(recipe, plan(recipe), use_aiconfigurator=False).rows
    own = {r.concurrency: r.itl_ms for r in rows if r.format == recipe.kv_format_label}
    assert float(power[3]) == pytest.approx(own[1], abs=0.005) and float(power[6]) == pytest.approx(own[32], abs=0.005)
    dense = sc.recipe_for(sc.MODELS["llama3_1_8b"], "H100-80GB", "vllm", "bf16", 2048, 256, [1], 8192)
    assert "routing" not in " ".join(estimate(dense, plan(dense), use_aiconfigurator=False).notes)
