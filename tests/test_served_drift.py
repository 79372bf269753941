"""tests/support/served_drift.py: the served prefill-vs-decode bound follows from the cache and model dtypes the
server reports, and its FP8 factor from E4M3's real rounding (issue 58)."""

from __future__ import annotations

import math

import pytest

from tests.support.served_drift import (
    SIXTEEN_BIT_BOUND,
    drift_bound,
    vllm_served_cache_dtype,
    vllm_served_model_dtype,
)
from trtkv.core.errors import TrtkvError

METRICS = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
           'vllm:cache_config_info{block_size="128",cache_dtype="%s",num_cpu_blocks="None",'
           'num_gpu_blocks="728",prefix_caching_hash_algo="sha256"} 1.0\n')
START = ("INFO 12-06 10:00:00 [core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: model='/e/hf', "
         "speculative_config=None, tokenizer='/e/hf', skip_tokenizer_init=False, dtype=torch.bfloat16, "
         "max_seq_len=2048, quantization=modelopt, enforce_eager=False, kv_cache_dtype=fp8, device_config=cpu")


def test_the_served_dtypes_are_read_back() -> None:
    assert vllm_served_cache_dtype(METRICS % "fp8") == "fp8"
    assert vllm_served_cache_dtype(METRICS % "auto") == "auto"
    assert vllm_served_cache_dtype("vllm:num_requests_running 0") is None
    assert vllm_served_model_dtype(START) == "bfloat16"
    assert vllm_served_model_dtype("no engine line") is None


def test_the_bound_follows_the_served_cache_not_the_cpu() -> None:
    for model in ("bfloat16", "float16", "float32"):  # the 16-bit fallback (an AVX2 CPU) and the FP8 cache (AVX-512)
        assert drift_bound("auto", model) == SIXTEEN_BIT_BOUND
        assert drift_bound("fp8", model) == pytest.approx(SIXTEEN_BIT_BOUND * 4)  # sqrt(2^-3 / 2^-7)
        assert drift_bound("fp8_e4m3", model) == drift_bound("fp8", model)
        assert drift_bound("fp8_e5m2", model) == pytest.approx(SIXTEEN_BIT_BOUND * math.sqrt(32))
    assert drift_bound("bfloat16", "bfloat16") == SIXTEEN_BIT_BOUND
    # issue 58's AVX-512 run: the FP8 cache's 0.06398 is within what E4M3 allows, not within the 16-bit bound
    assert drift_bound("auto", "bfloat16") < 0.06398 < drift_bound("fp8", "bfloat16")
    for cache, model in (("int8_per_token_head", "bfloat16"), ("fp8", "float8_e4m3fn")):
        with pytest.raises(TrtkvError, match="a bound is derived for"):
            drift_bound(cache, model)


def _flip_ratio(scale_error: float) -> float:
    """RMS change of E4M3 codes (at a static scale amax/448 x scale_error) between two bf16 copies of the same values
    that differ by bf16's own rounding, over the RMS of that bf16 difference."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(400_000, generator=g, dtype=torch.float64)
    a = x.to(torch.bfloat16).double()
    b = (x + torch.randn(400_000, generator=g, dtype=torch.float64) * x.abs() * 2.0**-9).to(torch.bfloat16).double()
    moved = a != b  # the two passes' K/V elements that 16-bit rounding set apart
    scale = float(x.abs().max()) / 448 * scale_error

    def e4m3(v: torch.Tensor) -> torch.Tensor:
        return (v / scale).to(torch.float8_e4m3fn).double() * scale

    a, b = a[moved], b[moved]
    return float(((e4m3(a) - e4m3(b)) ** 2).mean().sqrt() / ((a - b) ** 2).mean().sqrt())


def test_e4m3_code_flips_give_the_bounds_factor_and_a_wrong_scale_exceeds_it() -> None:
    """The derivation's core, with torch's E4M3 cast: where bf16 rounding sets two copies apart, their E4M3 codes
    differ by sqrt(2^-3 / 2^-7) = 4 times as much in root mean square; a scale 2^16 too large (K/V all among E4M3's
    subnormals) moves them far more, a drift the bound refuses."""
    right = _flip_ratio(1.0)
    assert 3.5 < right < 4.5, right
    wrong = _flip_ratio(2.0**16)
    assert wrong > 3 * right, wrong
