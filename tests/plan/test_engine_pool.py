"""The KV pool the planner sizes is the one the served command asks for: each backend's memory flags (resolved
defaults, caps and pins) reach its command, the plan reports the rule and bound it followed, and the read-back of a
running engine's pool (trtkv.serving.pool) parses each engine's own figure and warns when it falls short."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trtkv.backends import for_recipe, llmapi_args, sglang, vllm_command
from trtkv.core.errors import RecipeError
from trtkv.engines.pool import ServedPool
from trtkv.engines.reference import REFERENCE_POOL_LINE, reference_log_pool
from trtkv.engines.sglang import SGLANG_VERSION, sglang_default_mem_fraction, sglang_info_tokens
from trtkv.engines.sizing import kv_bytes_per_token_per_gpu
from trtkv.engines.trtllm import trtllm_log_pool
from trtkv.engines.vllm import VLLM_DEFAULT_UTIL, cpu_pin_bytes, vllm_log_tokens, vllm_metrics_blocks
from trtkv.plan import figures
from trtkv.plan.planner import plan
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import load_recipe

GIB = 1024**3
HF = Path("/hf")


def test_vllm_carries_its_utilization_and_a_pin() -> None:
    recipe = load_recipe("llama70b_fp8kv", ["build.backend=vllm"])
    args = vllm_command.server_args(recipe, HF, "0.0.0.0")
    assert args[args.index("--gpu-memory-utilization") + 1] == f"{VLLM_DEFAULT_UTIL:g}"
    assert "--kv-cache-memory-bytes" not in args
    p = plan(recipe)
    assert (p.kv_pool.engine, p.kv_pool.bound, p.kv_pool.knob_is_default) == ("vllm", "rule", True)
    assert {t.name for t in p.kv_pool.terms} == {"weights", "activation", "non_torch", "cuda_graphs"}
    pinned = load_recipe("llama70b_fp8kv", ["build.backend=vllm", "triton.kv_pool_gib_per_gpu=10",
                                            "triton.gpu_memory_utilization=0.8"])
    args = vllm_command.server_args(pinned, HF, "0.0.0.0")
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(10 * GIB)
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.8"
    q = plan(pinned)
    block = 16 * kv_bytes_per_token_per_gpu(pinned)  # vLLM's GPU block of 16 tokens
    assert q.kv_pool.bound == "pin" and 10 * GIB - block < q.kv_pool_bytes_per_gpu <= 10 * GIB
    assert q.kv_pool.knob_value == 0.8 and not q.kv_pool.knob_is_default


def test_vllm_on_the_cpu_pins_max_batch_size_sequences() -> None:
    recipe = load_recipe("smollm2_fp8kv_vllm")
    args = vllm_command.cpu_command(recipe, HF)
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(cpu_pin_bytes(recipe))
    assert vllm_command.cpu_env(recipe) == {}  # no legacy VLLM_CPU_KVCACHE_SPACE
    p = plan(recipe)
    assert (p.kv_pool.engine, p.kv_pool.bound) == ("vllm-cpu", "pin")
    assert p.kv_pool_bytes_per_gpu == pytest.approx(cpu_pin_bytes(recipe), abs=128 * kv_bytes_per_token_per_gpu(recipe))


def test_sglang_carries_its_computed_default_and_a_cap() -> None:
    recipe = load_recipe("llama70b_fp8kv_sglang")
    args = sglang.server_args(recipe, HF, "0.0.0.0")
    value = float(args[args.index("--mem-fraction-static") + 1])
    b = recipe.build
    # SGLang 0.5.23's default for 4 x H100 (the memory CUDA reports, trtkv's GPU table), chunked prefill 8192, 64
    # running requests
    memory_mib = GPU_SPECS[GPU.H100_80GB].memory_gib * 1024
    assert value == sglang_default_mem_fraction(memory_mib, 4, 1, 8192, b.max_batch_size)
    p = plan(recipe)
    assert (p.kv_pool.engine, p.kv_pool.version, p.kv_pool.knob_value) == ("sglang", SGLANG_VERSION, value)
    capped = load_recipe("llama70b_fp8kv_sglang", ["triton.kv_pool_gib_per_gpu=4"])
    args = sglang.server_args(capped, HF, "0.0.0.0")
    tokens = int(args[args.index("--max-total-tokens") + 1])
    assert tokens == 4 * GIB // kv_bytes_per_token_per_gpu(capped)
    q = plan(capped)
    assert q.kv_pool.bound == "cap" and q.kv_pool_bytes_per_gpu == tokens * kv_bytes_per_token_per_gpu(capped)
    assert next(f for f in q.formats if f.format == q.recipe_kv_format).tokens_per_gpu_budget == tokens


def test_llmapi_carries_the_fraction_and_max_tokens() -> None:
    recipe = load_recipe("llama70b_fp8kv_llmapi")
    kv = llmapi_args.llm_args(recipe, HF)["kv_cache_config"]
    assert kv["free_gpu_memory_fraction"] == 0.9 and "max_tokens" not in kv
    assert plan(recipe).kv_pool.engine == "trtllm"
    capped = load_recipe("llama70b_fp8kv_llmapi", ["triton.kv_pool_gib_per_gpu=2",
                                                   "triton.kv_cache_free_gpu_mem_fraction=0.8"])
    kv = llmapi_args.llm_args(capped, HF)["kv_cache_config"]
    assert kv["free_gpu_memory_fraction"] == 0.8 and kv["max_tokens"] == 2 * GIB // kv_bytes_per_token_per_gpu(capped)


@pytest.mark.parametrize("recipe, override, message", [
    ("llama70b_fp8kv", "triton.mem_fraction_static=0.8", "read only by sglang"),
    ("llama70b_fp8kv_sglang", "triton.gpu_memory_utilization=0.8", "read only by vllm"),
    ("smollm2_fp8kv_vllm", "triton.kv_cache_free_gpu_mem_fraction=0.5", "read only by llmapi, tensorrt"),
    ("smollm2_fp8kv", "triton.kv_pool_gib_per_gpu=1", "reference runtime holds max_batch_size sequences"),
    ("llama70b_fp8kv", "hardware.activation_reserve_gib=2", "no longer used"),
])
def test_a_knob_the_engine_ignores_is_refused(recipe: str, override: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        load_recipe(recipe, [override])


def test_plan_json_gives_the_pool_beside_the_counts() -> None:
    p = plan(load_recipe("llama70b_fp8kv"))
    data = json.loads(p.to_json())
    assert data["kv_pool_bytes_per_gpu"] == data["kv_pool"]["pool_bytes"] == p.kv_pool.pool_bytes
    assert data["kv_budget_gib_per_gpu"] == pytest.approx(data["kv_pool_bytes_per_gpu"] / GIB)
    fp8 = next(f for f in data["formats"] if f["format"] == "fp8")
    assert fp8["tokens_per_gpu_budget"] == math.floor(data["kv_pool_bytes_per_gpu"] / fp8["bytes_per_token_per_gpu"])
    assert data["kv_pool"]["engine"] == "tensorrt" and data["kv_pool"]["knob"] == "kv_cache_free_gpu_mem_fraction"
    assert "activation_reserve_gib" not in data["hardware"]


# --- read-back: each engine's own figure


def test_each_engines_reported_pool_is_parsed() -> None:
    metrics = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
               'vllm:cache_config_info{block_size="128",cache_dtype="fp8",num_cpu_blocks="None",'
               'num_gpu_blocks="728",prefix_caching_hash_algo="sha256"} 1.0\n')
    assert vllm_metrics_blocks(metrics) == (728, 128)
    assert vllm_metrics_blocks("vllm:num_requests_running 0") is None
    assert vllm_log_tokens("INFO [kv_cache_utils.py:1319] GPU KV cache size: 476,016 tokens") == 476016
    assert sglang_info_tokens({"internal_states": [{"max_total_num_tokens": 46611}]}) == 46611
    assert sglang_info_tokens({"max_total_num_tokens": 392920}) == 392920
    # tests/data/kv_pool_logs.json's TensorRT-LLM line
    line = "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 16.05 GiB for max tokens in paged KV cache (263008)."
    assert trtllm_log_pool(line) == (16.05 * GIB, 263008)
    ref = REFERENCE_POOL_LINE.format(bytes=4 * 8192 * 11520, batch=4, seq=8192, per_token=11520)
    assert reference_log_pool(f"I0101 model.py:80] {ref}") == (4 * 8192 * 11520, 4 * 8192)


def _with_served(monkeypatch: pytest.MonkeyPatch, recipe: Any, served: ServedPool | None) -> None:
    import trtkv.backends as backends

    backend = for_recipe(recipe)
    fake = replace(backend, memory=replace(backend.memory, served=lambda r, http, log: served))
    monkeypatch.setattr(backends, "for_recipe", lambda r: fake)


def test_a_served_pool_short_of_the_plan_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.serving import pool

    recipe = load_recipe("llama70b_fp8kv_sglang")
    planned = plan(recipe).kv_pool_bytes_per_gpu
    server = SimpleNamespace(client_host="127.0.0.1", http_port=1, log=None)
    _with_served(monkeypatch, recipe, ServedPool(planned * 0.95, None, "engine"))
    ok = pool.compare(recipe, server, figures(recipe))  # type: ignore[arg-type]
    assert ok["warning"] is None and ok["served_over_planned"] == pytest.approx(0.95)
    _with_served(monkeypatch, recipe, ServedPool(planned * 0.85, None, "engine"))
    short = pool.compare(recipe, server, figures(recipe))  # type: ignore[arg-type]
    assert "15% below the plan" in short["warning"] and "WARNING" in pool.describe(short)
    _with_served(monkeypatch, recipe, None)
    assert pool.compare(recipe, server, figures(recipe))["served_bytes_per_gpu"] is None  # type: ignore[arg-type]
    assert pool.compare(recipe, None, figures(recipe))["source"] == "no server recorded"
