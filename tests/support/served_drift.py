"""How far a served engine's decode and prefill may part (mean |delta log p| over the decoded tokens) when both read the
same KV cache into 16/32-bit attention (vLLM CPU: its prefill and its decode both go through
cpu_attention_with_kv_cache over the cache, FP8 dequantized at the load), and what the served engine says its cache
and model dtypes are. The bound follows from those dtypes, read back from the server, not from the CPU the test once
ran on (issue 58: an AVX-512 CPU keeps the recipe's FP8 cache where an AVX2 one serves 16-bit).

Why FP8 moves it and by how much. The two passes compute each K/V element as x and x(1 + d), d the 16-bit kernels'
own rounding difference (GEMM against GEMV, accumulation order), of the order of the model dtype's relative step u
(bf16: 2^-7). A 16-bit cache stores both as they are: the drift is that noise carried through 30 layers, bounded by
SIXTEEN_BIT_BOUND. A cache of relative step s (E4M3: 3 mantissa bits, s = 2^-3 at a normal value) stores the same
code for both unless a rounding boundary lies between x and x(1 + d): with probability |d|/s, and then the two
differ by one whole step s.x. The mean change per element is unchanged (|d|/s x s = |d|), its mean square grows from
d^2 to |d|.s; the log-prob drift is a sum of many such contributions of either sign, so it scales with their root
mean square: by sqrt(s/|d|) = sqrt(s/u). From bf16's step, the coarsest 16-bit model dtype (fp16 and fp32 have finer
steps, so fewer boundary crossings): x sqrt(2^-3/2^-7) = x4 for E4M3, x sqrt(2^-2/2^-7) = x5.7 for E5M2. Measured on
an AVX-512 CPU with the FP8 cache: 0.064 (issue 58), against 0.2 allowed; on an AVX2 CPU (16-bit cache, bf16 model)
the two passes agree exactly (0.00000 over 24 tokens), so d, and the FP8 cache's flips with it, come from the
AVX-512 kernels; the 16-bit drift there is not measured here.

What it still catches: a drift the format does not allow, e.g. a k/v scale so large that K/V fall among E4M3's
subnormals (a coarser relative step there: more and bigger code flips), or one pass reading a different cache than
the other. An FP8-attention drift (P or Q requantized on one side, every element, ~0.13 mean on SmolLM2 in
docs/probe.md) is caught by the 16-bit bound; under an FP8 cache it is within the allowance of that cache's own
code flips (a full rounding of every element has mean square s^2/12, only 2.7 x the flips' |d|.s at d = 2^-8)."""

from __future__ import annotations

import math
import re

from trtkv.core.errors import TrtkvError

# relative step between neighbouring values at a normal value: 2^-(mantissa bits)
STEP = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10, "fp8_e4m3": 2.0**-3, "fp8_e5m2": 2.0**-2}
# vLLM's --kv-cache-dtype values (vllm/config/cache.py): fp8 is E4M3 (the OCP format); auto is the model dtype
VLLM_CACHE = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
# two passes whose K/V differ by 16-bit kernels' rounding only (the cache as wide as the model): the bound the test
# held before issue 58 for SmolLM2's decoded tokens after 200-token prompts; an FP8-attention drift (~0.13,
# docs/probe.md) fails it
SIXTEEN_BIT_BOUND = 0.05
COARSEST_MODEL = "bfloat16"

_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_ENGINE_DTYPE = re.compile(r"\bdtype=torch\.(\w+)")


def vllm_served_cache_dtype(metrics: str) -> str | None:
    """The cache_dtype label of vLLM's /metrics vllm:cache_config_info gauge (its CacheConfig as the engine runs it),
    or None where the gauge is absent."""
    found = _CACHE_INFO.search(metrics)
    return dict(_LABEL.findall(found.group("labels"))).get("cache_dtype") if found else None


def vllm_served_model_dtype(log: str) -> str | None:
    """The model dtype of vLLM's 'Initializing a V1 LLM engine ... dtype=torch.X' start-up line (the last one)."""
    found = _ENGINE_DTYPE.findall(log)
    return found[-1] if found else None


def drift_bound(cache_dtype: str, model_dtype: str) -> float:
    """The largest mean |delta log p| between decode and prefill that a cache of `cache_dtype` (vLLM's value) under a
    model computed in `model_dtype` allows (the module's docstring says why)."""
    if model_dtype not in STEP or STEP[model_dtype] > STEP[COARSEST_MODEL]:
        raise TrtkvError(f"served model dtype {model_dtype!r}: a bound is derived for float32, bfloat16 and float16")
    if cache_dtype in ("auto", model_dtype):
        return SIXTEEN_BIT_BOUND
    fmt = VLLM_CACHE.get(cache_dtype)
    if fmt is None:
        raise TrtkvError(f"served cache dtype {cache_dtype!r}: a bound is derived for auto, {', '.join(VLLM_CACHE)}")
    return SIXTEEN_BIT_BOUND * math.sqrt(STEP[fmt] / STEP[COARSEST_MODEL])
