"""SGLang's and TensorRT-LLM's KV-pool rules on one GPU (the types and vLLM's rule:
trtkv.plan.engine_memory).

SGLang 0.5.23 (python/sglang/srt/mem_cache/kv_cache_configurator.py `_profile_available_bytes`): the
pool gets what is free after loading minus `pre_model_load_memory x (1 - mem_fraction_static)`,
where `pre_model_load_memory` is what was free before loading (distributed/bootstrap.py
`measure_pre_model_load_memory`, after the CUDA context and torch.distributed/NCCL init). So pool =
free before loading x mem_fraction_static - what loading took. Tokens are whole cells (one token per
slot at page_size 1, pool_configurator.py `_compute_cell_size`); `--max-total-tokens` caps them. The
default mem_fraction_static is computed (arg_groups/memory_hook.py `handle_gpu_memory_settings`).

TensorRT-LLM PyTorch backend / LLM API (tensorrt_llm/_torch/pyexecutor/_util.py `KvCacheCreator.
configure_kv_cache_capacity` and `_cal_max_memory`, NVIDIA/TensorRT-LLM @
0004396720054fd8e205cbf616f21f0b57c6b412; the same formula since the 0.19 `cal_max_tokens`): after a
warm-up of dummy context requests filling max_num_tokens, pool = free_gpu_memory_fraction x (total -
peak + the temporary estimation cache), peak = torch's peak (weights, activation) + the non-torch
memory then held (CUDA context, NCCL, CUDA graphs); `kv_cache_config.max_tokens` caps it ("Both
free_gpu_memory_fraction and max_tokens are set ... The smaller value will be used"); blocks of
tokens_per_block.

TensorRT-LLM engine path (cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp: runtime
contexts, runtime buffers, decoder, then kvCacheManager.cpp `calculateFreeMemBytes`: free x
kv_cache_free_gpu_mem_fraction, logged as "Memory usage when calculating max tokens in paged kv
cache: total: X GiB, available: Y GiB").
"""

from __future__ import annotations

import math

from trtkv.plan.engine_activation import ModelShape, Setup, forward_peak_bytes
from trtkv.plan.engine_memory import GIB, PoolEstimate, Term, apply_bound
from trtkv.platform.hardware import CUDA_CONTEXT_GIB

MIB = 1024**2

# NCCL's NVLS buffers add ~2 GiB on NVSwitch systems ("Init torch distributed ends. mem usage=2.01
# GB" on 8x H200, sgl-project/sglang PR #11716); on PCIe ~0.13 GiB (QwQ-32B on L4). Engine
# constants, the same for every model.
NCCL_NVSWITCH_GIB = 2.0
NCCL_PCIE_GIB = 0.13

SGLANG_SOURCE = (
    "sglang 0.5.23: python/sglang/srt/mem_cache/kv_cache_configurator.py _profile_available_bytes "
    "(rest = free after loading - pre_model_load_memory x (1 - mem_fraction_static)); "
    "distributed/bootstrap.py measure_pre_model_load_memory; arg_groups/memory_hook.py "
    "handle_gpu_memory_settings (the default fraction)"
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


def context_bytes(setup: Setup) -> float:
    """CUDA context + torch init + NCCL init on one GPU (an engine-independent process figure)."""
    nccl = (
        (NCCL_NVSWITCH_GIB if setup.nvswitch else NCCL_PCIE_GIB) if setup.tp * setup.pp > 1 else 0.0
    )
    return (CUDA_CONTEXT_GIB + nccl) * GIB


# ---------------------------------------------------------------------------------------------
# SGLang


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


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM


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
    non-torch)."""
    activation = forward_peak_bytes(shape, setup)
    non_torch = context_bytes(setup)
    free = setup.gpu_total_bytes - setup.weights_bytes - activation - non_torch
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


def sglang_tokens(est: PoolEstimate, kv_bytes_per_token: float) -> int:
    """SGLang's max_total_num_tokens for a pool (whole cells)."""
    return int(math.floor(est.pool_bytes / kv_bytes_per_token)) if kv_bytes_per_token else 0
