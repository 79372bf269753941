"""`trtkv plan` for the engine formats: priced with their scale bytes, the recipe's table row in the notes, advice
naming the engine formats (heuristic from the table; measured sentences from a probe result)."""

from __future__ import annotations

from pathlib import Path

import pytest

import trtkv.measures.probe_results as results
from tests.support.probe_records import probe_doc, record
from trtkv.kvcache.formats import PER_TOKEN_HEAD_SCALE_BYTES, kv_bytes_per_token
from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe

VLLM = ["build.backend=vllm"]  # llama70b_fp8kv: 80 layers, 8 KV heads, head_dim 128


@pytest.mark.parametrize("kv", ["int8_per_token_head", "fp8_per_token_head", "int4_per_token_head"])
def test_per_token_head_scales_cost_bytes_in_the_plan(kv: str) -> None:
    p = plan(load_recipe("llama70b_fp8kv", [*VLLM, f"quantization.kv_cache={kv}"]))
    row = next(c for c in p.formats if c.format == p.recipe_kv_format)
    bits = 4 if kv.startswith("int4") else 8
    assert row.bytes_per_token == 2 * 80 * 8 * (128 * bits // 8 + PER_TOKEN_HEAD_SCALE_BYTES)  # scale per token, head
    note = next(n for n in p.notes if n.startswith(f"KV format {kv} (docs/kv-formats.md)"))
    assert f"`--kv-cache-dtype {kv}`" in note


def test_fp8_cast_is_planned_as_its_table_row() -> None:
    p = plan(load_recipe("llama70b_fp8kv", [*VLLM, "quantization.kv_cache=fp8_cast"]))
    assert p.recipe_kv_format == "fp8_scale1"
    assert any(n.startswith("KV format fp8_cast (table row fp8_scale1)") for n in p.notes)
    assert next(c for c in p.formats if c.format == "fp8_scale1").bytes_per_token == kv_bytes_per_token(80, 8, 128, "fp8")


def test_heuristic_advice_names_the_engine_formats_from_the_table() -> None:
    p = plan(load_recipe("llama70b_fp8kv", VLLM))
    assert p.advice_basis.startswith("heuristic")
    assert any("On vLLM >= 0.32.0" in a and "int8_per_token_head" in a for a in p.advice)
    assert any("`--kv_cache_qformat fp8_cast`" in a for a in p.advice)


def test_measured_advice_names_engine_formats_from_a_small_fake_probe(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = load_recipe("llama70b_fp8kv", VLLM)
    recs = [record("fp16", 512, 0.0), record("int8", 256, 0.01, 0.0), record("int8", 512, 0.05, 2e-5),
            record("int8_per_token_head", 256, 0.001), record("int8_per_token_head", 512, 0.002),
            record("fp8", 512, 0.004), record("fp8_cast", 512, 0.010)]
    doc = probe_doc(recs, recipe.name, reference="fp16", needles=[])
    monkeypatch.setattr(results, "find_probe", lambda *_a, **_k: (tmp_path, doc))
    p = plan(recipe, tmp_path)
    assert p.advice_basis.startswith("measured")
    dyn = next(a for a in p.advice if "`int8_per_token_head` is the INT8 to use" in a)
    assert "On vLLM >= 0.32.0" in dyn and "KL 0.00200 vs 0.05000" in dyn
    assert "clips 2.00e-05 of K/V elements at 512 tokens and beyond" in dyn and "build.backend: vllm" in dyn
    cast = next(a for a in p.advice if "ModelOpt's default `fp8_cast`" in a)
    assert "KL 0.01000 vs 0.00400 for calibrated `fp8`" in cast and "x2.5" in cast
