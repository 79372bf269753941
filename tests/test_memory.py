"""The planner against published figures and its own formulas."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trtkv.kvcache.formats import KVFormat, bytes_per_element, kv_bytes_per_token
from trtkv.memory import GIB, plan
from trtkv.recipe import load_recipe


def test_llama70b_published_bytes_per_token() -> None:
    assert kv_bytes_per_token(80, 8, 128, KVFormat.FP16) == 327_680
    assert kv_bytes_per_token(80, 8, 128, KVFormat.FP8) == 163_840
    assert kv_bytes_per_token(80, 8, 128, KVFormat.INT8) == 163_840
    assert kv_bytes_per_token(32, 8, 128, KVFormat.FP16) == 131_072  # Llama-3-8B


def test_scale_overheads() -> None:
    assert bytes_per_element(KVFormat.INT8_TOKEN, 128) == pytest.approx(1 + 2 / 128)
    assert bytes_per_element(KVFormat.INT4_G32, 128) == pytest.approx(0.5 + 4 / 32)
    assert bytes_per_element(KVFormat.INT4_G128, 128) == pytest.approx(0.5 + 4 / 128)
    assert bytes_per_element(KVFormat.KIVI2, 128) == pytest.approx(0.25 + 4 / 32)


def test_plan_json_has_known_figures(capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    assert main(["plan", "llama70b_fp8kv", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    fmts = {f["format"]: f for f in data["formats"]}
    assert fmts["fp16"]["bytes_per_token"] == 327_680
    assert fmts["fp8"]["bytes_per_token"] == 163_840
    example = next(e for e in data["examples"] if e["context_len"] == 32768 and e["batch"] == 8)
    assert example["fp16_gib"] == 80.0
    assert example["fp8_gib"] == 40.0
    assert data["recipe_kv_format"] == "fp8"
    assert data["hardware"]["tp_size"] == 4


def test_capacity_follows_budget_and_tp() -> None:
    recipe = load_recipe("llama70b_fp8kv")
    p = plan(recipe)
    fp8 = next(f for f in p.formats if f.format == "fp8")
    # TP4 splits the 8 KV heads: a quarter of the bytes per GPU
    assert fp8.bytes_per_token_per_gpu == fp8.bytes_per_token / 4
    assert fp8.tokens_per_gpu_budget == math.floor(p.kv_budget_gib_per_gpu * GIB / fp8.bytes_per_token_per_gpu)
    assert fp8.max_sequences[32768] == fp8.tokens_per_gpu_budget // 32768
    fp16 = next(f for f in p.formats if f.format == "fp16")
    assert fp8.tokens_per_gpu_budget == pytest.approx(2 * fp16.tokens_per_gpu_budget, abs=2)
    # a bigger GPU gives more room; a smaller memory fraction gives less
    bigger = plan(load_recipe("llama70b_fp8kv", ["hardware.gpu=H200-141GB"]))
    assert bigger.kv_budget_gib_per_gpu > p.kv_budget_gib_per_gpu
    less = plan(load_recipe("llama70b_fp8kv", ["triton.kv_cache_free_gpu_mem_fraction=0.45"]))
    assert less.kv_budget_gib_per_gpu == pytest.approx(p.kv_budget_gib_per_gpu / 2)


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    recipe = load_recipe("llama70b_fp8kv", ["build.tp_size=8", "hardware.count=8"])
    fp16 = next(f for f in plan(recipe).formats if f.format == "fp16")
    assert fp16.bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2  # one KV head per GPU


def test_decode_bound_uses_bandwidth() -> None:
    p = plan(load_recipe("llama8b_fp8kv"))
    fp8 = next(f for f in p.formats if f.format == "fp8")
    batch = min(128, fp8.max_sequences[8192])
    expected = (p.weights["per_gpu_gib"] * GIB + batch * 8192 * fp8.bytes_per_token_per_gpu) / 3350e9 * 1e3
    assert fp8.decode_step_ms[8192] == pytest.approx(expected)


def test_advice_is_labelled_heuristic_without_probe(tmp_path) -> None:  # noqa: ANN001
    p = plan(load_recipe("llama70b_fp8kv"), probe_dir=tmp_path)
    assert p.advice_basis.startswith("heuristic")
    assert any("FP8" in a for a in p.advice)


def test_layers_kept_in_16_bit_are_planned_per_layer_and_deploy_only_with_vllm() -> None:
    from trtkv.backends import vllm
    from trtkv.errors import RecipeError
    from trtkv.memory import Architecture, per_gpu_bytes_per_token, plan

    recipe = load_recipe("smollm2_fp8kv_vllm", ["quantization.kv_skip_layers=[29,0]"])
    assert recipe.quantization.kv_skip_layers == [0, 29] and recipe.kv_format_label == "fp8+bf16[0,29]"
    p = plan(recipe)
    row = next(f for f in p.formats if f.format == "fp8+bf16[0,29]")
    assert p.recipe_kv_format == "fp8+bf16[0,29]" and row.bytes_per_token == 28 * 384 + 2 * 768 == 12288
    args = vllm.server_args(recipe, Path("/m"), "127.0.0.1")
    assert args[args.index("--kv-cache-dtype-skip-layers"):][:3] == ["--kv-cache-dtype-skip-layers", "0", "29"]
    arch = Architecture(num_layers=4, num_attention_heads=4, num_kv_heads=2, head_dim=64, hidden_size=256)
    # PP2: stage 0 holds layers 0-1 (layer 0 in bf16), stage 1 layers 2-3: the fuller stage counts
    assert per_gpu_bytes_per_token(arch, KVFormat.FP8, 1, 2, (0,)) == 2 * 2 * 64 * (1 * 1 + 1 * 2)
    for name, extra, message in [
        ("smollm2_fp8kv_vllm", ["quantization.kv_skip_layers=[0,30]"], r"layers \[30\] do not exist"),
        ("smollm2_fp8kv_vllm", ["quantization.kv_skip_layers=[1,1]"], "layers listed twice"),
        ("smollm2_fp8kv_vllm", ["quantization.kv_cache=none", "quantization.kv_skip_layers=[0]"],
         "need a quantized KV cache"),
        ("smollm2_fp8kv", ["quantization.kv_skip_layers=[0]"], "deploys with build.backend vllm"),
        ("llama70b_fp8kv_llmapi", ["quantization.kv_skip_layers=[0]"], "TensorRT-LLM's LLM API stores every layer"),
    ]:
        with pytest.raises(RecipeError, match=message):
            load_recipe(name, extra)
