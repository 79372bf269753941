"""RoPE settings in their three spellings: transformers 5 (`rope_parameters`), transformers 4.x
(`rope_theta` + `rope_scaling`) and a TensorRT-LLM checkpoint (`rotary_base` + `rotary_scaling`).
One owner; no heavy imports.

Why it matters: ModelOpt 0.47 under transformers 5 reads only the old keys, so its TensorRT-LLM
export carries no `rotary_base` and TensorRT-LLM falls back to its defaults (10000, no scaling): a
Llama-3 engine would run with the wrong positions. trtkv writes the keys itself
(`complete_trtllm_config`, `complete_hf_config`) and the checkpoint validation compares them with
the source model (`rope_problems`).

TensorRT-LLM (<= 1.2, `models/llama/config.py` LLaMAConfig: `rotary_base=10000.0`,
`rotary_scaling=None`) reads `rotary_scaling["type"]` and the scaling type's own keys (llama3:
factor, low_freq_factor, high_freq_factor, original_max_position_embeddings), i.e. transformers
4.x's `rope_scaling` with `type` for `rope_type`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# LLaMAConfig.__init__(rotary_base=10000.0) in TensorRT-LLM 1.x
TRTLLM_DEFAULT_ROTARY_BASE = 10000.0
HF_DEFAULT_ROPE_THETA = 10000.0  # transformers' LlamaConfig default
UNSCALED = ("default", None)


@dataclass(frozen=True)
class Rope:
    """Base frequency and scaling (None = plain RoPE); `scaling` holds `rope_type` plus its own
    keys."""

    theta: float
    scaling: dict[str, Any] | None

    @property
    def scaling_type(self) -> str | None:
        return None if self.scaling is None else str(self.scaling.get("rope_type"))

    def describe(self) -> str:
        if self.scaling is None:
            return f"theta {self.theta:g}, no scaling"
        keys = ", ".join(f"{k} {v}" for k, v in sorted(self.scaling.items()) if k != "rope_type")
        return f"theta {self.theta:g}, {self.scaling_type} scaling ({keys})"


def _scaling(raw: Any) -> dict[str, Any] | None:
    """A scaling dict with `rope_type` (from `rope_type` or `type`), or None for plain RoPE."""
    if not isinstance(raw, dict):
        return None
    kind = raw.get("rope_type", raw.get("type"))
    if kind in UNSCALED:
        return None
    out = {k: v for k, v in raw.items() if k not in ("type", "rope_type", "rope_theta")}
    out["rope_type"] = kind
    return out


def from_hf(config: dict[str, Any]) -> Rope:
    """RoPE of an HF config dict, either transformers generation (rope_parameters wins when
    present)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and params:
        theta = params.get("rope_theta", config.get("rope_theta", HF_DEFAULT_ROPE_THETA))
        return Rope(float(theta), _scaling(params))
    return Rope(
        float(config.get("rope_theta", HF_DEFAULT_ROPE_THETA)), _scaling(config.get("rope_scaling"))
    )


def from_trtllm(config: dict[str, Any]) -> Rope:
    """RoPE as TensorRT-LLM reads a checkpoint config.json (its defaults where a key is absent)."""
    base = config.get("rotary_base")
    return Rope(
        TRTLLM_DEFAULT_ROTARY_BASE if base is None else float(base),
        _scaling(config.get("rotary_scaling")),
    )


def trtllm_fields(rope: Rope) -> dict[str, Any]:
    """`rotary_base` and `rotary_scaling` in TensorRT-LLM's form (`type` and `rope_type` both name
    the kind)."""
    scaling = None
    if rope.scaling is not None:
        scaling = {"type": rope.scaling["rope_type"], **rope.scaling}
    return {"rotary_base": rope.theta, "rotary_scaling": scaling}


def hf_legacy_fields(rope: Rope) -> dict[str, Any]:
    """Top-level `rope_theta` / `rope_scaling` as transformers 4.x (TensorRT-LLM 1.x pins 4.57)
    reads them."""
    scaling = None
    if rope.scaling is not None:
        scaling = {
            "rope_type": rope.scaling["rope_type"],
            "type": rope.scaling["rope_type"],
            **{k: v for k, v in rope.scaling.items() if k != "rope_type"},
        }
    return {"rope_theta": rope.theta, "rope_scaling": scaling}


def complete_trtllm_config(config: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """The TensorRT-LLM config with the source model's RoPE written in (other keys untouched)."""
    return {**config, **trtllm_fields(from_hf(source))}


def complete_hf_config(config: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """The exported HF config with top-level rope_theta/rope_scaling added (rope_parameters
    kept)."""
    rope = from_hf(source)
    out = {**config, **hf_legacy_fields(rope)}
    if "rope_parameters" not in out:
        out["rope_parameters"] = {
            "rope_type": rope.scaling_type or "default",
            "rope_theta": rope.theta,
            **{k: v for k, v in (rope.scaling or {}).items() if k != "rope_type"},
        }
    return out


def _same(a: Rope, b: Rope) -> bool:
    if not math.isclose(a.theta, b.theta, rel_tol=1e-9):
        return False
    if (a.scaling is None) != (b.scaling is None):
        return False
    if a.scaling is None or b.scaling is None:
        return True
    keys = set(a.scaling) | set(b.scaling)
    for key in keys:
        x, y = a.scaling.get(key), b.scaling.get(key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            if not math.isclose(float(x), float(y), rel_tol=1e-9):
                return False
        elif x != y:
            return False
    return True


def rope_problems(
    model: Rope, trtllm_config: dict[str, Any] | None, hf_export: dict[str, Any] | None
) -> list[str]:
    """Differences between the source model's RoPE and what TensorRT-LLM / transformers 4.x will
    read."""
    out = []
    if trtllm_config is not None:
        got = from_trtllm(trtllm_config)
        if not _same(model, got):
            absent = [k for k in ("rotary_base", "rotary_scaling") if k not in trtllm_config]
            why = (
                f" ({' and '.join(absent)} absent: TensorRT-LLM's default is rotary_base "
                f"{TRTLLM_DEFAULT_ROTARY_BASE:g}, no scaling)"
                if absent
                else ""
            )
            out.append(
                f"config.json: TensorRT-LLM reads RoPE {got.describe()}{why}, but the model has "
                f"{model.describe()}"
            )
    if hf_export is not None:
        legacy = Rope(
            float(hf_export.get("rope_theta", HF_DEFAULT_ROPE_THETA)),
            _scaling(hf_export.get("rope_scaling")),
        )
        if "rope_theta" not in hf_export or not _same(model, legacy):
            out.append(
                "hf/config.json: transformers 4.x (as pinned by TensorRT-LLM 1.x) reads top-level "
                f"rope_theta/rope_scaling as {legacy.describe()}"
                f"{' (rope_theta absent)' if 'rope_theta' not in hf_export else ''}, but the model "
                f"has {model.describe()}"
            )
    return out
