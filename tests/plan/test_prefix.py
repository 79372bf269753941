"""The plan's prefix-cache section: what a hit rate does to capacity per format, from the same pool the capacity table
uses, and off (with the engine's reason) where the engine reuses no blocks."""

from __future__ import annotations

import json

from trtkv.cli import main
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe


def test_a_hit_rate_multiplies_sequences_and_the_format_keeps_its_ratio() -> None:
    p = plan(load_recipe("llama70b_fp8kv"))
    pc = p.prefix_cache
    assert pc.enabled and pc.hit_rates == [0.0, 0.5, 0.9] and "enable_kv_cache_reuse" in pc.why
    tokens = {c.format: c.tokens_per_gpu_budget for c in p.formats}
    for row in pc.rows:
        for h, n in row.sequences.items():
            held = (1 - float(h)) * pc.input_tokens + pc.output_tokens
            assert n == int(tokens[row.format] // held)
    by = {r.format: r.sequences for r in pc.rows}
    for h in ("0", "0.5", "0.9"):  # fp8 holds twice fp16's tokens at every hit rate
        assert abs(by["fp8"][h] / by["fp16"][h] - 2) < 0.01
    assert by["fp8"]["0.9"] - by["fp16"]["0.9"] > 4 * (by["fp8"]["0"] - by["fp16"]["0"])  # the gain grows with h
    assert any("Prefix caching on" in a and "fp8" in a for a in p.advice)
    assert any("--gemm_plugin disable" in a and "perf best practices" in a for a in p.advice)


def test_off_where_the_engine_cannot_reuse_with_its_reason(capsys) -> None:  # noqa: ANN001
    p = plan(load_recipe("llama70b_int8kv"))
    assert not p.prefix_cache.enabled and p.prefix_cache.hit_rates == [0.0]
    assert "paged context FMHA" in p.prefix_cache.why
    assert any("Prefix caching is off here" in a for a in p.advice)
    assert main(["plan", "llama70b_fp8kv", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefix_cache"]["enabled"] is True
    assert main(["plan", "llama70b_fp8kv", "--full", "triton.enable_kv_cache_reuse=false"]) == 0
    assert "Prefix cache: off (triton.enable_kv_cache_reuse: false" in " ".join(capsys.readouterr().out.split())
