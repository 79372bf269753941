"""The KV-cache scale tensors a checkpoint folder stores, read alone: each shard's safetensors
header (8-byte little-endian length, then JSON: name -> dtype, shape, data_offsets) and, for the
scale tensors only, their few bytes. No model is loaded and no other tensor is read, so a 70B
checkpoint is audited in milliseconds on a laptop.

Which tensors are KV scales, by the names the writers use (and the engines' loaders read):
ModelOpt's unified HF export `self_attn.{k,v}_proj.{k,v}_scale`, compressed-tensors'
`self_attn.{q,k,v}_scale`, vLLM's own `self_attn.attn.{q,k,v,prob}_scale`, fused
`qkv_proj.{k,v}_scale`, the deprecated `kv_scale`, Quark's `{q,k,v}_proj.output_scale`, HunYuan's
`{k,v}_cache.scale`, and the TensorRT-LLM checkpoint's `attention.{kv,k,v}_cache_scaling_factor`.
Weight and activation scales (`weight_scale`, `input_scale`) are not KV scales and are never read.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

from trtkv.checkpoints.safetensors_headers import INDEX, TensorEntry, index_map, read_header
from trtkv.core.errors import StageError
from trtkv.core.files import json_object
from trtkv.recipe.layout import HF

MAX_SCALE_ELEMENTS = 4096  # a per-head scale has num_kv_heads elements; more is not a KV scale
# safetensors dtype -> struct code; BF16 is read as the top half of a float32
DECODERS = {"F64": "d", "F32": "f", "F16": "e", "BF16": "f"}
LAYER = re.compile(r"^(?P<prefix>.*?)layers\.(?P<layer>\d+)\.(?P<rest>.+)$")
# (leaf pattern on what follows `layers.N.`, the kind it names); the first match wins
LEAVES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?:^|\.)(?P<kind>kv|k|v)_cache_scaling_factor$"), ""),
    (re.compile(r"(?:^|\.)kv_scale$"), "kv"),
    (re.compile(r"(?:^|\.)(?P<kind>[qkv]|prob)_scale$"), ""),
    (re.compile(r"(?:^|\.)(?P<kind>[qkv])_proj\.output_scale$"), ""),
    (re.compile(r"(?:^|\.)prob_output_scale$"), "prob"),
    (re.compile(r"(?:^|\.)(?P<kind>[kv])_cache\.scale$"), ""),
    (re.compile(r"(?:^|\.)q\.scale$"), "q"),
)
# (pattern, convention): who writes a name like this
CONVENTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"_cache_scaling_factor$"), "tensorrt_llm"),
    (re.compile(r"(?:^|\.)kv_scale$"), "kv_scale (deprecated)"),
    (re.compile(r"self_attn\.[kv]_proj\.[kv]_scale$"), "modelopt"),
    (re.compile(r"self_attn\.attn\.(?:[qkv]|prob)_scale$"), "vllm"),
    (re.compile(r"self_attn\.[qkv]_scale$"), "compressed-tensors"),
    (re.compile(r"qk(?:qk)?v_proj\.[kv]_scale$"), "fused qkv_proj"),
    (re.compile(r"output_scale$"), "quark"),
    (re.compile(r"(?:_cache|\.q)\.scale$"), "hy_v3"),
)


@dataclass(frozen=True)
class ScaleTensor:
    """One stored KV scale tensor: its name, the layer and kind it belongs to, its values."""

    name: str
    layer: int
    kind: str  # k, v, q, prob, or kv (one scale shared by K and V)
    convention: str  # who writes names like this (CONVENTIONS), "other" when unknown
    values: tuple[float, ...]  # empty when its dtype is not a float trtkv decodes
    dtype: str
    shard: str


@dataclass(frozen=True)
class CheckpointScales:
    """A checkpoint folder's KV scale tensors and what its config says about them."""

    folder: Path
    # "hf" (an HF folder: ModelOpt, compressed-tensors, ...) or "tensorrt_llm_checkpoint"
    format: str
    architecture: str | None  # config.json architectures[0] (HF) or architecture (TRT-LLM)
    kv_algo: str | None  # the KV quantization the config declares (FP8, INT8, NVFP4), None: none
    num_layers: int | None
    kv_layers: tuple[int, ...]  # the layers that keep a KV cache (linear-attention layers do not)
    tensors: tuple[ScaleTensor, ...]


def classify(name: str) -> tuple[int, str, str] | None:
    """(layer, kind, convention) for a KV scale tensor's name, None for any other tensor."""
    m = LAYER.match(name)
    if not m:
        return None
    rest = m.group("rest")
    for pattern, kind in LEAVES:
        leaf = pattern.search(rest)
        if leaf:
            found = kind or leaf.group("kind")
            convention = next((c for p, c in CONVENTIONS if p.search(name)), "other")
            return int(m.group("layer")), found, convention
    return None


def read_checkpoint_scales(folder: Path) -> CheckpointScales:
    """The KV scale tensors of one checkpoint folder (HF or TensorRT-LLM), from headers alone."""
    config = _json(folder / "config.json") if (folder / "config.json").is_file() else {}
    trtllm = isinstance(config.get("quantization"), dict) and "architecture" in config
    if trtllm:
        shards = ["rank0.safetensors"] if (folder / "rank0.safetensors").is_file() else []
    else:
        shards = _hf_shards(folder)
    if not shards:
        raise StageError(
            f"{folder}: no model.safetensors.index.json, *.safetensors or rank0.safetensors file. "
            "Next: pass the folder that holds the checkpoint's weights (an HF export, or a "
            "TensorRT-LLM checkpoint with config.json and rank*.safetensors)."
        )
    tensors: list[ScaleTensor] = []
    for shard in shards:
        tensors += _shard_scales(folder / shard)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = text.get("num_hidden_layers") if isinstance(text, dict) else None
    layers = layers if isinstance(layers, int) and layers > 0 else None
    return CheckpointScales(
        folder=folder,
        format="tensorrt_llm_checkpoint" if trtllm else "hf",
        architecture=_architecture(config, trtllm),
        kv_algo=_kv_algo(folder, config, trtllm),
        num_layers=layers,
        kv_layers=_kv_layers(text if isinstance(text, dict) else {}, layers),
        tensors=tuple(sorted(tensors, key=lambda t: (t.layer, t.kind, t.name))),
    )


def checkpoint_folders(path: Path) -> list[Path]:
    """The checkpoint folders under `path`: itself, and trtkv's `hf/` export beside a TensorRT-LLM
    checkpoint (engines/<recipe>/checkpoint/)."""
    found = [p for p in (path, path / HF) if p.is_dir() and _holds_weights(p)]
    if not found:
        raise StageError(
            f"{path}: holds no safetensors checkpoint (no model.safetensors.index.json, "
            "*.safetensors or rank0.safetensors, here or in hf/). Next: pass a checkpoint folder "
            "or a recipe whose `trtkv calibrate` has run."
        )
    return found


def _holds_weights(folder: Path) -> bool:
    return (folder / INDEX).is_file() or any(folder.glob("*.safetensors"))


def _hf_shards(folder: Path) -> list[str]:
    """The shards holding KV scale tensors by the index's weight_map, else every *.safetensors."""
    if (folder / INDEX).is_file():
        return sorted({s for n, s in index_map(folder).items() if classify(n) is not None})
    return sorted(p.name for p in folder.glob("*.safetensors") if p.is_file())


def _shard_scales(path: Path) -> list[ScaleTensor]:
    """The KV scale tensors one shard holds: its header (checked by read_header), then only those
    tensors' bytes."""
    out = []
    for entry in read_header(path):
        found = classify(entry.name)
        if found is not None:
            out.append(_scale(path, entry, found))
    return out


def _scale(path: Path, entry: TensorEntry, found: tuple[int, str, str]) -> ScaleTensor:
    layer, kind, convention = found
    count = prod(entry.shape)
    values: tuple[float, ...] = ()
    if entry.dtype in DECODERS and count <= MAX_SCALE_ELEMENTS:
        try:
            with path.open("rb") as fh:
                fh.seek(entry.offset)
                raw = fh.read(entry.nbytes)
        except OSError as exc:
            raise StageError(f"{path}: cannot be read ({exc}). Next: check the file.") from None
        if entry.dtype == "BF16":
            raw = b"".join(b"\x00\x00" + raw[i : i + 2] for i in range(0, len(raw), 2))
        values = struct.unpack(f"<{count}{DECODERS[entry.dtype]}", raw)
    return ScaleTensor(entry.name, layer, kind, convention, values, entry.dtype, path.name)


def _json(path: Path) -> dict:
    return json_object(path, "check the file", 16 * 1024 * 1024)


def _architecture(config: dict, trtllm: bool) -> str | None:
    if trtllm:
        return str(config["architecture"])
    archs = config.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs else None


def _kv_algo(folder: Path, config: dict, trtllm: bool) -> str | None:
    """The KV quantization the checkpoint declares: TensorRT-LLM's quantization.kv_cache_quant_algo,
    ModelOpt's hf_quant_config.json, or a quantization_config's kv_cache_scheme."""
    if trtllm:
        algo = config["quantization"].get("kv_cache_quant_algo")
        return str(algo) if algo else None
    if (folder / "hf_quant_config.json").is_file():
        quant = _json(folder / "hf_quant_config.json").get("quantization")
        if isinstance(quant, dict) and quant.get("kv_cache_quant_algo"):
            return str(quant["kv_cache_quant_algo"])
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        if qc.get("kv_cache_quant_algo"):
            return str(qc["kv_cache_quant_algo"])
        scheme = qc.get("kv_cache_scheme")
        if isinstance(scheme, dict):
            bits, kind = scheme.get("num_bits"), scheme.get("type")
            return "FP8" if (bits, kind) == (8, "float") else f"{kind}{bits}".upper()
    return None


def _kv_layers(text: dict, layers: int | None) -> tuple[int, ...]:
    """Layers with a KV cache: all of them, less those config.json's layer_types marks as linear
    attention (Qwen3-Next, Qwen3.5: Gated DeltaNet keeps a state, not K/V)."""
    if layers is None:
        return ()
    types = text.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return tuple(i for i, t in enumerate(types) if "linear" not in str(t))
    return tuple(range(layers))
