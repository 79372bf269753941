"""TensorRT-LLM's memory, whole: the KV-pool rules of the PyTorch backend / LLM API and of the
engine path, the knobs the served commands carry (kv_cache_config.free_gpu_memory_fraction, or the
engine path's kv_cache_free_gpu_mem_fraction, from triton.kv_cache_free_gpu_mem_fraction, always
passed with the default 0.9 resolved: KvCacheConfig, the C++ kDefaultGpuMemFraction;
kv_cache_config.max_tokens or max_tokens_in_paged_kv_cache cap the pool from
triton.kv_pool_gib_per_gpu), and the pool a running server reports (its "[MemUsageChange] Allocated
X GiB for max tokens in paged KV cache" line).

PyTorch backend / LLM API (tensorrt_llm/_torch/pyexecutor/_util.py `KvCacheCreator.
configure_kv_cache_capacity` and `_cal_max_memory`, NVIDIA/TensorRT-LLM @
0004396720054fd8e205cbf616f21f0b57c6b412; the same formula since the 0.19 `cal_max_tokens`): after a
warm-up of dummy context requests filling max_num_tokens, pool = free_gpu_memory_fraction x (total -
peak + the temporary estimation cache), peak = torch's peak (weights, activation) + the non-torch
memory then held (CUDA context, NCCL, CUDA graphs); `kv_cache_config.max_tokens` caps it ("Both
free_gpu_memory_fraction and max_tokens are set ... The smaller value will be used"); blocks of
tokens_per_block. The peak is measured after the executor's warm-up has captured its decode CUDA
graphs (TorchLlmArgs.cuda_graph_config defaults to CudaGraphConfig() since 1.0; model_engine.warmup
runs in create_py_executor_instance before configure_kv_cache_capacity, and py_executor_creator
releases the graphs only after it, `_release_cuda_graphs`), so they are part of what the log calls
"Memory used outside torch (e.g., NCCL and CUDA graphs)" and come off the pool
(`trtllm_cuda_graph_bytes`).

Engine path (cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp: runtime contexts,
runtime buffers, decoder, then kvCacheManager.cpp `calculateFreeMemBytes`: free x
kv_cache_free_gpu_mem_fraction, logged as "Memory usage when calculating max tokens in paged kv
cache: total: X GiB, available: Y GiB").
"""

from __future__ import annotations

import re

from trtkv.core.readback import MAX_POOL_BYTES, MAX_POOL_TOKENS, real, whole
from trtkv.engines.activation import ModelShape, Setup, forward_peak_bytes
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
from trtkv.engines.sizing import cap_tokens
from trtkv.recipe import Recipe
from trtkv.units import GIB, MIB

TRTLLM_DEFAULT_FRACTION = 0.9


# The LLM API's kv_cache_config fields (trtllm-serve's YAML, the LLM(...) arguments), trtllm-serve's
# own flag for the fraction, and the engine path's tensorrt_llm model parameters (config.pbtxt)
LLMAPI_FRACTION_KEY = "free_gpu_memory_fraction"
LLMAPI_CAP_KEY = "max_tokens"
TRTLLM_SERVE_FRACTION_FLAG = "--kv_cache_free_gpu_memory_fraction"
ENGINE_FRACTION_PARAM = "kv_cache_free_gpu_mem_fraction"
ENGINE_CAP_PARAM = "max_tokens_in_paged_kv_cache"


# max_batch_size where the recipe leaves it unset: the LLM API's BaseLlmArgs.max_batch_size default
# (tensorrt_llm/llmapi/llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412) and trtllm-build's
# (--max_batch_size defaults to BuildConfig.max_batch_size, tensorrt_llm/builder.py @
# 008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc)
TRTLLM_MAX_BATCH = 2048


def llmapi_batch_limit(recipe: Recipe, pool_tokens: int) -> BatchLimit:
    """TensorRT-LLM's LLM API: max_batch_size 2048 unless set."""
    return BatchLimit(
        "max_batch_size",
        TRTLLM_MAX_BATCH,
        "NVIDIA/TensorRT-LLM @ 0004396720054fd8e205cbf616f21f0b57c6b412 "
        "tensorrt_llm/llmapi/llm_args.py BaseLlmArgs.max_batch_size default 2048",
    )


def engine_batch_limit(recipe: Recipe, pool_tokens: int) -> BatchLimit:
    """trtllm-build: --max_batch_size 2048 unless set."""
    return BatchLimit(
        "--max_batch_size",
        TRTLLM_MAX_BATCH,
        "NVIDIA/TensorRT-LLM tensorrt_llm/builder.py BuildConfig.max_batch_size = 2048 (@ "
        "008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc), trtllm-build's --max_batch_size default",
    )


def trtllm_token_unit(facts: TokenFacts) -> EngineTokens:
    """What one of TensorRT-LLM's max tokens (kv_cache_config.max_tokens, 'max tokens in paged KV
    cache') holds: a token in every attention layer of the rank's stage, sliding ones included
    (tensorrt_llm/_torch/pyexecutor/resource_manager.py KVCacheManager.get_cache_size_per_token:
    kv_factor x num_attention_layers x kv heads x head_dim, no window); the C++ manager then shares
    that memory among the window sizes' pools (VSWA), which the exact per-sequence account
    follows."""
    return EngineTokens(
        facts.every_layer_bytes,
        "TensorRT-LLM: max_tokens / 'max tokens in paged KV cache' divide by every attention "
        "layer's bytes per token (resource_manager.py KVCacheManager.get_cache_size_per_token, no "
        "window); its per-window pools (VSWA) share that memory",
    )


TRTLLM_SOURCE = (
    "NVIDIA/TensorRT-LLM @ 0004396720054fd8e205cbf616f21f0b57c6b412: "
    "tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator.configure_kv_cache_capacity, "
    "_cal_max_memory ((total - peak + tmp kv) x fraction), max_tokens cap; "
    "KvCacheConfig.free_gpu_memory_fraction default 0.9"
)


TRT_ENGINE_SOURCE = (
    "NVIDIA/TensorRT-LLM cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp (runtime "
    "contexts, runtime buffers, decoder before the KV cache) and kvCacheManager.cpp "
    "calculateFreeMemBytes (free x kv_cache_free_gpu_mem_fraction, max_tokens_in_paged_kv_cache "
    "the smaller)"
)


# CudaGraphConfig's batch sizes when none are given (tensorrt_llm/llmapi/llm_args.py
# _generate_cuda_graph_batch_sizes: max_batch_size 128, enable_padding False): 1-31, 32, 64, 128
TRTLLM_GRAPH_BATCH_SIZES = (*range(1, 32), 32, 64, 128)
# TensorRT-LLM's own figure for one decode CUDA graph: "Each CUDA graph metadata takes about 10 MiB
# for DeepSeek R1" (NVIDIA/TensorRT-LLM PR #12895, 220 MiB per GPU for its padded batch sizes), 61
# layers: 0.16 MiB per layer and graph (vLLM's logs give 0.15-0.25, trtkv.engines.activation)
TRTLLM_GRAPH_MIB_PER_LAYER = 10 / 61


def trtllm_graph_batch_sizes(version: str, max_batch_size: int) -> list[int]:
    """The decode batch sizes TensorRT-LLM's PyTorch backend captures CUDA graphs for by default:
    the CudaGraphConfig sizes up to the executor's max_batch_size (model_engine filters them by it:
    "Creating CUDA graph instances for N batch sizes"); none before 1.0, whose
    PyTorchConfig.use_cuda_graph was off by default."""
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) < 1:
        return []
    return [b for b in TRTLLM_GRAPH_BATCH_SIZES if b <= max_batch_size]


def trtllm_cuda_graph_bytes(shape: ModelShape, setup: Setup, version: str) -> float:
    """The decode CUDA graphs held while the PyTorch backend measures its peak, on one GPU: one
    graph per batch size, each TRTLLM_GRAPH_MIB_PER_LAYER over this GPU's layers (the graphs share
    one memory pool: their activations are the decode batch's, small beside the warm-up's)."""
    graphs = len(trtllm_graph_batch_sizes(version, setup.max_num_seqs))
    layers = -(-shape.layers // setup.pp)
    return graphs * layers * TRTLLM_GRAPH_MIB_PER_LAYER * MIB


def trtllm_pool(
    shape: ModelShape,
    setup: Setup,
    version: str,
    fraction: float,
    *,
    fraction_is_default: bool,
    max_tokens: int | None = None,
) -> PoolEstimate:
    """TensorRT-LLM PyTorch backend / LLM API: fraction x (total - weights - warm-up activation -
    non-torch - the warm-up's CUDA graphs)."""
    activation = forward_peak_bytes(shape, setup)
    non_torch = context_bytes(setup)
    graphs = trtllm_cuda_graph_bytes(shape, setup, version)
    free = setup.gpu_total_bytes - setup.weights_bytes - activation - non_torch - graphs
    terms = (
        Term(
            "weights",
            setup.weights_bytes,
            "weights (TensorRT-LLM: 'Memory used after loading model weights (inside torch)')",
        ),
        Term(
            "activation",
            activation,
            f"warm-up forward of max_num_tokens {setup.max_num_tokens:,} ('Memory "
            f"dynamically allocated during inference (inside torch)')",
        ),
        Term(
            "non_torch",
            non_torch,
            "CUDA context, NCCL ('Memory used outside torch (e.g., NCCL and CUDA graphs)')",
        ),
        Term(
            "cuda_graphs",
            graphs,
            f"decode CUDA graphs the warm-up captured before the peak was measured "
            f"({len(trtllm_graph_batch_sizes(version, setup.max_num_seqs))} batch sizes up to "
            f"max_batch_size {setup.max_num_seqs:,}; in the same 'outside torch' line)",
        ),
    )
    est = PoolEstimate(
        "trtllm",
        version,
        "TensorRT-LLM (PyTorch backend / LLM API): free_gpu_memory_fraction x "
        "(total - warm-up peak)",
        TRTLLM_SOURCE,
        "kv_cache_config.free_gpu_memory_fraction",
        fraction,
        fraction_is_default,
        free,
        terms,
        free * fraction,
        free * fraction,
    )
    cap = None if max_tokens is None else max_tokens * setup.kv_bytes_per_token
    return apply_bound(est, cap, False, setup.kv_bytes_per_token * setup.tokens_per_block)


def trt_engine_pool(
    shape: ModelShape,
    setup: Setup,
    version: str,
    fraction: float,
    *,
    fraction_is_default: bool,
    max_tokens: int | None = None,
    logits_bytes: int = 4,
) -> PoolEstimate:
    """The TensorRT engine path (Triton's tensorrtllm backend, trtllm-serve on an engine): fraction
    x free after the engine, its execution context (the activation TensorRT sized at build for
    max_num_tokens, plus the last-token logits of max_batch_size rows), the runtime's logits buffer
    and the decoder's sampling workspace (both max_batch_size x vocab; logits FP32 as trtkv's Triton
    configs declare them)."""
    rows_x_vocab = setup.max_num_seqs * shape.vocab
    exec_context = forward_peak_bytes(shape, setup) + rows_x_vocab * logits_bytes
    runtime = rows_x_vocab * logits_bytes
    decoder = rows_x_vocab * 2 * logits_bytes
    free = (
        setup.gpu_total_bytes
        - context_bytes(setup)
        - setup.weights_bytes
        - exec_context
        - runtime
        - decoder
    )
    terms = (
        Term("context", context_bytes(setup), "CUDA context and NCCL"),
        Term("weights", setup.weights_bytes, "the engine ('Loaded engine size')"),
        Term(
            "activation",
            exec_context,
            "execution context ('Allocated X MiB for execution context memory')",
        ),
        Term(
            "runtime_buffers",
            runtime + decoder,
            "runtime buffers and decoder ('GPU memory for runtime buffers', '... for decoder')",
        ),
    )
    est = PoolEstimate(
        "tensorrt",
        version,
        "TensorRT-LLM engine: kv_cache_free_gpu_mem_fraction x free after the "
        "engine, its context, runtime buffers and decoder",
        TRT_ENGINE_SOURCE,
        "kv_cache_free_gpu_mem_fraction",
        fraction,
        fraction_is_default,
        free,
        terms,
        free * fraction,
        free * fraction,
    )
    cap = None if max_tokens is None else max_tokens * setup.kv_bytes_per_token
    return apply_bound(est, cap, False, setup.kv_bytes_per_token * setup.tokens_per_block)


def trtllm_recipe_pool(recipe: Recipe, sizing: Sizing, knobs: EngineKnobs) -> PoolEstimate:
    return trtllm_pool(
        sizing.shape,
        sizing.setup,
        recipe.build.tensorrt_llm_version,
        float(knobs.value or 0),
        fraction_is_default=knobs.is_default,
        max_tokens=knobs.cap_value,
    )


def trt_engine_recipe_pool(recipe: Recipe, sizing: Sizing, knobs: EngineKnobs) -> PoolEstimate:
    return trt_engine_pool(
        sizing.shape,
        sizing.setup,
        recipe.build.tensorrt_llm_version,
        float(knobs.value or 0),
        fraction_is_default=knobs.is_default,
        max_tokens=knobs.cap_value,
    )


def trtllm_at(
    shape: ModelShape, setup: Setup, version: str, knob: float, cap: int | None
) -> PoolEstimate:
    return trtllm_pool(shape, setup, version, knob, fraction_is_default=False, max_tokens=cap)


def trt_engine_at(
    shape: ModelShape, setup: Setup, version: str, knob: float, cap: int | None
) -> PoolEstimate:
    return trt_engine_pool(shape, setup, version, knob, fraction_is_default=False, max_tokens=cap)


def trtllm_knobs(recipe: Recipe, flag: str, cap_flag: str) -> EngineKnobs:
    """TensorRT-LLM (LLM API: kv_cache_config.free_gpu_memory_fraction / max_tokens; engine path:
    kv_cache_free_gpu_mem_fraction / max_tokens_in_paged_kv_cache): the fraction always, the token
    cap when triton.kv_pool_gib_per_gpu caps the pool."""
    frac = recipe.triton.kv_cache_free_gpu_mem_fraction
    cap = cap_tokens(recipe)
    return EngineKnobs(
        flag,
        TRTLLM_DEFAULT_FRACTION if frac is None else frac,
        frac is None,
        cap_flag if cap is not None else None,
        cap,
    )


def llmapi_memory_knobs(recipe: Recipe) -> EngineKnobs:
    """kv_cache_config.free_gpu_memory_fraction, and kv_cache_config.max_tokens when
    triton.kv_pool_gib_per_gpu caps."""
    return trtllm_knobs(
        recipe, f"kv_cache_config.{LLMAPI_FRACTION_KEY}", f"kv_cache_config.{LLMAPI_CAP_KEY}"
    )


def engine_memory_knobs(recipe: Recipe) -> EngineKnobs:
    """The tensorrt_llm model's kv_cache_free_gpu_mem_fraction, and max_tokens_in_paged_kv_cache
    when triton.kv_pool_gib_per_gpu caps."""
    return trtllm_knobs(recipe, ENGINE_FRACTION_PARAM, ENGINE_CAP_PARAM)


_TRTLLM_ALLOCATED = re.compile(r"Allocated ([\d.]+) GiB for max tokens in paged KV cache \((\d+)\)")
TRTLLM_LOG = "TensorRT-LLM log 'Allocated X GiB for max tokens in paged KV cache (N)'"


def trtllm_log_pool(text: str) -> tuple[float, int] | None:
    """TensorRT-LLM's '[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N)':
    (bytes, tokens), the last one printed (the LLM API allocates twice: the estimation cache, then
    the pool)."""
    found = _TRTLLM_ALLOCATED.findall(text)
    if not found:
        return None
    gib, tokens = found[-1]
    return (
        real(gib, TRTLLM_LOG, "GiB", MAX_POOL_BYTES / GIB) * GIB,
        whole(tokens, TRTLLM_LOG, "tokens", MAX_POOL_TOKENS),
    )
