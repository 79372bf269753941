"""The plan's prefix-cache section: what the workload's hit rate does to capacity per format, from the same pool the
capacity table uses, and off (with the engine's reason) where the engine reuses no blocks. The rates are the workload's
(bench.prefix, #55), not fixed: shown failing on main's code, whose table was 0, 50% and 90% for every recipe."""

from __future__ import annotations

import json

from trtkv.cli import main
from trtkv.plan.planner import plan
from trtkv.plan.prefix import reusable_share
from trtkv.recipe import load_recipe


def test_a_hit_rate_multiplies_sequences_and_the_format_keeps_its_ratio() -> None:
    # 2,048 in of which a 1,000-token shared system prompt, one turn: the engine's 32-token blocks
    # (build.tokens_per_block) hold 992 of it
    p = plan(load_recipe("llama70b_fp8kv", ["bench.prefix.shared_tokens=1000"]))
    pc = p.prefix_cache
    share = pc.hit_rates[1]
    assert pc.enabled and pc.hit_rates == [0.0, round(992 / 2048, 4)] and "enable_kv_cache_reuse" in pc.why
    tokens = {c.format: c.tokens_per_gpu_budget for c in p.formats}
    for row in pc.rows:
        for h, n in row.sequences.items():
            held = (1 - float(h)) * pc.input_tokens + pc.output_tokens
            assert n == int(tokens[row.format] // held)
    by = {r.format: r.sequences for r in pc.rows}
    top = f"{share:g}"
    for h in ("0", top):  # fp8 holds twice fp16's tokens at every hit rate
        assert abs(by["fp8"][h] / by["fp16"][h] - 2) < 0.01
    assert by["fp8"][top] - by["fp16"][top] > by["fp8"]["0"] - by["fp16"]["0"]  # the gain grows with h
    assert any("reusable share" in a and "fp8" in a for a in p.advice)
    assert any("--gemm_plugin disable" in a and "perf best practices" in a for a in p.advice)


def test_no_prefix_workload_prices_no_hits() -> None:
    p = plan(load_recipe("llama70b_fp8kv"))
    assert p.prefix_cache.enabled and p.prefix_cache.hit_rates == [0.0]
    assert any("shares no prefix (bench.prefix unset)" in a for a in p.advice)


def test_sessions_reuse_their_history_in_whole_blocks() -> None:
    # vLLM's 16-token blocks: 3 turns of +100 tokens after 1,000 in, 50 out; turn 2 reuses its 1,050-token history
    # (1,040 in blocks), turn 3 its 1,200 (1,200)
    r = load_recipe("llama70b_fp8kv", ["build.backend=vllm", "quantization.weights=fp8", "bench.input_tokens=1000",
                                       "bench.output_tokens=50", "bench.prefix.turns=3",
                                       "bench.prefix.turn_tokens=100"])
    assert reusable_share(r) == (1040 + 1200) / (1000 + 1150 + 1300)


def test_off_where_the_engine_cannot_reuse_with_its_reason(capsys) -> None:  # noqa: ANN001
    p = plan(load_recipe("llama70b_int8kv"))
    assert not p.prefix_cache.enabled and p.prefix_cache.hit_rates == [0.0]
    assert "paged context FMHA" in p.prefix_cache.why
    assert any("Prefix caching is off here" in a for a in p.advice)
    assert main(["plan", "llama70b_fp8kv", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefix_cache"]["enabled"] is True
    assert main(["plan", "llama70b_fp8kv", "--full", "triton.enable_kv_cache_reuse=false"]) == 0
    assert "Prefix cache: off (triton.enable_kv_cache_reuse: false" in " ".join(capsys.readouterr().out.split())


def test_sessions_capacity_holds_their_mean_prompt_not_the_first_turns() -> None:
    """Under bench.prefix a later turn sends the whole history: 3 turns of +100 tokens after 1,000 in, 50 out send
    prompts of 1,000, 1,150 and 1,300 tokens, so a sequence holds 1,150 + 50 at no hits (main priced 1,000 + 50: the
    first turn's, 4% too many sequences here), and at the reusable share (1,040 + 1,200 of 3,450 prompt tokens) the
    mean of what each turn holds of its own."""
    r = load_recipe("llama70b_fp8kv", ["build.backend=vllm", "quantization.weights=fp8", "bench.input_tokens=1000",
                                       "bench.output_tokens=50", "bench.prefix.turns=3",
                                       "bench.prefix.turn_tokens=100"])
    p = plan(r)
    pc = p.prefix_cache
    assert pc.input_tokens == 1150
    tokens = {c.format: c.tokens_per_gpu_budget for c in p.formats}
    held_turns = [(1000 - 0) + 50, (1150 - 1040) + 50, (1300 - 1200) + 50]  # each turn's own KV at its hits
    share = pc.hit_rates[1]
    assert share == round(2240 / 3450, 4)
    # (1 - share) x the mean prompt + the answer: the mean of what each turn holds (the share rounded to 4 places)
    assert abs((1 - share) * 1150 + 50 - sum(held_turns) / 3) <= 0.5e-4 * 1150
    for row in pc.rows:
        assert row.sequences["0"] == int(tokens[row.format] // 1200)
        assert row.sequences[f"{share:g}"] == int(tokens[row.format] // ((1 - share) * 1150 + 50))
    assert any("1150-in (a session's mean prompt over its turns)" in a for a in p.advice)
