"""Activation memory of an engine's profiling or warm-up forward, from the architecture and the
engine's batch limits (the terms the engines' rules subtract): the widest layer of a forward
over max_num_tokens tokens, the sampler over the request rows, and vLLM's CUDA-graph estimate.
Shapes per GPU: TP splits the MLP and expert widths.

Assumptions, said where they are made (the engines' code they follow is cited at each function):
- the forward's peak is one layer's MLP: the fused gate/up output (2 x intermediate), the activation
  output (1 x intermediate), and three hidden-size tensors alive beside it (residual, normed input,
  attention output); an MoE layer holds top_k copies of the expert widths per token instead (fused
  MoE's intermediate caches);
- pipeline stages other than the first keep two hidden-size receive buffers;
- the sampler runs on the last stage only, over min(max_num_seqs, max_num_tokens) rows, with the
  full vocabulary on every TP rank (logits are gathered), while the last hidden states (two
  hidden-size tensors) stay alive.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtkv.units import GIB, MIB


@dataclass(frozen=True)
class ModelShape:
    """The architecture figures activation memory depends on (whole model, not per GPU)."""

    layers: int
    hidden: int
    intermediate: int  # dense MLP width (0 when every layer is MoE)
    vocab: int
    act_bytes: int = 2  # activation dtype (bf16/fp16)
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # all shared experts together


@dataclass(frozen=True)
class Setup:
    """One GPU of a deployment as the engine sees it."""

    gpu_total_bytes: float  # as CUDA reports it (cudaMemGetInfo total)
    tp: int
    pp: int
    weights_bytes: float  # on this GPU
    kv_bytes_per_token: float  # on this GPU, every layer of its stage
    # tokens per step: vLLM max_num_batched_tokens, TRT-LLM max_num_tokens, SGLang chunked prefill
    max_num_tokens: int
    # requests per step: vLLM max_num_seqs, TRT-LLM max_batch_size, SGLang max_running_requests
    max_num_seqs: int
    nvswitch: bool = True  # the TP GPUs share an NVSwitch (NCCL NVLS buffers)
    tokens_per_block: int = 1
    blackwell_datacenter: bool = False  # vLLM captures graphs up to 1024 tokens there
    # expert parallelism and attention-DP groups inside the tp GPUs (trtkv.recipe.parallel)
    ep: int = 1
    attention_dp: int = 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def forward_peak_bytes(shape: ModelShape, setup: Setup) -> float:
    """Peak bytes of one forward over max_num_tokens tokens (the widest layer, see the module
    docstring)."""
    t, h, b, tp = setup.max_num_tokens, shape.hidden, shape.act_bytes, setup.tp
    # under attention DP the dense layers run inside one group (trtkv.engines.parallel)
    group_tp = max(1, tp // setup.attention_dp)
    dense = (
        t * b * (3 * _ceil_div(shape.intermediate, group_tp) + 3 * h) if shape.intermediate else 0
    )
    moe = 0.0
    if shape.experts_per_token:
        rows, pairs = moe_rows(shape, setup)
        per_expert = 3 * _ceil_div(shape.expert_intermediate, max(1, tp // setup.ep)) + h
        shared = (
            3 * _ceil_div(shape.shared_intermediate, group_tp) if shape.shared_intermediate else 0
        )
        moe = b * (pairs * per_expert + rows * (shared + 3 * h)) + all_to_all_bytes(shape, setup)
    stage_buffers = 2 * t * h * b if setup.pp > 1 else 0
    return float(max(dense, moe) + stage_buffers)


def moe_rows(shape: ModelShape, setup: Setup) -> tuple[int, float]:
    """(tokens an MoE layer sees on one GPU, token-expert pairs it computes there): every
    attention-DP group's max_num_tokens reach the experts; under EP the pairs spread over the ep
    ranks (uniform routing: each holds num_experts / ep of them)."""
    rows = setup.max_num_tokens * setup.attention_dp
    return rows, rows * shape.experts_per_token / setup.ep


def all_to_all_bytes(shape: ModelShape, setup: Setup) -> float:
    """EP's dispatch and combine buffers of one step on one GPU (0 without EP): the hidden states
    this GPU's group sends (max_num_tokens x top_k) and those it receives (the token-expert pairs of
    moe_rows), once for dispatch and once for combine, in the activation dtype. Modelled, not read
    from an engine: DeepEP / NVLink one-sided workspaces are sized by their own settings, and a
    skewed routing receives more than the uniform share."""
    if setup.ep <= 1:
        return 0.0
    _, pairs = moe_rows(shape, setup)
    sent = setup.max_num_tokens * shape.experts_per_token
    return 2.0 * (sent + pairs) * shape.hidden * shape.act_bytes


def sampler_peak_bytes(shape: ModelShape, setup: Setup, rows: int, bytes_per_logit: float) -> float:
    """The dummy sampler run: rows x vocab logits at the engine's bytes per element, beside the last
    hidden states."""
    resident = 2 * setup.max_num_tokens * shape.hidden * shape.act_bytes
    return rows * shape.vocab * bytes_per_logit + resident


def vllm_capture_sizes(setup: Setup) -> tuple[list[int], list[int]]:
    """vLLM's default CUDA-graph sizes (vllm/config/vllm.py _set_cudagraph_sizes, vllm 0.32.0): [1,
    2, 4], multiples of 8 below 256, multiples of 16 up to min(2 x max_num_seqs, 512; 1024 on
    data-center Blackwell), none above max_num_batched_tokens. PIECEWISE graphs take every size
    (mixed prefill-decode), FULL graphs the decode sizes up to max_num_seqs (FULL_AND_PIECEWISE, the
    default mode)."""
    ceiling = min(2 * setup.max_num_seqs, 1024 if setup.blackwell_datacenter else 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, ceiling + 1, 16)]
    piecewise = [s for s in sizes if s <= min(ceiling, setup.max_num_tokens)]
    full = [s for s in piecewise if s <= setup.max_num_seqs]
    return piecewise, full


# vLLM's CUDA-graph estimate (vllm/v1/worker/gpu_model_runner.py profile_cudagraph_memory: it
# captures the first and a second graph of each mode and extrapolates 'first-capture + (n - 1) x
# per-graph'). The 0.19.0 logs print the two figures for 30 models on H100 (llm-d-planner
# accuracy/results/v0.19.0): per graph 0.15-0.25 MiB per layer on the GPU, first captures 0.1-0.26
# GiB per mode. Engine figures, the same for every model.
GRAPH_MIB_PER_LAYER = 0.2
GRAPH_FIRST_CAPTURES_GIB = 0.25


def cuda_graph_bytes(shape: ModelShape, setup: Setup, *, charged: bool) -> float:
    """vLLM's CUDA-graph estimate on one GPU (0 when the release does not charge it to the KV
    budget)."""
    if not charged:
        return 0.0
    piecewise, full = vllm_capture_sizes(setup)
    layers = _ceil_div(shape.layers, setup.pp)
    graphs = len(piecewise) + len(full)
    return GRAPH_FIRST_CAPTURES_GIB * GIB + graphs * layers * GRAPH_MIB_PER_LAYER * MIB
