"""The plan's predicted prefix-cache hit rates per tier (trtkv.plan.prefix_predicted), handed to bench in
PlanFigures.prefix so results.json's prefix levels read measured against predicted (#55)."""

from __future__ import annotations

import pytest

from trtkv.plan.handoff import figures
from trtkv.plan.prefix import reusable_share
from trtkv.recipe import load_recipe

WORKLOAD = ["bench.input_tokens=72", "bench.output_tokens=4", "bench.prefix.shared_tokens=40",
            "bench.prefix.turns=2", "bench.prefix.turn_tokens=16", "bench.concurrency=[1,2]"]
SMALL = ["build.max_seq_len=256", "build.max_input_len=200", "build.max_batch_size=1",
         "bench.needle_context_lengths=[160]", "bench.fidelity_lengths=[128]"]


def test_a_pool_that_holds_the_working_set_predicts_the_whole_reusable_share() -> None:
    """The reference runtime's 4 x 4096-token pool holds 2 sessions of 92 tokens many times over: every reusable block
    hits (the share plan/prefix.py prices, a separate sum), all on the device tier, one engine."""
    recipe = load_recipe("smollm2_fp8kv", overrides=WORKLOAD)
    pred = figures(recipe).prefix
    assert pred is not None and pred.kv_format == "fp8" and pred.block_tokens == 32
    assert pred.device_tokens == 4 * 4096 and pred.host_tokens == 0
    for c in (1, 2):
        assert pred.levels[c].device == pytest.approx(reusable_share(recipe), abs=1e-4)
        assert pred.levels[c].host == 0.0
        assert pred.levels[c].routing == "one engine (no routing)"
    # (32 + 64) of (72 + 92) prompt tokens per session
    assert reusable_share(recipe) == pytest.approx(96 / 164)


def test_a_small_device_pool_spills_into_the_host_tier() -> None:
    """256 device tokens and 0.002 GiB of host tier (186 fp8 tokens of 11,520 bytes): at 8 sessions of 8 groups the
    prefixes outlive the device pool's LRU only partly, the host tier (exclusive) keeps more of them."""
    over = [*WORKLOAD, *SMALL, "bench.prefix.groups=8", "bench.concurrency=[1,2]"]
    alone = figures(load_recipe("smollm2_fp8kv", overrides=over)).prefix
    tiered = figures(load_recipe("smollm2_fp8kv", overrides=[*over, "triton.kv_host_tier_gib_per_replica=0.002"])).prefix
    assert alone is not None and tiered is not None
    assert alone.device_tokens == tiered.device_tokens == 256
    assert tiered.host_tokens == int(0.002 * 2**30 / 11520)
    for c in (1, 2):
        assert alone.levels[c].host == 0.0
        assert tiered.levels[c].host > 0.0
        assert tiered.levels[c].device == pytest.approx(alone.levels[c].device)
        assert "exclusive" in tiered.levels[c].basis


def test_a_quantized_cache_is_predicted_to_keep_more_at_the_same_pool_bytes() -> None:
    """FP8 at 512 tokens and BF16 at 256 tokens of max_seq_len: the same device bytes (one sequence's worth), FP8's
    holds twice the tokens, so more of the prefixes stay."""
    over = [*WORKLOAD, *SMALL, "bench.prefix.groups=4"]
    fp8 = figures(load_recipe("smollm2_fp8kv", overrides=[*over, "build.max_seq_len=512"])).prefix
    bf16 = figures(load_recipe("smollm2_fp16kv", overrides=over)).prefix
    assert fp8 is not None and bf16 is not None
    assert fp8.device_tokens == 2 * bf16.device_tokens == 512
    assert fp8.levels[1].device > bf16.levels[1].device


def test_think_time_on_a_cpu_runtime_is_said_not_priced() -> None:
    recipe = load_recipe("smollm2_fp8kv", overrides=[*WORKLOAD, "bench.prefix.think_time_s=2"])
    pred = figures(recipe).prefix
    assert pred is not None
    assert "think 2 s not priced" in pred.levels[1].basis


def test_no_prefix_workload_no_prediction() -> None:
    assert figures(load_recipe("smollm2_fp8kv")).prefix is None
    off = load_recipe("smollm2_fp8kv", overrides=[*WORKLOAD, "triton.enable_kv_cache_reuse=false"])
    assert figures(off).prefix is None


def test_think_time_on_a_gpu_engine_comes_from_the_speed_model() -> None:
    """TensorRT-LLM on an H100: a turn's service time from trtkv's model against the think time gives the sessions
    running at once; the basis names both."""
    recipe = load_recipe("llama70b_fp8kv_llmapi", overrides=["bench.prefix.shared_tokens=400",
                                                             "bench.prefix.think_time_s=2", "bench.prefix.turns=3"])
    pred = figures(recipe).prefix
    assert pred is not None
    for level in pred.levels.values():
        assert "against think 2 s" in level.basis and "trtkv model" in level.basis
        assert 0 < level.device <= reusable_share(recipe) + 1e-4
