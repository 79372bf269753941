"""Backend `reference`: no engine is compiled. The build stage writes `runtime.json` pointing at the
TensorRT-LLM checkpoint, and trtkv's CPU runtime (trtkv.runtime) executes it in PyTorch, read as
TensorRT-LLM reads it, with the KV cache stored in the quantized format; the bundled tritonserver
serves it. A correctness reference, not TensorRT.

Where calibrate wrote no TensorRT-LLM checkpoint but an HF export (`checkpoint/hf/`: Gemma 3, which
the engine path does not take), runtime.json points at that export (`hf_checkpoint`) and the runtime
reads it as TensorRT-LLM's PyTorch backend does (ReferenceRuntime.load_hf: FP8 weights x
weight_scale, FP8 KV with scale 1.0).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtkv.backends.base import (
    BUILD_SECTIONS,
    EnsembleLayout,
    RefusingRunner,
    TritonServing,
    log_text,
    prepare_checkpoint,
)
from trtkv.backends.seam import BuildJob, EngineBackend, MemoryRule, TokenizerSource
from trtkv.checkpoints import models as model
from trtkv.engines.pool import ServedPool
from trtkv.engines.reference import REFERENCE_LOG, no_knobs, reference_log_pool, reference_pool
from trtkv.recipe import Backend, Recipe, layout
from trtkv.recipe.layout import kv_cache_quant_algo

RUNTIME_JSON = "runtime.json"
HF_CONFIG, HF, TOKENIZER = layout.HF_CONFIG, layout.HF, layout.TOKENIZER
ACTIVATIONS_NOTE = (
    "activations are not quantized by the reference runtime (the checkpoint's "
    "activation_scaling_factor tensors are ignored; GEMMs run in float32 on dequantized weights)"
)


def _hf_config_source(ckpt: Path) -> Path | None:
    """The HF config.json describing the checkpoint's model (rope, norms): the copy calibrate saves,
    else the HF export. Never resolves the model (an INT8-KV checkpoint has no hf/, and resolving
    may convert or download)."""
    for path in (ckpt / HF_CONFIG, ckpt / HF / "config.json", ckpt / TOKENIZER / "config.json"):
        if path.is_file():
            return path
    return None


def _tokenizer_dir(recipe: Recipe, ckpt: Path) -> Path | None:
    """The checkpoint's tokenizer copy, else the HF export's, else the model folder when it is on
    disk already."""
    for folder in (ckpt / TOKENIZER, ckpt / HF):
        if (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file():
            return folder
    local = model.local_model_dir(recipe)
    return local if local is not None and (local / "tokenizer_config.json").is_file() else None


def hf_export_only(ckpt: Path) -> Path | None:
    """The HF export to serve when `ckpt` holds no TensorRT-LLM checkpoint (no rank0.safetensors)
    but `hf/`."""
    hf = ckpt / HF
    if not (ckpt / "rank0.safetensors").is_file() and (hf / "config.json").is_file():
        return hf
    return None


def _hf_settings(recipe: Recipe, ckpt: Path, hf: Path, tmp: Path) -> dict[str, Any]:
    """runtime.json for an HF export; the recipe's KV format must be the export's (FP8 or none)."""
    from trtkv.core.errors import StageError
    from trtkv.runtime import hf_checkpoint

    algo = kv_cache_quant_algo(recipe)
    _, exported = hf_checkpoint.quant_config(hf)
    if algo != exported:
        raise StageError(
            f"{hf}: kv_cache_quant_algo {exported!r} but recipe {recipe.name} asks "
            f"quantization.kv_cache -> {algo!r}, and {ckpt} has no TensorRT-LLM checkpoint "
            "(rank0.safetensors) for the engine path. An HF export carries FP8 or no KV scales; "
            f"allowed here: fp8, none. Next: `trtkv calibrate {recipe.name} --force`, or set "
            "quantization.kv_cache to fp8 or none."
        )
    return _settings(
        recipe,
        ckpt,
        # the relative path is used when the engines folder has moved
        {"hf_checkpoint": str(hf), "hf_checkpoint_relative": os.path.relpath(hf, tmp)},
        {},
        "TensorRT-LLM PyTorch backend on the HF export: FP8 KV with scale 1.0 (the exported "
        "k_scale/v_scale, amax/448, are kept for kv_format fp8: vLLM's semantics)",
    )


def _settings(
    recipe: Recipe, ckpt: Path, read: dict[str, Any], config: dict[str, Any], semantics: str
) -> dict[str, Any]:
    """runtime.json: what the runtime reads (`read`, then the tokenizer, then `config`), the
    recipe's limits and the KV scales' meaning."""
    tokenizer = _tokenizer_dir(recipe, ckpt)
    return {
        "backend": "reference",
        **read,
        "tokenizer": str(tokenizer) if tokenizer else None,
        **config,
        "kv_cache_quant_algo": kv_cache_quant_algo(recipe),
        "max_seq_len": recipe.build.max_seq_len,
        "max_batch_size": recipe.build.max_batch_size,
        "max_num_tokens": recipe.build.max_num_tokens,
        "enable_chunked_context": recipe.chunked_context,
        "compute_dtype": "float32",
        "kv_scale_semantics": semantics,
        "activations": ACTIVATIONS_NOTE,
    }


def _smoke(tmp: Path, settings: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """Write runtime.json, then load the runtime from `tmp` and decode one token as a check."""
    from trtkv.runtime import ReferenceRuntime

    (tmp / RUNTIME_JSON).write_text(json.dumps(settings, indent=2) + "\n")
    runtime = ReferenceRuntime.load(tmp)
    prompt = [runtime.bos_token_id if runtime.bos_token_id is not None else 0]
    first = runtime.generate(prompt, max_tokens=1)
    log(
        f"build: reference runtime loaded ({runtime.num_layers} layers, KV {runtime.kv_format}); "
        f"smoke token {first}"
    )
    return {
        "backend": "reference",
        "runtime": settings,
        "kv_format": runtime.kv_format,
        "kv_scales": runtime.kv_scales,
        "smoke_token": first,
    }


class ReferenceBackend(RefusingRunner):
    """The build and `trtkv generate` of the reference runtime."""

    sections = BUILD_SECTIONS

    def kv_source_line(self, recipe: Recipe) -> str:
        from trtkv.recipe.backend_rules import HF_EXPORT_ONLY

        algo = kv_cache_quant_algo(recipe)
        if recipe.model.architecture.lower() in HF_EXPORT_ONLY:
            return (
                f"KV cache: {algo or 'unquantized'}, from the HF export's hf_quant_config.json "
                "kv_cache_quant_algo (no TensorRT-LLM checkpoint for "
                f"{recipe.model.architecture}); FP8 with scale 1.0 as TensorRT-LLM's PyTorch "
                "backend reads it (the exported k_scale/v_scale are not applied); "
                f"{ACTIVATIONS_NOTE}"
            )
        return (
            f"KV cache: {algo or 'unquantized'}, from checkpoint config "
            "quantization.kv_cache_quant_algo, with the per-layer kv_cache_scaling_factor of "
            f"rank0.safetensors (one scale shared by K and V, as TensorRT-LLM); {ACTIVATIONS_NOTE}"
        )

    def prepare(self, recipe: Recipe) -> tuple[Path, dict[str, Any]]:
        """The TensorRT-LLM checkpoint, validated; or, where calibrate wrote none (Gemma 3), its HF
        export, validated as the llmapi backend validates it (the runtime reads that export:
        _hf_settings)."""
        from trtkv.backends import llmapi
        from trtkv.recipe.backend_rules import HF_EXPORT_ONLY

        if recipe.model.architecture.lower() in HF_EXPORT_ONLY:
            return llmapi.BACKEND.builder.prepare(recipe)
        return prepare_checkpoint(recipe)

    def build(self, job: BuildJob) -> dict[str, Any]:
        """Write runtime.json (+ the HF config), then load the runtime from `tmp` and decode one
        token as a check."""
        recipe, ckpt, tmp, log = job.recipe, job.ckpt, job.tmp, job.log
        hf = hf_export_only(ckpt)
        if hf is not None:
            log(
                f"build: {ckpt} has no TensorRT-LLM checkpoint; the reference runtime reads the HF "
                f"export {hf}"
            )
            return _smoke(tmp, _hf_settings(recipe, ckpt, hf, tmp), log)
        hf_config = _hf_config_source(ckpt)
        if hf_config is not None:
            shutil.copyfile(hf_config, tmp / HF_CONFIG)
        else:
            log(
                f"build: no HF config.json in {ckpt} (rope scaling, norms): the runtime derives "
                "the model config from the TensorRT-LLM config.json alone. Rerun `trtkv calibrate "
                f"{recipe.name} --force` to save one."
            )
        settings = _settings(
            recipe,
            ckpt,
            {"checkpoint": str(ckpt), "checkpoint_relative": os.path.relpath(ckpt, tmp)},
            {
                "hf_config": HF_CONFIG if hf_config else None,
                "hf_config_source": str(hf_config) if hf_config else None,
            },
            "TensorRT-LLM <= 1.2: one per-layer kv_cache_scaling_factor shared by K and V "
            "(dequantization multiplier; FP8 export clamps it to >= 1.0)",
        )
        return _smoke(tmp, settings, log)

    def dry_run_lines(self, recipe: Recipe, ckpt: Path, out: Path) -> list[str]:
        return [
            f"  write {out / RUNTIME_JSON} (checkpoint {ckpt}, max_seq_len "
            f"{recipe.build.max_seq_len}), then load it with trtkv.runtime.ReferenceRuntime and "
            "decode one token (CPU, float32; weights dequantized, "
            f"{ACTIVATIONS_NOTE.split(' (')[0]})"
        ]

    def describe_local_generate(
        self, recipe: Recipe, max_tokens: int, checkpoint: Path | None
    ) -> str:
        ckpt = checkpoint or layout.checkpoint_dir(recipe)
        return (
            f"reference runtime: {layout.engine_dir(recipe)}/runtime.json on checkpoint {ckpt} "
            f"(CPU, greedy, {max_tokens} tokens)"
        )

    def local_generate(
        self, recipe: Recipe, prompt: str, max_tokens: int, checkpoint: Path | None
    ) -> str:
        from trtkv.core.errors import StageError
        from trtkv.runtime import ReferenceRuntime

        engine = layout.engine_dir(recipe)
        if not (engine / RUNTIME_JSON).is_file():
            raise StageError(
                f"{engine}/{RUNTIME_JSON}: missing. Next: `trtkv build {recipe.name}` (after "
                f"`trtkv calibrate {recipe.name}`), or `make engine RECIPE={recipe.name}`."
            )
        if checkpoint is not None and not (Path(checkpoint) / "config.json").is_file():
            raise StageError(
                f"--checkpoint {checkpoint}: no config.json there (a TensorRT-LLM checkpoint "
                "folder)."
            )
        runtime = ReferenceRuntime.load(engine, checkpoint=checkpoint)
        return runtime.generate_text(prompt, max_tokens=max_tokens)


class ReferenceLayout(EnsembleLayout):
    llm_model = ("tensorrt_llm/config.reference.pbtxt", "tensorrt_llm/tensorrt_llm_reference.py")
    tokenizer = TokenizerSource.COPY  # the CPU repository carries its own tokenizer copy

    def summary(self, recipe: Recipe) -> str:
        return (
            f"Python model running trtkv's CPU reference runtime on `{layout.engine_dir(recipe)}` "
            f"({recipe.triton.instance_count} instance(s), one request each at a time)"
        )


_PARTS = ReferenceBackend()


def served_pool(recipe: Recipe, http: str, log: Path | None) -> ServedPool | None:
    """The pool the reference runtime's Triton model reports when it loads (REFERENCE_POOL_LINE in
    the server log): max_batch_size requests of max_seq_len tokens at its KV format's bytes per
    token."""
    found = reference_log_pool(log_text(log, REFERENCE_LOG))
    if found is None:
        return None
    return ServedPool(
        found[0], found[1], "reference runtime log: 'trtkv reference runtime KV pool: N bytes'"
    )


BACKEND = EngineBackend(
    Backend.REFERENCE,
    _PARTS,
    ReferenceLayout(),
    TritonServing(),
    _PARTS,
    gpu_engine=False,
    memory=MemoryRule(reference_pool, no_knobs, served=served_pool),
)
