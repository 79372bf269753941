"""`trtkv calibrate` for quantization.kv_cache fp8_attn_head: ModelOpt's per-layer FP8 HF export
converted into vLLM's per-attention-head form (convert_export). The scales, their on-disk form,
writer and check live in trtkv.kvcache.attn_head."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trtkv.calibrate.common import LayerScales
from trtkv.core.errors import StageError
from trtkv.kvcache.attn_head import (
    MODELOPT_QUANT_CONFIG,
    PER_TENSOR_NAMES,
    SCALES_FILE,
    attn_head_scales,
    head_amax_from_channels,
    write_attn_head_scales,
)


def _strip_per_tensor_scales(hf_dir: Path) -> list[str]:
    """Remove ModelOpt's per-layer k/v scales from its safetensors files (and the index); the names
    removed."""
    from safetensors.torch import load_file, save_file

    removed: list[str] = []
    for path in sorted(hf_dir.glob("*.safetensors")):
        if path.name == SCALES_FILE:
            continue
        tensors = load_file(str(path))
        drop = [n for n in tensors if n.endswith(PER_TENSOR_NAMES)]
        if drop:
            save_file(
                {n: t for n, t in tensors.items() if n not in drop},
                str(path),
                metadata={"format": "pt"},
            )
            removed += drop
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file() and removed:
        doc = json.loads(index.read_text())
        doc["weight_map"] = {n: f for n, f in doc.get("weight_map", {}).items() if n not in removed}
        index.write_text(json.dumps(doc, indent=2))
    return sorted(removed)


def convert_export(hf_dir: Path, layers: list[LayerScales], num_kv_heads: int) -> dict[str, Any]:
    """ModelOpt's per-layer FP8 HF export -> vLLM's per-head form: per (layer, KV head) scale = the
    head's calibrated amax / 448 (from the per-(head, channel) amax calibration collected), whose
    max over heads must be ModelOpt's per-layer scale; ModelOpt's per-layer k/v scales and
    hf_quant_config.json removed."""
    for layer in layers:
        for kind, channels in (("k", layer.k_channel_amax), ("v", layer.v_channel_amax)):
            if not channels or len(channels) % num_kv_heads:
                raise StageError(
                    f"layer {layer.layer}: calibration recorded {len(channels)} {kind} channel "
                    f"amaxes, not a multiple of num_kv_heads {num_kv_heads}: per-head scales "
                    "cannot be formed. Next: check the model's num_key_value_heads."
                )
    k = [
        attn_head_scales(head_amax_from_channels(layer.k_channel_amax, num_kv_heads))
        for layer in layers
    ]
    v = [
        attn_head_scales(head_amax_from_channels(layer.v_channel_amax, num_kv_heads))
        for layer in layers
    ]
    for layer, kh, vh in zip(layers, k, v, strict=True):
        for kind, heads, want in (("k", kh, layer.k_scale), ("v", vh, layer.v_scale)):
            if not math.isclose(max(heads), want, rel_tol=1e-5):
                raise StageError(
                    f"layer {layer.layer}: the largest per-head {kind}_scale {max(heads)} != "
                    f"ModelOpt's per-layer {kind}_scale {want}: the per-channel amax and the "
                    "quantizer's amax disagree."
                )
    removed = _strip_per_tensor_scales(hf_dir)
    (hf_dir / MODELOPT_QUANT_CONFIG).unlink(missing_ok=True)
    write_attn_head_scales(hf_dir, k, v)
    return {
        "scales_file": SCALES_FILE,
        "num_kv_heads": num_kv_heads,
        "k_scales": k,
        "v_scales": v,
        "removed_per_layer_scales": len(removed),
    }
