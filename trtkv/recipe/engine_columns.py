"""The typed columns of a backend row (trtkv.recipe.backend_rules.BACKEND_ROWS) that trtkv's models
read: the engine aiconfigurator and trtkv's speed model price, and how the engine applies the
calibrated KV scales."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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


@dataclass(frozen=True)
class ScaleUse:
    """How an engine applies kv_scales.json to an FP8/INT8 cache, as the fidelity task's prediction
    models it (trtkv.bench.tasks.fidelity_score): `shared`, one per-layer factor for K and V;
    `split`, per-layer k_scale and v_scale; `one`, FP8 at scale 1.0."""

    name: str
    how: Literal["shared", "split", "one"]
    fields: str  # the scale fields it reads
    text: str
