"""SGLang's memory, whole: its KV-pool rule, the knobs the served command carries
(`--mem-fraction-static` from triton.mem_fraction_static, always passed with SGLang 0.5.23's
computed default resolved here: python/sglang/srt/arg_groups/memory_hook.py; `--max-total-tokens`
caps the pool from triton.kv_pool_gib_per_gpu), and the pool a running server reports
(/get_server_info's max_total_num_tokens).

SGLang 0.5.23 (python/sglang/srt/mem_cache/kv_cache_configurator.py `_profile_available_bytes`): the
pool gets what is free after loading minus `pre_model_load_memory x (1 - mem_fraction_static)`,
where `pre_model_load_memory` is what was free before loading (distributed/bootstrap.py
`measure_pre_model_load_memory`, after the CUDA context and torch.distributed/NCCL init). So pool =
free before loading x mem_fraction_static - what loading took. Tokens are whole cells (one token per
slot at page_size 1, pool_configurator.py `_compute_cell_size`); `--max-total-tokens` caps them.
"""

from __future__ import annotations

from typing import Any

from trtkv.core.readback import MAX_POOL_TOKENS, whole
from trtkv.engines.activation import ModelShape, Setup
from trtkv.engines.pool import (
    BatchLimit,
    EngineKnobs,
    EngineTokens,
    PoolEstimate,
    Sizing,
    Term,
    TokenFacts,
    apply_bound,
    context_bytes,
)
from trtkv.engines.sizing import cap_tokens, gpu_memory_mib
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import Recipe

SGLANG_VERSION = "0.5.23"
SGLANG_INFO = "SGLang /get_server_info"


SGLANG_SOURCE = (
    "sglang 0.5.23: python/sglang/srt/mem_cache/kv_cache_configurator.py _profile_available_bytes "
    "(rest = free after loading - pre_model_load_memory x (1 - mem_fraction_static)); "
    "distributed/bootstrap.py measure_pre_model_load_memory; arg_groups/memory_hook.py "
    "handle_gpu_memory_settings (the default fraction)"
)


def sglang_pool(
    setup: Setup,
    version: str,
    mem_fraction_static: float,
    *,
    fraction_is_default: bool,
    max_total_tokens: int | None = None,
) -> PoolEstimate:
    """SGLang's pool on one GPU: free before loading x mem_fraction_static - weights, in whole
    tokens."""
    pre_load = setup.gpu_total_bytes - context_bytes(setup)
    budget = pre_load * mem_fraction_static
    available = budget - setup.weights_bytes
    terms = (
        Term(
            "context",
            context_bytes(setup),
            "CUDA context, torch and NCCL init before loading (free before "
            "loading = total - this; SGLang: 'Load weight begin. avail mem')",
        ),
        Term(
            "weights",
            setup.weights_bytes,
            "what loading took (SGLang: 'Load weight end ... mem usage')",
        ),
        Term(
            "reserve",
            pre_load * (1 - mem_fraction_static),
            "free before loading x (1 - mem_fraction_static): left for activations and CUDA graphs",
        ),
    )
    est = PoolEstimate(
        "sglang",
        version,
        "SGLang: free before loading x mem_fraction_static - weights",
        SGLANG_SOURCE,
        "--mem-fraction-static",
        mem_fraction_static,
        fraction_is_default,
        budget,
        terms,
        available,
        available,
    )
    cap = None if max_total_tokens is None else max_total_tokens * setup.kv_bytes_per_token
    return apply_bound(est, cap, False, setup.kv_bytes_per_token * max(1, setup.tokens_per_block))


def sglang_recipe_pool(recipe: Recipe, sizing: Sizing, knobs: EngineKnobs) -> PoolEstimate:
    return sglang_pool(
        sizing.setup,
        SGLANG_VERSION,
        float(knobs.value or 0),
        fraction_is_default=knobs.is_default,
        max_total_tokens=knobs.cap_value,
    )


def sglang_at(
    shape: ModelShape, setup: Setup, version: str, knob: float, cap: int | None
) -> PoolEstimate:
    return sglang_pool(setup, version, knob, fraction_is_default=False, max_total_tokens=cap)


def sglang_prefill_graph_sizes(max_bs: int) -> list[int]:
    """SGLang's prefill CUDA-graph token buckets (arg_groups/cuda_graph_hook.py
    generate_prefill_cuda_graph_batch_sizes, sglang 0.5.23)."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_bs + 1, 512),
    ]
    return [s for s in sizes if s <= max_bs]


def sglang_default_chunk(gpu_mem_mib: float) -> int:
    """SGLang 0.5.23's default chunked_prefill_size by GPU memory (arg_groups/memory_hook.py
    handle_gpu_memory_settings): 2,048 tokens under 20 GiB (T4, RTX 4080), 4,096 under 60 GiB (A10,
    L4, RTX 4090, A100-40GB, L40S), 8,192 under 160 GiB (H100, H200), 16,384 above (B200). SGLang
    reads the memory from nvidia-smi, a few tenths of a GiB above the CUDA total trtkv's GPU table
    holds: no GPU of the table lies that close to a boundary."""
    if gpu_mem_mib < 20 * 1024:
        return 2048
    if gpu_mem_mib < 60 * 1024:
        return 4096
    if gpu_mem_mib < 160 * 1024:
        return 8192
    return 16384


def sglang_init_step(gpu: GPU) -> tuple[int, str]:
    """build.max_num_tokens `trtkv init` writes for SGLang, and why: its own chunked_prefill_size
    default on the GPU's memory (trtkv's SGLang command passes it as --chunked-prefill-size, and
    plans the fraction with it)."""
    gib = GPU_SPECS[gpu].memory_gib
    return sglang_default_chunk(gib * 1024), (
        f"SGLang {SGLANG_VERSION}'s chunked_prefill_size on a {gib:g} GiB GPU "
        "(memory_hook.py), passed as --chunked-prefill-size"
    )


def sglang_decode_graph_max_bs(gpu_mem_mib: float, tp: int) -> int:
    """SGLang 0.5.23's default decode CUDA-graph max batch size by GPU memory (memory_hook.py)."""
    if gpu_mem_mib < 20 * 1024:
        return 8
    if gpu_mem_mib < 35 * 1024:
        return 48 if tp < 4 else 160
    if gpu_mem_mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if gpu_mem_mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def sglang_default_mem_fraction(
    gpu_mem_mib: float,
    tp: int,
    pp: int,
    chunked_prefill_size: int,
    max_running_requests: int | None,
    max_prefill_tokens: int = 16384,
) -> float:
    """SGLang 0.5.23's computed default mem_fraction_static (arg_groups/memory_hook.py
    handle_gpu_memory_settings) on CUDA for a text model without DP attention, DeepEP or
    disaggregation (trtkv serves no other kind): reserved MiB = 512 + 1.5 x max(chunk, 2048) + tp x
    pp / 8 x 1024 + 2 x the decode graphs' max batch + 8 per prefill graph bucket (breakable prefill
    graphs, the CUDA default), at least 10 GiB above 60 GiB of memory; fraction = round((gpu -
    reserved) / gpu, 3). A chunk of -1 (chunked prefill off) takes max_prefill_tokens and captures
    no prefill graph."""
    max_bs = sglang_decode_graph_max_bs(gpu_mem_mib, tp)
    if max_running_requests is not None:
        max_bs = min(max_bs, max_running_requests)
    activation_tokens = max(
        chunked_prefill_size if chunked_prefill_size > 0 else max_prefill_tokens, 2048
    )
    prefill_graphs = (
        len(sglang_prefill_graph_sizes(chunked_prefill_size)) if chunked_prefill_size > 0 else 0
    )
    reserved = 512 + activation_tokens * 1.5 + tp * pp / 8 * 1024 + max_bs * 2 + prefill_graphs * 8
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def sglang_chunk(recipe: Recipe) -> int:
    """--chunked-prefill-size as trtkv's SGLang command passes it: build.max_num_tokens, always. A
    prompt within it is never chunked; -1 (chunking off) would make SGLang size its reserve and its
    prefill batches for max_prefill_tokens (16,384) instead of the recipe's value, which on a 24 GB
    card leaves no fraction at all."""
    return recipe.build.max_num_tokens


def sglang_knobs(recipe: Recipe) -> EngineKnobs:
    """SGLang: --mem-fraction-static always (SGLang 0.5.23's computed default resolved here),
    --max-total-tokens when triton.kv_pool_gib_per_gpu caps the pool."""
    b, msf = recipe.build, recipe.triton.mem_fraction_static
    value = (
        msf
        if msf is not None
        else sglang_default_mem_fraction(
            gpu_memory_mib(recipe), b.tp_size, b.pp_size, sglang_chunk(recipe), b.max_batch_size
        )
    )
    cap = cap_tokens(recipe)
    return EngineKnobs(
        "--mem-fraction-static",
        value,
        msf is None,
        "--max-total-tokens" if cap is not None else None,
        cap,
    )


def sglang_batch_limit(recipe: Recipe, pool_tokens: int) -> BatchLimit:
    """SGLang's own max_running_requests where the command leaves it unset (sglang 0.5.23
    mem_cache/kv_cache_configurator.py resolve_max_num_reqs, one DP worker): pool tokens /
    context_len x 512 held within [2048, 4096], at most half the pool's tokens."""
    estimated = max(min(int(pool_tokens / recipe.build.max_seq_len * 512), 4096), 2048)
    return BatchLimit(
        "--max-running-requests",
        max(1, min(estimated, pool_tokens // 2)),
        "sglang 0.5.23 python/sglang/srt/mem_cache/kv_cache_configurator.py resolve_max_num_reqs: "
        "min(clamp(pool tokens / context_len x 512, 2048, 4096), pool tokens // 2)",
    )


# Models SGLang 0.5.23 gives its hybrid SWA pool (python/sglang/srt/configs/model_config.py
# is_hybrid_swa_model: GptOssForCausalLM, Llama4ForConditionalGeneration, Gemma4*, ...), by config
# model_type; the SWA layers keep swa_full_tokens_ratio (default 0.8, arg_groups/fields/schedule.py)
# tokens per full-layer token. Every other model's sliding layers get a full pool (Gemma 2/3 have
# disable_hybrid_swa_memory).
SGLANG_HYBRID_SWA_TYPES = frozenset({"gpt_oss", "llama4", "llama4_text", "gemma4", "gemma4_text"})
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8


def sglang_token_unit(facts: TokenFacts) -> EngineTokens:
    """What one of SGLang's max_total_num_tokens holds: with the hybrid SWA pool, a full-layer token
    plus 0.8 of an SWA-layer token (model_executor/pool_configurator.py
    HybridSWAPoolConfigurator._recompute_cell_size: full cell + swa_full_tokens_ratio x swa cell);
    otherwise a token in every layer (_compute_cell_size)."""
    if facts.model_type in SGLANG_HYBRID_SWA_TYPES and facts.full_layers_bytes:
        swa = facts.every_layer_bytes - facts.full_layers_bytes
        return EngineTokens(
            facts.full_layers_bytes + SGLANG_SWA_FULL_TOKENS_RATIO * swa,
            f"SGLang {SGLANG_VERSION} hybrid SWA pool: max_total_num_tokens counts full-layer "
            f"tokens, each with {SGLANG_SWA_FULL_TOKENS_RATIO:g} of an SWA-layer token "
            "(pool_configurator.py HybridSWAPoolConfigurator, swa_full_tokens_ratio)",
        )
    return EngineTokens(
        facts.every_layer_bytes,
        f"SGLang {SGLANG_VERSION}: max_total_num_tokens counts a token in every layer "
        "(pool_configurator.py _compute_cell_size; no hybrid SWA pool for this model type)",
    )


def sglang_info_tokens(info: dict[str, Any]) -> int | None:
    """max_total_num_tokens from SGLang's /get_server_info (top level, or its scheduler's
    internal_states); None when absent, ReadBackError when not a whole number in range."""
    value = info.get("max_total_num_tokens")
    states = info.get("internal_states")
    if value is None and isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("max_total_num_tokens")
    if value is None:
        return None
    return whole(value, SGLANG_INFO, "max_total_num_tokens", MAX_POOL_TOKENS)
