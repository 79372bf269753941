"""The recipe sections that depend on no other section: the base of every section (extra keys
forbidden) and the quantization section (weights, KV-cache format, scales, layers kept 16-bit).
trtkv.recipe.schema re-exports them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trtkv.recipe.enums import KV_CACHE_ALIASES, KVCacheQuant, KVScaleStrategy, WeightQuant


class Section(BaseModel):
    # no NaN or infinity in any float (`memory_gib=1e309` is infinity to YAML)
    model_config = ConfigDict(
        extra="forbid", use_enum_values=False, validate_default=True, allow_inf_nan=False
    )


class QuantizationConfig(Section):
    weights: WeightQuant = Field(
        WeightQuant.NONE, description="Weight quantization (ModelOpt qformat)."
    )
    kv_cache: KVCacheQuant = Field(
        KVCacheQuant.FP8,
        description="KV-cache precision; `fp8_kv_cache`/`int8_kv_cache` are accepted as aliases. "
        "fp8/int8/nvfp4 land in the checkpoint's `quantization.kv_cache_quant_algo` (trtllm-build "
        "has no KV flag); the engine formats (fp8_cast, *_per_token_head, turboquant_*, "
        "ultraquant_4bit) need no calibrated scales and deploy where docs/kv-formats.md gives the "
        "backend's engine a row (vLLM: `--kv-cache-dtype` from that table); fp8_attn_head is "
        "calibrated: one FP8 k/v scale per layer and KV head (vLLM's FlashAttention, SM90/SM100).",
    )
    kv_scales: KVScaleStrategy = Field(
        KVScaleStrategy.STATIC_PER_TENSOR,
        description="How KV scales are obtained: calibrated per-layer amax (the only strategy so "
        "far).",
    )
    kv_skip_layers: list[int | Literal["sliding_window"]] = Field(
        [],
        description="Layers whose KV stays in the model dtype while the others use `kv_cache` "
        "(vLLM `--kv-cache-dtype-skip-layers`; TensorRT-LLM has one KV format per checkpoint): "
        "indices, and/or `sliding_window` (vLLM's word: every sliding-window layer).",
    )

    @field_validator("kv_skip_layers")
    @classmethod
    def _sorted_unique(cls, value: list[int | str]) -> list[int | str]:
        if len(set(value)) != len(value):
            raise ValueError(
                f"layers listed twice: {sorted({str(v) for v in value if value.count(v) > 1})}"
            )
        indices = sorted(v for v in value if isinstance(v, int))
        if any(v < 0 for v in indices):
            raise ValueError(f"layer indices start at 0, got {[v for v in indices if v < 0]}")
        return [*indices, *(v for v in value if not isinstance(v, int))]

    @field_validator("kv_cache", mode="before")
    @classmethod
    def _kv_alias(cls, value: Any) -> Any:
        return KV_CACHE_ALIASES.get(value, value) if isinstance(value, str) else value
