"""A checkpoint's own quantization, recognised from its files: the weight format of each tensor
group (experts, attention, embeddings, other) and the KV cache scheme it declares.

Read as the engines read them (vLLM 0.32 `model_executor/layers/quantization/`: modelopt.py,
compressed_tensors/, fp8.py, mxfp4.py, awq/gptq):
- ModelOpt: config.json `quantization_config` with `quant_method: modelopt` (`quant_algo`, `ignore`,
  `kv_cache_scheme`; ModelOpt 0.47 `export/convert_hf_config.py`) and/or `hf_quant_config.json`
  (`quantization.quant_algo`, `kv_cache_quant_algo`, `group_size`, `exclude_modules`): FP8 (per
  tensor, per channel, 128x128 blocks), NVFP4, W4A16 NVFP4, W4A16 / W4A8 AWQ, MXFP8.
- compressed-tensors (llm-compressor): `config_groups` (each group's `weights`: num_bits, type,
  strategy, group_size, block_structure), `ignore`, `kv_cache_scheme` (strategy tensor or
  attn_head).
- `quant_method` fp8 (per tensor, or DeepSeek/Qwen `weight_block_size` blocks), mxfp4 (gpt-oss:
  experts only, `modules_to_not_convert`), awq, gptq (`bits`, `group_size`).
Every value is untrusted: only words of the closed sets below and checked integers reach the
result.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

from trtkv.checkpoints.hf_config_fields import positive_int, read_object
from trtkv.checkpoints.model_facts import StoredQuant
from trtkv.kvcache.engines import load_table

HF_QUANT_CONFIG = "hf_quant_config.json"
MAX_QUANT_CONFIG_BYTES = 16 * 1024 * 1024  # a per-layer MIXED_PRECISION list stays far below
GROUPS = ("experts", "attention", "embeddings", "other")
UNQUANTIZED = "unquantized"
_ALGO_WORD = re.compile(r"[A-Za-z0-9_]{1,32}")  # a kv_cache_quant_algo as ModelOpt spells one
# a module name of each group, matched against the checkpoint's ignore / exclude patterns
_PROBES = {
    "experts": ("model.layers.0.mlp.experts.0.down_proj", "model.layers.0.mlp.experts"),
    "attention": ("model.layers.0.self_attn.o_proj", "model.layers.0.self_attn"),
    "embeddings": ("lm_head", "model.embed_tokens"),
    "other": ("model.layers.0.mlp.down_proj", "model.layers.0.mlp"),
}
# ModelOpt quant_algo -> (weight format, bytes per weight with its scales, what it is)
MODELOPT_ALGOS = {
    "FP8": ("fp8", 1.0, "FP8 E4M3, one scale per tensor"),
    "FP8_PER_CHANNEL_PER_TOKEN": ("fp8", 1.0, "FP8 E4M3, one scale per output channel"),
    "FP8_PB_WO": ("fp8_block", 1 + 4 / (128 * 128), "FP8 E4M3, one float32 scale per 128x128"),
    "MXFP8": ("mxfp8", 1 + 1 / 32, "MXFP8: E4M3 + one E8M0 scale per 32"),
    "NVFP4": ("nvfp4", 0.5 + 1 / 16, "NVFP4: E2M1 + one E4M3 scale per 16 (+ a global scale)"),
    "W4A16_NVFP4": ("nvfp4", 0.5 + 1 / 16, "NVFP4 weights only: E2M1 + one E4M3 scale per 16"),
    # ModelOpt 0.47 stores the AWQ scales in float32, one per group (its export of a bf16 model)
    "W4A16_AWQ": ("int4_awq", 0.5 + 4 / 128, "INT4 AWQ: packed int4 + one float32 scale per group"),
    "W4A8_AWQ": ("int4_awq", 0.5 + 4 / 128, "INT4 AWQ weights, FP8 activations"),
}


def kv_algo_words(algo: str) -> str | None:
    """What a checkpoint's kv_cache_quant_algo stores, in words ("fp8 per tensor", "nvfp4"): the
    calibrated row of the KV-format registry that writes it; None: no row does."""
    row = load_table().for_checkpoint_algo(algo.upper())
    if row is None or row.storage is None:
        return None
    return row.name if row.storage.group_size else f"{row.name} per tensor"


def declared_kv_algo(folder: Path, declared: str | None) -> str | None:
    """The KV-cache format the checkpoint in `folder` declares, as TensorRT-LLM's LLM API reads it
    (llmapi/llm_utils.py ModelLoader._update_from_hf_quant_config): hf_quant_config.json's
    kv_cache_quant_algo where that file is present (ModelOpt's spellings of none: none, null, ""),
    else `declared`, what config.json's quantization_config declares (StoredQuant.kv_cache; vLLM
    0.32 reads that one first, ModelOpt writes the two alike); None: no KV quantization."""
    data = _hf_quant_config(folder)
    if data is None:
        return declared
    body = data.get("quantization")
    algo = body.get("kv_cache_quant_algo") if isinstance(body, dict) else None
    if not isinstance(algo, str) or algo.strip().lower() in ("none", "null", ""):
        return None
    return algo.strip() if _ALGO_WORD.fullmatch(algo.strip()) else _word(algo)


def read_checkpoint_quant(quant: Any, folder: Path | None, notes: list[str]) -> StoredQuant | None:
    """The checkpoint's quantization (config.json's `quantization_config`, else the folder's
    hf_quant_config.json); None for a 16-bit checkpoint. A method trtkv does not know is a note,
    priced at the recipe's precision."""
    hf_quant = _hf_quant_config(folder)
    if not isinstance(quant, dict):
        quant = {}
    method = str(quant.get("quant_method") or quant.get("quant_algo") or "").lower()
    if method.startswith("modelopt") or (not method and hf_quant is not None):
        return _modelopt(quant if method else {}, hf_quant, notes)
    if method == "compressed-tensors":
        return _compressed_tensors(quant, notes)
    if not method:
        return None
    if method == "fp8":
        block = quant.get("weight_block_size")
        ignored = _ignored(quant.get("ignored_layers") or quant.get("modules_to_not_convert"))
        if isinstance(block, list) and len(block) == 2 and all(positive_int(b) for b in block):
            per = 1 + 4 / (block[0] * block[1])  # one float32 scale per block
            return _result(
                "fp8",
                "fp8_block",
                per,
                ignored,
                f"quantization_config fp8, {block[0]}x{block[1]} blocks",
                None,
            )
        return _result(
            "fp8", "fp8", 1.0, ignored, "quantization_config fp8, per-tensor scales", None
        )
    if method == "mxfp4":
        return StoredQuant(
            "mxfp4",
            0.5 + 1 / 32,
            "experts",
            "quantization_config mxfp4 (E2M1 + one E8M0 scale per 32; attention, router, "
            "embeddings unquantized)",
            formats=_formats({"experts": "mxfp4"}),
        )
    if method in ("awq", "gptq") and positive_int(quant.get("bits")):
        bits, group = int(quant["bits"]), positive_int(quant.get("group_size")) or 128
        return _result(
            method,
            f"int{bits}_{method}",
            bits / 8 + 4 / group,
            _ignored(quant.get("modules_to_not_convert")),
            f"quantization_config {method} {bits}-bit, group {group} (fp16 scale + zero)",
            None,
        )
    notes.append(
        f"quantization_config quant_method {method}: not priced as stored (trtkv knows modelopt, "
        "compressed-tensors, fp8, mxfp4, awq, gptq); weights priced at the recipe's precision."
    )
    return None


def _modelopt(
    quant: dict[str, Any], hf_quant: dict[str, Any] | None, notes: list[str]
) -> StoredQuant | None:
    """ModelOpt's export. config.json's quantization_config wins where both files are present
    (vLLM 0.32 transformers_utils/config.py reads hf_quant_config.json only when config.json has
    none; ModelOpt >= 0.31 writes both, alike); the legacy file's group_size completes it."""
    legacy = hf_quant.get("quantization") if hf_quant is not None else None
    legacy = legacy if isinstance(legacy, dict) else {}
    if quant:
        algo, ignore, where = quant.get("quant_algo"), quant.get("ignore"), "config.json"
        scheme = quant.get("kv_cache_scheme")
        kv = scheme if isinstance(scheme, str) else _kv_scheme(scheme)
        group = positive_int(quant.get("group_size")) or positive_int(legacy.get("group_size"))
    else:
        algo, kv = legacy.get("quant_algo"), legacy.get("kv_cache_quant_algo")
        ignore, where = legacy.get("exclude_modules"), HF_QUANT_CONFIG
        group = positive_int(legacy.get("group_size"))
    kv_word = kv_algo_words(kv) if isinstance(kv, str) else None
    if kv_word is None and isinstance(kv, str) and kv.startswith(("fp8 ", "int8 ")):
        kv_word = kv  # already read from a compressed-tensors style kv_cache_scheme
    if not algo and kv_word:
        why = f"ModelOpt, no weight quantization (KV cache {kv_word} only; {where})"
        return _kv_only("modelopt", why, kv_word)
    row = MODELOPT_ALGOS.get(str(algo).upper()) if isinstance(algo, str) else None
    if row is None:
        notes.append(
            f"{where}: ModelOpt quant_algo {_word(algo)} is not priced as stored (trtkv knows "
            f"{', '.join(MODELOPT_ALGOS)}); weights priced at the recipe's precision."
        )
        return None
    fmt, per, what = row
    if group and fmt == "int4_awq":
        per = 0.5 + 4 / group
    return _result(
        "modelopt",
        fmt,
        per,
        _ignored(ignore),
        f"ModelOpt {str(algo).upper()} ({what}; {where})",
        kv_word,
    )


def _compressed_tensors(quant: dict[str, Any], notes: list[str]) -> StoredQuant | None:
    """llm-compressor's compressed-tensors config: the first config group with weights sets the
    format (a checkpoint with several is priced by its first, and says so)."""
    groups = quant.get("config_groups")
    kv = _kv_scheme(quant.get("kv_cache_scheme"))
    weighted = (
        [g for g in groups.values() if isinstance(g, dict) and isinstance(g.get("weights"), dict)]
        if isinstance(groups, dict)
        else []
    )
    if not weighted:
        if kv is None:
            return None
        # a KV-only export (trtkv.kvcache.attn_head writes one): weights as stored in 16 bits
        why = f"compressed-tensors, no weight groups (KV cache {kv} only)"
        return _kv_only("compressed-tensors", why, kv)
    w = weighted[0]["weights"]
    bits, kind = positive_int(w.get("num_bits")), w.get("type")
    strategy = w.get("strategy") if isinstance(w.get("strategy"), str) else "tensor"
    group = positive_int(w.get("group_size"))
    if bits == 8 and kind == "float":
        block = w.get("block_structure")
        if strategy == "block" and isinstance(block, list) and all(positive_int(b) for b in block):
            fmt, per, what = (
                "fp8_block",
                1 + 4 / _block_area(block),
                f"FP8 {block[0]}x{block[1]} blocks",
            )
        else:
            fmt, per, what = "fp8", 1.0, f"FP8 per {strategy}"
    elif bits == 4 and kind == "float":
        fmt, per, what = "nvfp4", 0.5 + 1 / (group or 16), f"NVFP4, group {group or 16}"
    elif bits in (4, 8) and kind == "int":
        fmt = f"int{bits}"
        per = bits / 8 + (2 / group if strategy == "group" and group else 0.0)
        what = f"INT{bits} per {strategy}" + (f", group {group}" if group else "")
    else:
        notes.append(
            f"compressed-tensors weights num_bits {bits} type {_word(kind)}: not priced as "
            "stored; weights priced at the recipe's precision."
        )
        return None
    if len(weighted) > 1:
        what += f"; {len(weighted) - 1} further config group(s) priced alike"
    return _result(
        "compressed-tensors",
        fmt,
        per,
        _ignored(quant.get("ignore")),
        f"compressed-tensors {what}",
        kv,
    )


def _block_area(block: list[int]) -> int:
    return int(block[0]) * int(block[1])


def _kv_scheme(scheme: Any) -> str | None:
    """compressed-tensors' kv_cache_scheme (ModelOpt writes the same shape): "fp8 per tensor",
    "fp8 per head", "int8 per tensor"; None when absent or not one of these."""
    if not isinstance(scheme, dict):
        return None
    bits, kind = scheme.get("num_bits"), scheme.get("type")
    strategy = {"tensor": "per tensor", "attn_head": "per head", None: "per tensor"}.get(
        scheme.get("strategy") if isinstance(scheme.get("strategy"), str) else None
    )
    if bits == 8 and kind in ("float", "int") and strategy:
        return f"{'fp8' if kind == 'float' else 'int8'} {strategy}"
    return None


def _result(
    method: str, fmt: str, per: float, ignored: list[str], source: str, kv: str | None
) -> StoredQuant:
    """Every linear group in `fmt` but the ignored ones; embeddings stay unquantized unless the
    format names them (no format here does)."""
    formats = {
        g: fmt
        for g in GROUPS
        if g != "embeddings" and not any(_matches(p, n) for p in ignored for n in _PROBES[g])
    }
    return StoredQuant(method, per, "linear", source, formats=_formats(formats), kv_cache=kv)


def _kv_only(method: str, source: str, kv: str) -> StoredQuant:
    """A KV-only export: 16-bit weights with the KV scales beside them."""
    return StoredQuant(method, 2.0, "none", source, formats=_formats({}), kv_cache=kv)


def _formats(quantized: dict[str, str]) -> dict[str, str]:
    return {g: quantized.get(g, UNQUANTIZED) for g in GROUPS}


def _ignored(value: Any) -> list[str]:
    """The ignore / exclude patterns as strings (anything else is dropped)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _matches(pattern: str, name: str) -> bool:
    """compressed-tensors' `re:` regexes (re.match), ModelOpt's fnmatch globs, vLLM's prefixes."""
    if pattern.startswith("re:"):
        try:
            return re.match(pattern[3:], name) is not None
        except re.error:
            return False
    return fnmatch.fnmatchcase(name, pattern) or name == pattern or name.endswith("." + pattern)


def _word(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _hf_quant_config(folder: Path | None) -> dict[str, Any] | None:
    """The folder's hf_quant_config.json (ModelOpt's legacy file), read as untrusted JSON."""
    if folder is None or not (folder / HF_QUANT_CONFIG).exists():
        return None
    return read_object(
        folder / HF_QUANT_CONFIG,
        MAX_QUANT_CONFIG_BYTES,
        "ModelOpt quantization config",
        "export the checkpoint again, or remove the file if the weights are 16-bit",
    )
