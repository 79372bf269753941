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

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError
from trtkv.recipe.layout import HF

INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100_000_000  # safetensors' own cap
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_SCALE_ELEMENTS = 4096  # a per-head scale has num_kv_heads elements; more is not a KV scale
# safetensors dtype -> (struct code, bytes per element); BF16 is read as the top half of a float32
DECODERS = {"F64": ("d", 8), "F32": ("f", 4), "F16": ("e", 2), "BF16": ("f", 2)}
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
    format: (
        str  # "hf" (an HF folder: ModelOpt, compressed-tensors, ...) or "tensorrt_llm_checkpoint"
    )
    architecture: str | None  # config.json architectures[0] (HF) or architecture (TRT-LLM)
    kv_algo: str | None  # the KV quantization the config declares (FP8, INT8, NVFP4), None: none
    num_layers: int | None
    kv_layers: tuple[int, ...]  # the layers that keep a KV cache (linear-attention layers do not)
    tensors: tuple[ScaleTensor, ...]
    shards_read: tuple[str, ...]


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
        shards_read=tuple(shards),
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
        weight_map = _json(folder / INDEX, MAX_INDEX_BYTES).get("weight_map")
        if not isinstance(weight_map, dict):
            raise StageError(f"{folder / INDEX}: no weight_map object. Next: fetch it again.")
        shards = {str(s) for n, s in weight_map.items() if classify(str(n)) is not None}
        bad = sorted(s for s in shards if Path(s).name != s or not s.endswith(".safetensors"))
        if bad:
            raise StageError(
                f"{folder / INDEX}: weight_map names {bad[0]!r}, not a .safetensors file in the "
                "folder. Next: fetch the checkpoint again."
            )
        return sorted(shards)
    return sorted(p.name for p in folder.glob("*.safetensors") if p.is_file())


def _shard_scales(path: Path) -> list[ScaleTensor]:
    """The KV scale tensors one shard holds: its header, then only those tensors' bytes."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise _bad(path, "shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                raise _bad(path, f"header of {length} bytes (safetensors caps it at 100 MB)")
            header = json.loads(fh.read(length))
            if not isinstance(header, dict):
                raise _bad(path, "the header is not a JSON object")
            out = []
            for name, spec in header.items():
                found = classify(name) if name != "__metadata__" else None
                if found is None:
                    continue
                out.append(_scale(fh, path, name, spec, found, 8 + length))
            return out
    except OSError as exc:
        raise StageError(f"{path}: cannot be read ({exc}). Next: check the file.") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(path, f"the header is not JSON ({str(exc)[:100]})") from None


def _scale(fh: Any, path: Path, name: str, spec: Any, found: tuple, base: int) -> ScaleTensor:
    layer, kind, convention = found
    if not isinstance(spec, dict):
        raise _bad(path, f"{name}: the header entry is not an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise _bad(path, f"{name}: shape {shape!r} is not a list of sizes")
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
    ):
        raise _bad(path, f"{name}: data_offsets {offsets!r} are not two integers")
    count = 1
    for d in shape:
        count *= d
    values: tuple[float, ...] = ()
    if dtype in DECODERS and count <= MAX_SCALE_ELEMENTS:
        code, size = DECODERS[dtype]
        begin, end = offsets
        if end - begin != count * size or begin < 0:
            raise _bad(path, f"{name}: data_offsets {offsets} do not hold {count} x {dtype}")
        fh.seek(base + begin)
        raw = fh.read(end - begin)
        if len(raw) != end - begin:
            raise _bad(path, f"{name}: the file ends inside the tensor's bytes")
        if dtype == "BF16":
            raw = b"".join(b"\x00\x00" + raw[i : i + 2] for i in range(0, len(raw), 2))
        values = struct.unpack(f"<{count}{code}", raw)
    return ScaleTensor(name, layer, kind, convention, values, str(dtype), path.name)


def _json(path: Path, limit: int = 16 * 1024 * 1024) -> dict:
    try:
        if path.stat().st_size > limit:
            raise StageError(f"{path}: over {limit} bytes. Next: check the file.")
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: not readable JSON ({str(exc)[:100]}). Next: check it.") from None
    if not isinstance(doc, dict):
        raise StageError(f"{path}: not a JSON object. Next: check the file.")
    return doc


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


def _bad(path: Path, problem: str) -> StageError:
    return StageError(
        f"{path}: not a readable safetensors file: {problem}. Next: the download is incomplete or "
        "the file is not safetensors; fetch it again."
    )
