"""The typed columns of a backend row (trtkv.recipe.backend_rules.BACKEND_ROWS) that trtkv's models
read: the engine aiconfigurator and trtkv's speed model price, and how the engine applies the
calibrated KV scales."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MoEActivation = Literal["bf16", "mxfp8"]


@dataclass(frozen=True)
class Mxfp4Activations:
    """The activations an engine runs MXFP4 experts (gpt-oss's) with on a Blackwell GPU, by compute
    capability major, its own pick first, and where that is read (trtkv.recipe.moe_activations);
    every engine runs BF16 below Blackwell."""

    allowed: dict[int, tuple[MoEActivation, ...]]
    source: str


@dataclass(frozen=True)
class SpeedEngine:
    """The engine aiconfigurator models for a backend (`trtkv plan --estimate`): its name there and
    in print, and what aiconfigurator-core 0.12.0 adds beyond its kernel tables: `queued`, the TTFT
    factor of its base backend (sdk/backends/base_backend.py `_ttft_queuing_factor`; its vLLM
    backend has its own rule: trtkv's M/D/1 queue), and the CPU-side dispatch per request and layer
    (sdk/backends/vllm_backend.py `_prefill_dispatch_overhead_ms`: 0.8 ms for vLLM)."""

    name: str
    label: str
    queued: bool = False
    dispatch_ms_per_layer: float = 0.0
    # its default loop schedules the next step before the one in flight ends, so a new request
    # waits that step too (trtkv.plan.in_flight cites each engine's loop)
    overlap: bool = True
    # it packs only whole prompts into a step unless chunked prefill is on (the LLM API's
    # enable_chunked_prefill defaults to False; Recipe.chunked_context turns it on where a prompt
    # exceeds max_num_tokens): trtkv.plan.waves
    whole_prompts: bool = False
    # the activations of its MXFP4 experts on Blackwell (None: BF16 alone)
    mxfp4_moe: Mxfp4Activations | None = None


@dataclass(frozen=True)
class ScaleUse:
    """How an engine applies kv_scales.json to an FP8/INT8 cache, as the fidelity task's prediction
    models it (trtkv.bench.tasks.fidelity_score): `shared`, one per-layer factor for K and V;
    `split`, per-layer k_scale and v_scale; `one`, FP8 at scale 1.0."""

    name: str
    how: Literal["shared", "split", "one"]
    fields: str  # the scale fields it reads
    text: str


# What each engine runs gpt-oss's MXFP4 experts with on Blackwell (SM10x, SM12x), from its source
TRTLLM_MXFP4 = Mxfp4Activations(
    {10: ("mxfp8",), 12: ("mxfp8",)},
    "its examples/models/core/gpt_oss/README.md MoE support matrix: Blackwell mxfp8, no switch",
)
VLLM_MXFP4 = Mxfp4Activations(
    # fused_moe/oracle/mxfp4.py lists each BF16 kernel before its MXFP8 twin for gpt-oss; its
    # FlashInfer MXFP8 kernels need 10.0+ (experts/trtllm_mxfp4_moe.py, flashinfer_cutlass_moe.py)
    {10: ("bf16", "mxfp8"), 12: ("bf16", "mxfp8")},
    "vLLM 0.32.0 prefers its BF16 MXFP4 kernels for gpt-oss (fused_moe/oracle/mxfp4.py)",
)
SGLANG_MXFP4 = Mxfp4Activations(
    # arg_groups/model_overrides/gpt_oss.py picks flashinfer_mxfp4 on SM100 / SM120;
    # layers/quantization/mxfp4_flashinfer_trtllm_moe.py (SM10x) honours precision bf16,
    # mxfp4_flashinfer_cutlass_moe.py (SM12x) runs MXFP8 whatever it says
    {10: ("mxfp8", "bf16"), 12: ("mxfp8",)},
    "SGLang 0.5.23's flashinfer_mxfp4 runner quantizes the routed input to MXFP8 on Blackwell "
    "unless --flashinfer-mxfp4-moe-precision bf16 (SM10x only)",
)
