"""`trtkv calibrate` on a pre-quantized checkpoint with nothing to calibrate (a KV cache that takes
no scales, fp8_cast or 16-bit or an engine format; or KV scales the checkpoint carries and the
engine reads as they are): the checkpoint passed on as stored, so build, repo, serve and deploy read
it where they read every calibrate output. hf/ holds the user's safetensors shards hard-linked
(copied across file systems; byte-identical, checked) and their small files copied, never
re-quantized or rewritten (config.json gains the top-level RoPE fields transformers 4.x reads
where they are missing); tokenizer/, hf_config.json, kv_scales.json (the carried scales, or no
layers) and calibration_report.md beside it, as the stage contract lists."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtkv.calibrate.stored_kv import (
    StoredCheckpoint,
    link_checkpoint,
    per_layer_scales,
    same_bytes,
)
from trtkv.core.errors import StageError
from trtkv.recipe import Recipe, layout

FP8_MAX = 448.0  # E4M3's largest value: a stored k/v scale is amax / 448

NOTE = (
    "Served as stored: {why}. Nothing was calibrated and nothing quantized: hf/ is the checkpoint "
    "({source}) with its own safetensors shards hard-linked (else copied; byte-identical), its "
    "config and tokenizer files copied."
)


def pass_on(
    tmp: Path, recipe: Recipe, stored: StoredCheckpoint, log: Callable[[str], None]
) -> dict[str, Any]:
    """Write the stage's folder for a checkpoint served as stored; the manifest's body."""
    from trtkv.kvcache import scales as kv_scales

    shards = link_checkpoint(stored.model_dir, tmp / layout.HF)
    config = json.loads((stored.model_dir / "config.json").read_text())
    (tmp / layout.HF_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    served = legacy_rope_config(config)
    if served != config:  # a new file, never written through to the user's
        (tmp / layout.HF / "config.json").unlink()
        (tmp / layout.HF / "config.json").write_text(json.dumps(served, indent=2) + "\n")
    _save_tokenizer(stored.model_dir, tmp / layout.TOKENIZER)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    num_layers = int(text.get("num_hidden_layers") or 0)
    k, v = _carried_scales(recipe, stored, tmp / layout.HF, num_layers)
    kv_scales.kv_scales_document(
        "FP8" if k else None,
        [x * FP8_MAX for x in k],
        [x * FP8_MAX for x in v],
        num_layers=num_layers,
        source=f"the checkpoint's own k/v scales ({stored.source})" if k else None,
    ).save(tmp)
    unchanged = check_linked(stored.model_dir, tmp / layout.HF, shards)
    note = NOTE.format(why=stored.as_stored, source=stored.source)
    (tmp / "calibration_report.md").write_text(
        f"# Calibration report: {recipe.name}\n\n{note}\n\n"
        f"- weights: {stored.weights} ({stored.writer}), {len(shards)} shard(s) as stored\n"
        f"- KV cache: {recipe.quantization.kv_cache.value}"
        + (f", {len(k)} layers of the checkpoint's own scales" if k else ", no KV scales")
        + "\n"
    )
    log(
        f"calibrate: nothing to calibrate, the checkpoint served as stored ({stored.as_stored}); "
        f"{len(shards)} weight shard(s) linked unchanged into {layout.HF}/"
    )
    return {
        "calibration": None,
        "notes": [note],
        "validation": {
            "stored": {
                "writer": stored.writer,
                "weights": stored.weights,
                "as_stored": stored.as_stored,
                "weight_shards_unchanged": unchanged,
                "num_layers": num_layers,
            }
        },
        "model_dir": str(stored.model_dir),
    }


def legacy_rope_config(config: dict[str, Any]) -> dict[str, Any]:
    """config.json with the top-level RoPE fields transformers 4.x reads (TensorRT-LLM 1.x's LLM
    API pins 4.57: `rope_theta` / `rope_scaling`, Gemma 3's `rope_local_base_freq`) written in from
    the model's own `rope_parameters` where they are absent or differ, as calibrate's export of a
    16-bit model writes them (trtkv.calibrate.modelopt_export); the config itself otherwise."""
    from trtkv.checkpoints import rope
    from trtkv.checkpoints.hf_export import HF_ARCHITECTURES, gemma3_legacy_rope

    if config.get("architectures") == [HF_ARCHITECTURES["gemma3"]]:
        fields = gemma3_legacy_rope(config)
        if all(config.get(k, "absent") == v for k, v in fields.items()):
            return config
    elif rope.rope_problems(rope.from_hf(config), None, config):
        fields = rope.hf_legacy_fields(rope.from_hf(config))
    else:
        return config
    return {**config, **fields}


def check_linked(model_dir: Path, hf_dir: Path, shards: list[str]) -> list[str]:
    """The shard names, each the user's file itself (a hard link) or a byte-identical copy."""
    differ = [n for n in shards if not same_bytes(model_dir / n, hf_dir / n)]
    if differ:
        raise StageError(
            f"{hf_dir}: {', '.join(differ)} differ from {model_dir}'s. Next: "
            "`trtkv calibrate <recipe> --force`."
        )
    return shards


def _carried_scales(
    recipe: Recipe, stored: StoredCheckpoint, hf_dir: Path, num_layers: int
) -> tuple[list[float], list[float]]:
    """The per-layer k/v scales the checkpoint carries (kv_cache fp8 served with them); none for a
    KV cache that takes no scales."""
    from trtkv.kvcache import validate_per_tensor_export

    if recipe.kv_row.choice.checkpoint_algo is None:
        return [], []
    if stored.writer == "compressed-tensors":
        read = validate_per_tensor_export(hf_dir, num_layers)
    else:
        read = per_layer_scales(hf_dir, num_layers)
    return [float(x) for x in read["k_scales"]], [float(x) for x in read["v_scales"]]


def _save_tokenizer(model_dir: Path, out: Path) -> None:
    """tokenizer/ as the other calibrate outputs hold it (Triton's pre/postprocessing read it)."""
    from transformers import AutoTokenizer

    from trtkv.checkpoints.tokenizer_files import save_tokenizer

    save_tokenizer(AutoTokenizer.from_pretrained(str(model_dir)), out)
