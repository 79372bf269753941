"""Per-token figures of sliding and hybrid models as each engine counts tokens (issue #52), beside the exact account.

gpt-oss keeps half its layers at a 128-token window: a token beyond the window grows the cache by the 18 full
layers only, while the exact account's B/token counts all 36. The plan's engine columns give the token each engine
prints: vLLM 0.32.0's 'GPU KV cache size' (max concurrency at max_model_len x max_model_len), SGLang 0.5.23's
max_total_num_tokens (its hybrid SWA pool), TensorRT-LLM's max tokens (every layer). They are held to the published
vLLM log of gpt-oss-120b in tests/data/kv_pool_logs.json, and to the engines' code where no log prints them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from trtkv.plan.planner import plan
from trtkv.recipe import load_recipe
from trtkv.recipe.attention import VLLM_BLOCK_GPU
from trtkv.units import GIB

DATA = Path(__file__).resolve().parents[1] / "data"
LOG = next(r for r in json.loads((DATA / "kv_pool_logs.json").read_text())["logs"]
           if r["id"] == "dennis-0.10-gpt-oss-120b-tp4")
# gpt-oss-120b: 36 layers alternating a 128-token window and full attention, 8 KV heads x head_dim 64
LAYERS, FULL_LAYERS, PER_LAYER_BF16 = 36, 18, 2 * 8 * 64 * 2


def _recipe(tmp_path: Path, backend: str, config: str = "gpt_oss_120b", **build: Any):
    doc = {"model": {"source": str(DATA / "configs" / config), "dtype": "bfloat16"},
           "quantization": {"weights": "none", "kv_cache": "none"},
           "build": {"backend": backend, "tp_size": 1, "pp_size": 1, "max_batch_size": 64,
                     "max_num_tokens": 8192, "max_input_len": 8192, "max_seq_len": 131072, **build},
           "hardware": {"gpu": "H200-141GB", "count": build.get("tp_size", 1)}}
    path = tmp_path / f"{backend}_{config}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_recipe(path)


def _row(p, fmt: str = "fp16"):
    return next(c for c in p.formats if c.format == fmt)


def test_the_published_vllm_log_of_gpt_oss_120b_in_both_token_units(tmp_path: Path) -> None:
    """vLLM 0.10.1.1 on 4 x A100 (max_model_len 16,384, max_num_batched_tokens 2,048) printed 45.32 GiB, 'GPU KV
    cache size: 2,640,144 tokens' and 'Maximum concurrency for 16,384 tokens per request: 284.25x'. With that pool:
    - the exact account's every-layer token (36 layers x 2 KV heads per GPU x 64 x 2 x 2 bytes = 18,432 B) gives the
      2,640,144 tokens 0.10.1.1 printed (num_blocks // 2 groups x 16: every layer counted);
    - vLLM's allocation of one 16,384-token sequence (1,024 full-group blocks + 137 sliding-group blocks, each block
      16 tokens of 18 layers) gives the 284.25x concurrency, and 0.32.0's token (that sequence / 16,384) the
      284.25 x 16,384 tokens 0.32.0 prints for the same pool.
    The tolerances are the rounding of the printed figures (45.32 GiB to 0.005 GiB, 284.25 to 0.005)."""
    recipe = _recipe(tmp_path, "vllm", tp_size=4, max_seq_len=16384, max_num_tokens=2048, max_input_len=2048,
                     max_batch_size=256)
    p = plan(recipe)
    row = _row(p)
    printed = LOG["printed"]
    pool = printed["kv_gib"] * GIB
    pool_slack = 0.005 / printed["kv_gib"]
    assert row.bytes_per_token_per_gpu == LAYERS * PER_LAYER_BF16 / 4 == 18432
    exact_tokens = pool / row.bytes_per_token_per_gpu
    assert abs(exact_tokens - printed["kv_tokens"]) <= pool_slack * exact_tokens + VLLM_BLOCK_GPU
    per_sequence = row.per_sequence_kv_bytes_by_accounting["vllm"][16384] / 4  # one GPU of TP4
    block = VLLM_BLOCK_GPU * FULL_LAYERS * PER_LAYER_BF16 / 4  # one block id: 16 tokens of a group's 18 layers
    assert per_sequence / block == 1024 + 137  # cdiv(16384, 16) + cdiv(128 - 1 + 2048, 16) + 1
    concurrency = pool / per_sequence
    assert abs(concurrency - printed["max_concurrency"]) <= 0.005 + pool_slack * concurrency
    engine_tokens = pool / row.engine_bytes_per_token_per_gpu
    vllm_032 = printed["max_concurrency"] * 16384
    assert abs(engine_tokens - vllm_032) <= (0.005 / printed["max_concurrency"] + pool_slack) * vllm_032
    assert "get_kv_cache_capacity" in p.engine_token_rule


def test_vllm_counts_a_gpt_oss_token_at_about_half_the_exact_bytes(tmp_path: Path) -> None:
    """At max_seq_len 131,072 a vLLM token of gpt-oss-120b holds the 18 full layers plus the sliding group's fixed
    blocks spread over the sequence: 36,864 B and a little, not the exact account's 73,728; its token count is
    about twice the exact one. The other per-token columns are unchanged (the exact account)."""
    p = plan(_recipe(tmp_path, "vllm"))
    row = _row(p)
    assert row.bytes_per_token == row.bytes_per_token_per_gpu == LAYERS * PER_LAYER_BF16 == 73728
    sliding_share = (-(-(128 - 1 + 8192) // 16) + 1) * 16 / 131072  # the sliding group's blocks per token
    expected = FULL_LAYERS * PER_LAYER_BF16 * (1 + sliding_share)
    assert abs(row.engine_bytes_per_token_per_gpu - expected) <= 1e-6 * expected
    assert 1.8 < row.engine_tokens_per_gpu / row.tokens_per_gpu_budget < 2.0


def test_sglang_counts_full_layer_tokens_with_its_swa_share(tmp_path: Path) -> None:
    """SGLang 0.5.23 gives gpt-oss its hybrid SWA pool: one of max_total_num_tokens is a full-layer token and 0.8 of
    an SWA-layer token (swa_full_tokens_ratio); Gemma 3 is not one of its hybrid SWA models, so its token is every
    layer's."""
    p = plan(_recipe(tmp_path, "sglang"))
    row = _row(p)
    assert row.engine_bytes_per_token_per_gpu == (FULL_LAYERS + 0.8 * (LAYERS - FULL_LAYERS)) * PER_LAYER_BF16
    assert row.engine_tokens_per_gpu == int(p.kv_pool_bytes_per_gpu // row.engine_bytes_per_token_per_gpu)
    assert "swa_full_tokens_ratio" in p.engine_token_rule
    gemma = plan(_recipe(tmp_path, "sglang", "gemma3_27b", max_seq_len=32768, max_input_len=8192))
    g = _row(gemma)
    assert g.engine_bytes_per_token_per_gpu == g.bytes_per_token_per_gpu
    assert g.engine_tokens_per_gpu == g.tokens_per_gpu_budget


def test_tensorrt_llm_counts_a_token_in_every_layer(tmp_path: Path) -> None:
    """TensorRT-LLM's max tokens divide by every attention layer's bytes (KVCacheManager.get_cache_size_per_token has
    no window): its token is the exact account's."""
    p = plan(_recipe(tmp_path, "llmapi"))
    row = _row(p)
    assert row.engine_bytes_per_token_per_gpu == row.bytes_per_token_per_gpu
    assert row.engine_tokens_per_gpu == row.tokens_per_gpu_budget


def test_plan_full_prints_the_engine_columns_for_sliding_models_only(tmp_path: Path,
                                                                    capsys: Any) -> None:
    from trtkv.cli import main

    path = tmp_path / "oss.yaml"
    _recipe(tmp_path, "vllm")
    (tmp_path / "vllm_gpt_oss_120b.yaml").rename(path)
    assert main(["plan", str(path), "--full"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "vllm B/token/GPU vllm tokens/GPU" in out and "count it as the engine does" in out
    dense = tmp_path / "dense.yaml"
    _recipe(tmp_path, "vllm", "qwen3_32b", max_seq_len=32768)
    (tmp_path / "vllm_qwen3_32b.yaml").rename(dense)
    assert main(["plan", str(dense), "--full"]) == 0
    assert "vllm tokens/GPU" not in capsys.readouterr().out
