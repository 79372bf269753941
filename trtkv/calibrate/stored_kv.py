"""`trtkv calibrate` on a checkpoint whose weights arrive quantized: the KV cache only. The weights
are never quantized again and never rewritten: hf/ is a new checkpoint whose weight shards are the
user's files (hard-linked, else copied; byte-identical), beside one new safetensors file of k/v
scales, the index listing it, and the config the engine reads them by:

- ModelOpt exports (config.json quant_method modelopt / hf_quant_config.json): per-layer
  `model.layers.{i}.self_attn.k_proj.k_scale` / `v_proj.v_scale` float32 scalars = amax / 448 (the
  names and form ModelOpt 0.47's export_hf_checkpoint writes), hf_quant_config.json
  `kv_cache_quant_algo: FP8`, and config.json's quantization_config `kv_cache_scheme` as ModelOpt's
  own convert_hf_quant_config_format writes it. vLLM 0.32's ModelOpt configs give every Attention
  ModelOptKVCacheMethod (modelopt.py ModelOptQuantConfigBase.get_quant_method) and
  maybe_remap_kv_scale_name sends k_proj.k_scale to self_attn.attn.k_scale; TensorRT-LLM's LLM API
  reads kv_cache_quant_algo.
- compressed-tensors (llm-compressor): config.json quantization_config's `kv_cache_scheme`
  (strategy tensor, or attn_head for kv_cache fp8_attn_head), its weight groups kept, and
  `model.layers.{i}.self_attn.k_scale` / `v_scale` (trtkv.kvcache.attn_head: the form vLLM's
  CompressedTensorsKVCacheMethod loads into self_attn.attn).
- quant_method fp8 (DeepSeek / Qwen FP8 blocks) on vLLM: Fp8Config gives every Attention
  Fp8KVCacheMethod (fp8.py get_quant_method); the scales go under ModelOpt's names, the config is
  unchanged.
Where the engine reads no KV scale beside the stored weights (vLLM's MXFP4, AWQ and GPTQ configs
give attention no KV method), the recipe is refused with the alternatives.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from trtkv.backends import BACKENDS
from trtkv.checkpoints import HF_QUANT_CONFIG, read_checkpoint_quant
from trtkv.core.errors import StageError
from trtkv.core.files import json_object
from trtkv.recipe import KV_CALIBRATED_WEIGHTS, Backend, KVCacheQuant, Recipe, WeightQuant

SCALES_SHARD = "kv_cache_scales.safetensors"
INDEX = "model.safetensors.index.json"
ALTERNATIVES = (
    "serve it as stored with quantization.kv_cache fp8_cast (FP8 at scale 1.0, no calibration) "
    "or none (16-bit KV, where the checkpoint declares no KV format), or another build.backend"
)
# where the engine gives attention no KV-cache method for these weights (vLLM 0.32 sources)
NO_KV_PLACE = {
    "mxfp4": "vLLM 0.32's Mxfp4Config.get_quant_method returns None for Attention ('MXFP4 "
    "attention layer is not implemented', quantization/mxfp4.py)",
    "awq": "vLLM 0.32's AWQ config quantizes LinearBase only (quantization/auto_awq.py "
    "get_quant_method): no KV-cache method reads a k/v scale",
    "gptq": "vLLM 0.32's GPTQ config quantizes LinearBase and experts only "
    "(quantization/auto_gptq.py get_quant_method): no KV-cache method reads a k/v scale",
}


# the methods whose stored weights some backend reads calibrated KV scales beside (each backend
# object says which: EngineBackend.kv_scales_beside_stored; today vLLM, as read in its 0.32
# sources). TensorRT-LLM's PyTorch backend / LLM API runs an FP8 KV cache at scale 1.0 whatever
# the checkpoint holds (trtkv/data/kv_scale_loaders.json, `trtkv scales`), tensorrt and reference
# build from a TensorRT-LLM checkpoint (written from 16-bit weights only), SGLang is not checked
# here
def writer_backends(method: str) -> tuple[Backend, ...]:
    """The backends that read calibrated KV scales beside a checkpoint's stored `method` weights."""
    return tuple(b for b, obj in BACKENDS.items() if method in obj.kv_scales_beside_stored)


@dataclass(frozen=True)
class StoredCheckpoint:
    """A quantized checkpoint calibrate writes KV scales beside."""

    model_dir: Path
    writer: str  # who wrote it: "modelopt", "compressed-tensors", "fp8"
    weights: str  # the stored weight format: "fp8", "fp8_block", "nvfp4"
    source: str  # what trtkv.checkpoints.checkpoint_quant read
    block: tuple[int, int] | None  # FP8 2-D block shape, where stored so
    # why the checkpoint is served as stored with nothing to calibrate (a KV cache without scales,
    # or scales it carries that the engine reads); None where calibrate writes KV scales
    as_stored: str | None = None


def stored_checkpoint(recipe: Recipe, model_dir: Path) -> StoredCheckpoint | None:
    """The folder's stored quantization when its weights are quantized (None for 16-bit weights);
    a StageError before any work where calibrate cannot write KV scales beside them."""
    config = json_object(model_dir / "config.json", "check the folder")
    parts = [config, config.get("text_config")]
    quant = next(
        (p["quantization_config"] for p in parts if isinstance(p, dict) and _has_quant(p)), None
    )
    if quant is None and not (model_dir / HF_QUANT_CONFIG).is_file():
        return None
    notes: list[str] = []
    found = read_checkpoint_quant(quant, model_dir, notes)
    if found is None:
        _refuse(recipe, model_dir, "an unrecognised quantization", " ".join(notes), "")
    fmt = found.stored_format or "16-bit weights"
    q = recipe.quantization

    def refuse(why: str, first: str = "") -> NoReturn:
        _refuse(recipe, model_dir, fmt, why, first)

    if q.weights is not WeightQuant.NONE:
        refuse(
            f"quantization.weights {q.weights.value} would quantize them again",
            "quantization.weights none (the weights as stored; calibrate then calibrates the KV "
            "cache only), or ",
        )
    as_stored = None  # why the checkpoint is passed on as it is, nothing calibrated
    if recipe.kv_row.choice.checkpoint_algo is None:
        as_stored = f"kv_cache {q.kv_cache.value} takes no KV scales (the engine's flag sets it)"
    elif found.kv_cache and q.kv_cache is KVCacheQuant.FP8:
        as_stored = f"its own KV-cache scales ({found.kv_cache}) are read by the engine as they are"
        if recipe.build.backend not in writer_backends(found.method):
            refuse(
                f"it already carries KV-cache scales ({found.kv_cache}; {found.source}), which "
                f"build.backend {recipe.build.backend.value} does not read beside these weights",
            )
    if as_stored:
        return StoredCheckpoint(model_dir, found.method, fmt, found.source, None, as_stored)
    if found.kv_cache:
        refuse(
            f"it already carries KV-cache scales ({found.kv_cache}; {found.source}): calibrate "
            f"writes no kv_cache {q.kv_cache.value} beside them",
            "kv_cache fp8 (its scales as they are), or ",
        )
    if q.kv_cache not in (KVCacheQuant.FP8, KVCacheQuant.FP8_ATTN_HEAD):
        refuse(
            f"kv_cache {q.kv_cache.value}: calibrate writes FP8 KV scales beside stored weights "
            "(kv_cache fp8, or fp8_attn_head for compressed-tensors)",
        )
    return _target(recipe, model_dir, found.method, fmt, found.source, quant)


def _target(
    recipe: Recipe, model_dir: Path, method: str, fmt: str, source: str, quant: Any
) -> StoredCheckpoint:
    backend = recipe.build.backend

    def refuse(why: str, first: str = "") -> NoReturn:
        _refuse(recipe, model_dir, fmt, why, first)

    if method in NO_KV_PLACE:
        refuse(f"no engine place for its KV scales: {NO_KV_PLACE[method]}")
    if not writer_backends(method) or fmt not in KV_CALIBRATED_WEIGHTS:
        refuse(
            f"trtkv dequantizes only FP8 and NVFP4 weights ({method} {fmt}; {source}) to "
            "calibrate on them as the engine runs them",
        )
    if backend not in writer_backends(method):
        allowed = ", ".join(b.value for b in writer_backends(method))
        refuse(
            f"build.backend {backend.value} reads no calibrated KV scale beside stored {method} "
            f"weights (trtkv writes them for {allowed}: TensorRT-LLM's LLM API runs FP8 KV at "
            "scale 1.0 whatever the checkpoint holds, `trtkv scales` says so; tensorrt and "
            "reference build from a TensorRT-LLM checkpoint, written from 16-bit weights only)",
            f"build.backend {allowed}, or ",
        )
    if (
        recipe.quantization.kv_cache is KVCacheQuant.FP8_ATTN_HEAD
        and method != "compressed-tensors"
    ):
        refuse(
            f"kv_cache fp8_attn_head: {method} checkpoints carry one k/v scale per layer (vLLM "
            "reads per-head scales only through compressed-tensors)",
            "kv_cache fp8 (per layer), or ",
        )
    return StoredCheckpoint(model_dir, method, fmt, source, _block(quant))


def _block(quant: Any) -> tuple[int, int] | None:
    """The FP8 2-D block shape where the weights are stored so: fp8's weight_block_size,
    compressed-tensors' block_structure, ModelOpt FP8_PB_WO's 128 x 128; None otherwise."""
    if not isinstance(quant, dict):
        return None
    block = quant.get("weight_block_size")
    groups = quant.get("config_groups")
    if block is None and isinstance(groups, dict):
        for g in groups.values():
            w = g.get("weights") if isinstance(g, dict) else None
            block = w.get("block_structure") if isinstance(w, dict) else None
            if block:
                break
    if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) for b in block):
        return int(block[0]), int(block[1])
    return (128, 128) if str(quant.get("quant_algo")).upper() == "FP8_PB_WO" else None


def _refuse(recipe: Recipe, model_dir: Path, fmt: str, why: str, first: str) -> NoReturn:
    raise StageError(
        f"calibrate {recipe.name}: {model_dir} holds a checkpoint stored as {fmt}; {why}. Next: "
        f"{first}{ALTERNATIVES}; nothing was calibrated."
    )


def _has_quant(part: Any) -> bool:
    return isinstance(part, dict) and isinstance(part.get("quantization_config"), dict)


# ---------------------------------------------------------------------------------------------
# The new checkpoint: the stored weights linked, the scales beside them


def link_checkpoint(model_dir: Path, hf_dir: Path) -> list[str]:
    """hf_dir as the user's checkpoint: each safetensors shard hard-linked (copied across file
    systems), the other small files copied, config.json and the index written afresh later; the
    shard names. The user's folder is only read."""
    hf_dir.mkdir(parents=True, exist_ok=True)
    shards = []
    for path in sorted(model_dir.iterdir()):
        if not path.is_file() or path.suffix in (".bin", ".pt", ".pth", ".gguf"):
            continue
        if path.suffix == ".safetensors":
            shards.append(path.name)
            try:
                os.link(path, hf_dir / path.name)
            except OSError:
                shutil.copyfile(path, hf_dir / path.name)
        else:
            shutil.copyfile(path, hf_dir / path.name)
    if not shards:
        raise StageError(
            f"{model_dir}: no *.safetensors weights. Next: point model.source at them."
        )
    return shards


def write_scales(
    target: StoredCheckpoint, hf_dir: Path, k_scales: list[Any], v_scales: list[Any]
) -> Path:
    """The k/v scales (per layer: floats; per head: lists) under the names the checkpoint's engine
    maps to self_attn.attn, in their own shard listed in the index, and the config that declares
    them."""
    import torch
    from safetensors.torch import save_file

    from trtkv.kvcache import (
        KV_CACHE_SCHEME_TENSOR,
        compressed_tensors_config,
        write_attn_head_scales,
    )

    _write_index(hf_dir)
    if target.writer == "compressed-tensors" and k_scales and isinstance(k_scales[0], list):
        return write_attn_head_scales(hf_dir, k_scales, v_scales)  # index and config too
    tensors = {}
    for i, (k, v) in enumerate(zip(k_scales, v_scales, strict=True)):
        for kind, value in (("k", k), ("v", v)):
            if target.writer == "compressed-tensors":  # llm-compressor's name, one element
                tensors[f"model.layers.{i}.self_attn.{kind}_scale"] = torch.tensor(
                    [value], dtype=torch.float32
                )
            else:  # ModelOpt's name and float32 scalar (vLLM's Fp8Config reads it too)
                name = f"model.layers.{i}.self_attn.{kind}_proj.{kind}_scale"
                tensors[name] = torch.tensor(value, dtype=torch.float32)
    save_file(tensors, str(hf_dir / SCALES_SHARD), metadata={"format": "pt"})
    index = json.loads((hf_dir / INDEX).read_text())
    index["weight_map"].update(dict.fromkeys(tensors, SCALES_SHARD))
    (hf_dir / INDEX).write_text(json.dumps(index, indent=2))
    config = json.loads((hf_dir / "config.json").read_text())
    if target.writer == "compressed-tensors":
        q = config["quantization_config"]
        config["quantization_config"] = compressed_tensors_config(q, KV_CACHE_SCHEME_TENSOR)
    elif target.writer == "modelopt":
        _modelopt_kv(hf_dir, config)
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return hf_dir / SCALES_SHARD


def _modelopt_kv(hf_dir: Path, config: dict[str, Any]) -> None:
    """hf_quant_config.json's kv_cache_quant_algo FP8 and config.json's kv_cache_scheme, the latter
    from ModelOpt's own converter (ModelOpt 0.47 export/convert_hf_config.py)."""
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

    legacy = hf_dir / HF_QUANT_CONFIG
    doc = json.loads(legacy.read_text()) if legacy.is_file() else None
    if doc is not None:
        doc.setdefault("quantization", {})["kv_cache_quant_algo"] = "FP8"
        legacy.write_text(json.dumps(doc, indent=4))
    scheme = convert_hf_quant_config_format(
        doc or {"quantization": {"kv_cache_quant_algo": "FP8"}}
    )["kv_cache_scheme"]
    config["quantization_config"]["kv_cache_scheme"] = scheme


def _write_index(hf_dir: Path) -> None:
    """model.safetensors.index.json listing every shard's tensors (a single-file checkpoint gets
    one, so the loaders that follow an index find the scale shard too)."""
    from safetensors import safe_open

    path = hf_dir / INDEX
    if path.is_file():
        return
    weight_map = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            weight_map.update(dict.fromkeys(f.keys(), shard.name))  # noqa: SIM118
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))


def check_written(
    target: StoredCheckpoint, hf_dir: Path, k_scales: list[Any], v_scales: list[Any]
) -> dict[str, Any]:
    """hf/ as its engine reads it: the stored weight shards byte-identical to the user's (the same
    file, or a copy of equal SHA-256), the recognised format unchanged with the KV scheme now
    declared, and per layer exactly one k and one v scale with the calibrated values."""
    from trtkv.kvcache import validate_attn_head_export, validate_per_tensor_export

    problems = [
        f"{name}: differs from {target.model_dir / name}"
        for name in sorted(p.name for p in target.model_dir.glob("*.safetensors"))
        if not same_bytes(target.model_dir / name, hf_dir / name)
    ]
    notes: list[str] = []
    config = json_object(hf_dir / "config.json", "`trtkv calibrate <recipe> --force`")
    found = read_checkpoint_quant(config.get("quantization_config"), hf_dir, notes)
    # vLLM's Fp8Config reads k/v scales with no declaration (fp8.py get_quant_method)
    declared = target.writer == "fp8" or (found is not None and found.kv_cache)
    if found is None or found.stored_format != target.weights or not declared:
        problems.append(
            f"config.json is read as {found and found.source}, not {target.source} "
            "with an FP8 KV cache"
        )
    n = len(k_scales)
    if target.writer == "compressed-tensors":
        if k_scales and isinstance(k_scales[0], list):
            read = validate_attn_head_export(hf_dir, n, len(k_scales[0]))
        else:
            read = validate_per_tensor_export(hf_dir, n)
    else:
        read = per_layer_scales(hf_dir, n)
    for kind, want in (("k", k_scales), ("v", v_scales)):
        if not _close(read[f"{kind}_scales"], want):
            problems.append(f"{kind} scales read back {read[f'{kind}_scales']} != written {want}")
    if problems:
        raise StageError(
            f"{hf_dir}: the KV-only checkpoint is not what was meant, "
            f"{StageError.listing(problems)}\nNext: `trtkv calibrate <recipe> --force`."
        )
    return {
        "writer": target.writer,
        "weights": target.weights,
        "kv_cache": found.kv_cache if found else None,
        "weight_shards_unchanged": sorted(p.name for p in target.model_dir.glob("*.safetensors")),
        "num_layers": n,
    }


def stored_scales(
    hf_dir: Path, stored: StoredCheckpoint, layers: list[Any], model: Any, per_head: bool
) -> dict[str, Any]:
    """The calibrated scales written beside the stored weights (per layer, or per KV head for
    fp8_attn_head), then hf/ checked as its engine reads it."""
    from trtkv.kvcache import attn_head_scales, head_amax_from_channels

    k: list[Any] = [ls.k_scale for ls in layers]
    v: list[Any] = [ls.v_scale for ls in layers]
    if per_head:  # stored_checkpoint allows it for compressed-tensors only
        heads = int(model.config.num_key_value_heads)
        k = [attn_head_scales(head_amax_from_channels(ls.k_channel_amax, heads)) for ls in layers]
        v = [attn_head_scales(head_amax_from_channels(ls.v_channel_amax, heads)) for ls in layers]
    write_scales(stored, hf_dir, k, v)
    return check_written(stored, hf_dir, k, v)


def per_layer_scales(hf_dir: Path, num_layers: int) -> dict[str, Any]:
    """ModelOpt's self_attn.{k,v}_proj.{k,v}_scale across every shard: exactly one per layer."""
    from safetensors import safe_open

    found: dict[str, list[float]] = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                if name.endswith(("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale")):
                    found.setdefault(name, []).append(float(f.get_tensor(name).float()))
    out: dict[str, Any] = {"k_scales": [], "v_scales": []}
    for i in range(num_layers):
        for kind in "kv":
            seen = found.get(f"model.layers.{i}.self_attn.{kind}_proj.{kind}_scale", [])
            if len(seen) != 1:
                raise StageError(
                    f"{hf_dir}: layer {i} has {len(seen)} {kind}_proj.{kind}_scale tensors, want "
                    "one. Next: `trtkv calibrate <recipe> --force`."
                )
            out[f"{kind}_scales"].append(seen[0])
    return out


def _close(got: list[Any], want: list[Any]) -> bool:
    """Equal as float32 stores them (relative 1e-6)."""
    flat_got = [x for g in got for x in (g if isinstance(g, list) else [g])]
    flat_want = [x for w in want for x in (w if isinstance(w, list) else [w])]
    return len(flat_got) == len(flat_want) and all(
        abs(a - b) <= 1e-6 * abs(b) for a, b in zip(flat_got, flat_want, strict=True)
    )


def same_bytes(source: Path, copy: Path) -> bool:
    """`copy` is `source` itself (a hard link) or holds its bytes (equal SHA-256)."""
    import hashlib

    if not copy.is_file():
        return False
    if os.path.samefile(source, copy):
        return True
    digests = []
    for path in (source, copy):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        digests.append(digest.hexdigest())
    return digests[0] == digests[1]


STORED_NOTE = (
    "The weights as stored ({source}): not quantized again and not rewritten. hf/ holds the "
    "checkpoint's own safetensors shards (hard-linked, else copied; byte-identical), "
    f"{SCALES_SHARD} (or kv_attn_head_scales.safetensors per head) with the calibrated k/v "
    "scales under the names the {writer} loader maps to self_attn.attn, the index listing it, "
    "and the config declaring the KV scheme. K/V were calibrated on the weights dequantized as "
    "stored (ModelOpt's FP8QTensor / NVFP4QTensor), as the engine computes them."
)
