"""probe.json's model: `trtkv probe` writes it, the planner, report and printouts read it
(trtkv.measures.probe_results). Typed parts keep the keys written, in order; the rest as written."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from trtkv.contracts.artifacts import Artifact, LayerAmax


class ProbeRecord(BaseModel):
    """One format at one context length (trtkv.probe.metrics.length_record), keys as written."""

    model_config = ConfigDict(extra="allow")

    format: str
    context_len: int
    kl_mean: float
    kl_last_quarter: float
    ppl: float
    ppl_ref: float
    ppl_delta: float
    top1_agreement: float
    needle_accuracy: float | None = None
    clip_rate: float | None = None  # static scales: share of K/V elements beyond their range
    k_clip_rate: float | None = None
    v_clip_rate: float | None = None
    kv_bytes_per_token: float  # measured on the quantized cache
    kv_bytes_per_token_formula: float
    bytes_vs_formula: float | None = None
    kv_semantics: str  # which runtime the format follows
    positions: int
    k_clip_rate_note: str | None = None
    fp16_window_tokens: int | None = None  # KIVI's full-precision window
    fp16_window_bytes_max: int | None = None
    attention: str = "cache_only"  # or an engine mode (trtkv.probe.attention); absent before them
    attention_engine: str | None = None
    attention_numerics: str | None = None
    needle_by_depth: dict[str, float] | None = None
    needle_seeds: int | None = None


class ProbeDrift(BaseModel):
    """Prefill vs decode of one format under one engine mode (trtkv.probe.attention.drift)."""

    model_config = ConfigDict(extra="allow")

    format: str
    attention: str
    prompt_tokens: int
    decode_steps: int
    mean_abs_dlogp: float
    max_abs_dlogp: float
    kl_mean: float
    top1_agreement: float
    exact_zero: bool
    note: str | None = None  # not run: both kernels compute alike


class ProbeAttention(BaseModel):
    """The attention modes measured (trtkv.probe.attention), cache_only first, and why each ran."""

    modes: list[str]
    reasons: dict[str, str]


class ProbeScales(BaseModel):
    model_config = ConfigDict(extra="allow")  # older probe.json files hold k_amax/v_amax lists here

    source: str
    layers: list[LayerAmax] = []


class ProbeDoc(Artifact):
    """probe.json of `trtkv probe`: records per format and length, engine attention, drift."""

    FILE = "probe.json"
    WRITTEN_BY = "`trtkv probe`"
    WRITE_DEFAULTS = False  # a record's optional keys: where the probe wrote them

    recipe: str
    seconds: float | None = None
    records: list[ProbeRecord] = []  # cache-only: the stored cache in full-precision attention
    scales: ProbeScales | None = None
    attention: ProbeAttention | None = None  # absent from files written before the engine modes
    attention_records: list[ProbeRecord] = []
    drift: list[ProbeDrift] = []

    @property
    def written(self) -> dict[str, Any]:
        """What this model leaves as written: model, settings, needles, scale_reuse, ruler, ..."""
        return self.model_extra or {}
