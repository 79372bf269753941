"""The recipe's probe section (`trtkv probe`: KV formats against the unquantized model, context
lengths, needle trials, the engine attention numerics measured, the probe's dtype and placement on
the GPUs). Its own module so the schema stays readable; trtkv.recipe.schema re-exports it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from trtkv.kvcache.formats import KVFormat
from trtkv.kvcache.names import all_format_names
from trtkv.recipe.limits import bounded
from trtkv.recipe.sections import Section


class ProbeConfig(Section):
    formats: list[str] = Field(
        [
            f.value
            for f in (
                KVFormat.BF16,
                KVFormat.FP8,
                KVFormat.FP8_SCALE1,
                KVFormat.INT8,
                KVFormat.INT8_TOKEN,
                KVFormat.INT4_G64,
                KVFormat.KIVI4,
                KVFormat.KIVI2,
            )
        ],
        description="KV formats to compare against the unquantized model: any `trtkv probe "
        "--formats` name (" + ", ".join(all_format_names()) + ").",
    )

    @field_validator("formats")
    @classmethod
    def _known_formats(cls, values: list[str]) -> list[str]:
        """Probe format names as `trtkv probe --formats` takes them (engine variants such as
        fp8_attn_head too)."""
        bad = [v for v in values if v.strip().lower() not in all_format_names()]
        if bad:
            raise ValueError(
                f"{bad[0]!r} is not a probe format; allowed: {', '.join(all_format_names())}"
            )
        return [v.strip().lower() for v in values]

    lengths: list[int] = Field(
        [512, 1024, 2048, 4096, 8192], description="Context lengths (tokens)."
    )
    needle_depths: list[float] = Field(
        [0.1, 0.5, 0.9], description="Relative depths of the hidden passkey."
    )
    needle_seeds: int = bounded(5, "requests", description="Needle trials per (depth, length).")
    attention: str = Field(
        "auto",
        description="Attention numerics measured besides the stored cache alone "
        "(`cache_only`, always measured): `auto` (what the recipe's engine, flags and GPU compute, "
        "e.g. FP8 Q and P on Hopper), `cache_only`, or modes separated by commas "
        "(docs/kv-formats.md).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Probe weights/compute dtype: `auto` = the model's 16-bit dtype on GPUs, "
        "float32 on CPU.",
    )
    prefill_chunk: int | None = bounded(
        None,
        "positions",
        description="Tokens per prefill chunk (None: one pass on the CPU, 2048 on GPUs).",
    )
    offload: bool = Field(
        False, description="Layers that do not fit the GPUs go to CPU memory (accelerate offload)."
    )

    @field_validator("attention")
    @classmethod
    def _attention_modes(cls, value: str) -> str:
        """auto, or attention mode names from trtkv/data/kv_formats.json (section attention)."""
        from trtkv.kvcache.attention_modes import AUTO, mode_names

        names = [v.strip() for v in value.split(",") if v.strip()]
        allowed = mode_names()
        if names == [AUTO]:
            return AUTO
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise ValueError(
                f"{(bad or [value])[0]!r} is not an attention mode; allowed: {AUTO}, "
                f"{', '.join(allowed)}"
            )
        return ",".join(names)

    @field_validator("lengths")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(v <= 0 for v in values):
            raise ValueError("every entry must be > 0")
        return values
