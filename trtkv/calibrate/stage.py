"""The calibrate stage itself: resolve and load the model, build the calibration batches, quantize,
export, write the scales and the report, validate, all into a temporary folder renamed into place
(trtkv.contracts.stage.run_stage)."""

from __future__ import annotations

import hashlib
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.calibrate.as_stored import pass_on
from trtkv.calibrate.common import PER_TENSOR_NOTE, STAGE, ModelLoader, trtllm_export_refused
from trtkv.calibrate.describe import passes_on, supported_problems
from trtkv.calibrate.modelopt_export import (
    build_quant_cfg,
    check_exported_factors,
    check_exported_hf_scales,
    export_hf,
    export_trtllm,
    quantize,
    write_rope,
)
from trtkv.calibrate.report import render_report
from trtkv.calibrate.stored_kv import (
    STORED_NOTE,
    StoredCheckpoint,
    link_checkpoint,
    stored_checkpoint,
    stored_scales,
)
from trtkv.checkpoints.tokenizer_files import TOKENIZER_FILES_VERSION, save_tokenizer
from trtkv.core.errors import StageError
from trtkv.kvcache import scales as kv_scales
from trtkv.recipe import KVCacheQuant, Recipe, kv_only_compressed_tensors, layout
from trtkv.recipe.layout import checkpoint_dir

if TYPE_CHECKING:
    import torch


# ---------------------------------------------------------------------------------------------
# The stage


def calibrate(
    recipe: Recipe,
    *,
    force: bool = False,
    loader: ModelLoader | None = None,
    log: Callable[[str], None] = print,
) -> Any:
    """Run the calibrate stage (skipped when up to date); returns
    trtkv.contracts.stage.StageResult."""
    from trtkv.contracts.stage import VERSIONED_TOOLS, run_stage

    problems = [] if passes_on(recipe) else supported_problems(recipe)
    if problems:
        raise StageError(
            f"calibrate {recipe.name}: cannot run:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    files = _dataset_files(recipe)
    # tokenizer_files: a checkpoint whose tokenizer/ and hf/ an older trtkv wrote (transformers 5
    # only) is redone
    extra_key = {
        "build": {"tp_size": recipe.build.tp_size, "pp_size": recipe.build.pp_size},
        "dataset_sha256": _files_hash(files),
        "tokenizer_files": TOKENIZER_FILES_VERSION,
    }
    if kv_only_compressed_tensors(recipe):  # hf/'s form follows the engine (keyed only then)
        extra_key["hf_kv_form"] = "compressed-tensors tensor"

    def work(tmp: Path) -> dict[str, Any]:
        # Only when the checkpoint is not up to date: resolving may convert the packaged model or
        # try a hub.
        model_dir, stored = None, None
        chosen = loader
        if chosen is None:
            # fails fast (hub id offline, missing package, a stored format it cannot write KV
            # scales beside) before heavy work
            model_dir = _resolve_model(recipe)
            stored = stored_checkpoint(recipe, model_dir)
            _check_memory(recipe)
            if stored is not None and stored.as_stored:  # nothing to calibrate: passed on
                return pass_on(tmp, recipe, stored, log)
            chosen = default_loader if stored is None else _dequantized_loader(stored)
        return _calibrate_into(tmp, recipe, chosen, model_dir, log, stored)

    return run_stage(
        STAGE,
        recipe,
        checkpoint_dir(recipe),
        work,
        force=force,
        extra_key=extra_key,
        log=log,
        sections=("model", "quantization", "calibration"),
        versioned_tools=VERSIONED_TOOLS,
    )


def _dataset_files(recipe: Recipe) -> list[Path]:
    from trtkv.core.texts import resolve_files

    return resolve_files(recipe.calibration.dataset)


def _files_hash(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _resolve_model(recipe: Recipe) -> Path:
    from trtkv.checkpoints.models import resolve_model_dir

    try:
        return resolve_model_dir(recipe)
    except StageError as exc:
        raise StageError(
            f"calibrate {recipe.name}: the model cannot be resolved, nothing was "
            f"calibrated.\n{exc}\n(`trtkv calibrate {recipe.name} --dry-run` shows what would run.)"
        ) from exc


def _dequantized_loader(stored: StoredCheckpoint) -> ModelLoader:
    """The stored checkpoint's model, its weights dequantized as stored (the engine runs those)."""
    from trtkv.calibrate.dequantize import load_dequantized

    return lambda _recipe: load_dequantized(stored.model_dir, stored.block)


def _check_memory(recipe: Recipe) -> None:
    """Refuse early when the fp32 model cannot fit in this machine's memory (CPU calibration)."""
    params = recipe.model.num_parameters
    available = _mem_available_bytes()
    if params is None or available is None:
        return
    need = params * 4 * 1.3  # fp32 weights + fake-quant activations
    if need > available and not _cuda_available():
        raise StageError(
            f"calibrate {recipe.name}: model.num_parameters = {params:.3g} needs about "
            f"{need / 2**30:.0f} GiB in fp32 on the CPU, only {available / 2**30:.0f} GiB is "
            "available and no CUDA device is visible. Next: calibrate on a GPU machine "
            f"(hardware.gpu = {recipe.hardware.gpu.value}), then copy "
            f"engines/{recipe.name}/checkpoint/ here."
        )


def _mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def default_loader(recipe: Recipe) -> tuple[Any, Any]:
    """The recipe's HF model and its tokenizer: float32 on the CPU (speed; it also holds Gemma's
    activations, which overflow float16), the recipe dtype on a GPU (bfloat16 for Gemma: calibrate
    refuses float16 for it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = _resolve_model(recipe)
    if torch.cuda.is_available():
        dtype = getattr(torch, recipe.model.dtype.value)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, device_map="auto")
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return model.eval(), tokenizer


def _calibrate_into(
    tmp: Path,
    recipe: Recipe,
    loader: ModelLoader,
    model_dir: Path | None,
    log: Callable[[str], None],
    stored: StoredCheckpoint | None = None,
) -> dict[str, Any]:
    """The stage's work: load, sample, calibrate, export (or link the stored weights), write scales
    and report, validate."""
    import torch

    start = time.time()
    torch.manual_seed(recipe.calibration.seed)
    model, tokenizer = loader(recipe)
    load_s = time.time() - start
    calib_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    _save_hf_config(model, model_dir, tmp / layout.HF_CONFIG)
    batches = calibration_batches(tokenizer, recipe)
    stats_md, stats_note = _kv_statistics(model, batches)
    t0, cpu0 = time.time(), time.process_time()
    quant_cfg, kv_notes = build_quant_cfg(recipe)
    layers = quantize(model, quant_cfg, batches, recipe)
    num_layers = int(model.config.num_hidden_layers)
    calib_s, calib_cpu_s = time.time() - t0, time.process_time() - cpu0
    t0 = time.time()
    if stored is None:
        notes, refused = _export(tmp, recipe, model, tokenizer)
    else:  # the weights as stored: linked beside the new KV scales, never exported again
        link_checkpoint(stored.model_dir, tmp / layout.HF)
        notes = [STORED_NOTE.format(source=stored.source, writer=stored.writer)]
        save_tokenizer(tokenizer, tmp / layout.TOKENIZER)
    notes = kv_notes + notes
    export_s = time.time() - t0
    # kv_scales.json (trtkv.contracts.artifacts.KVScalesFile); kv_cache none: no layers, num_layers
    # still given
    kv_scales.kv_scales_document(
        recipe.kv_row.choice.checkpoint_algo,
        [ls.k_amax for ls in layers],
        [ls.v_amax for ls in layers],
        num_layers=num_layers,
    ).save(tmp)
    if stored is None:
        summary = _validate_export(tmp, recipe, layers, model, refused, notes)
    else:
        per_head = recipe.quantization.kv_cache is KVCacheQuant.FP8_ATTN_HEAD
        summary = {"stored": stored_scales(tmp / layout.HF, stored, layers, model, per_head)}
    timing = {
        "load_s": round(load_s, 2),
        "calibration_s": round(calib_s, 2),
        "calibration_cpu_s": round(calib_cpu_s, 2),
        "export_s": round(export_s, 2),
        "total_s": round(time.time() - start, 2),
        "peak_rss_mib": _peak_rss_mib(),
        "tokens": recipe.calibration.num_samples * recipe.calibration.seq_len,
        "batches": len(batches),
        "calibration_dtype": calib_dtype,
    }
    # Gemma 3: sliding_attention / full_attention per layer
    kinds = getattr(model.config, "layer_types", None)
    report = render_report(
        recipe,
        layers,
        timing,
        notes,
        stats_md,
        stats_note,
        model_dir,
        [str(k) for k in kinds] if isinstance(kinds, list) else None,
    )
    (tmp / "calibration_report.md").write_text(report)
    kv = (
        f"{len(layers)} KV scale layers" if layers else f"{num_layers} layers, KV cache unquantized"
    )
    checked = (
        f"{len(summary['ranks'])} rank file(s)"
        if "ranks" in summary
        else f"the weights as stored, {stored.writer} KV scales beside them"
        if stored is not None
        else "HF export only: no TensorRT-LLM checkpoint for this architecture"
    )
    log(
        f"calibrate: {kv}, {timing['tokens']} tokens in {calib_s:.1f} s "
        f"({timing['calibration_dtype']}, peak RSS {timing['peak_rss_mib']:.0f} MiB); checkpoint "
        f"validated ({checked})"
    )
    return {
        "calibration": timing,
        "modelopt_quant_cfg": quant_cfg,
        "notes": notes,
        "validation": summary,
        "model_dir": str(model_dir) if model_dir else None,
    }


def _export(tmp: Path, recipe: Recipe, model: Any, tokenizer: Any) -> tuple[list[str], str | None]:
    """ModelOpt's exports of the calibrated 16-bit model: the TensorRT-LLM checkpoint (where the
    architecture has one), hf/, RoPE where the engines read it, the tokenizer."""
    refused = trtllm_export_refused(recipe)
    notes = (
        [
            f"No TensorRT-LLM checkpoint (config.json, rank*.safetensors): {refused}. hf/ is the "
            f"artifact (vLLM, TensorRT-LLM's LLM API)."
        ]
        if refused
        else export_trtllm(model, tmp, recipe)
    )
    notes += export_hf(model, tokenizer, tmp, recipe)
    write_rope(tmp, json.loads((tmp / layout.HF_CONFIG).read_text()))
    # what Triton's pre/postprocessing, the LLM API, trtllm-serve read
    save_tokenizer(tokenizer, tmp / layout.TOKENIZER)
    return notes, refused


def _validate_export(
    tmp: Path,
    recipe: Recipe,
    layers: list[Any],
    model: Any,
    refused: str | None,
    notes: list[str],
) -> dict[str, Any]:
    """_validate, then hf/ in the form the engine reads: vLLM's per-head or per-tensor
    compressed-tensors (from ModelOpt's per-layer export)."""
    num_layers = int(model.config.num_hidden_layers)
    summary = _validate(tmp, recipe, layers, refused)
    if recipe.quantization.kv_cache is KVCacheQuant.FP8_ATTN_HEAD:
        summary["attn_head"] = _attn_head(tmp / layout.HF, layers, model, num_layers)
    if kv_only_compressed_tensors(recipe):
        summary["per_tensor"] = _per_tensor(tmp / layout.HF, layers, num_layers)
        notes.append(PER_TENSOR_NOTE)
    return summary


def _validate(tmp: Path, recipe: Recipe, layers: list[Any], refused: str | None) -> dict[str, Any]:
    """Validate what was written: the TensorRT-LLM checkpoint (and its factors) and hf/, or hf/
    alone (with its k/v scales against kv_scales.json) for an HF-export-only architecture."""
    from trtkv.checkpoints.hf_export import validate_hf_checkpoint
    from trtkv.checkpoints.trtllm_checkpoint import validate_trtllm_checkpoint

    if refused:
        hf = validate_hf_checkpoint(tmp, recipe)
        if recipe.quantization.kv_cache is KVCacheQuant.FP8:
            check_exported_hf_scales(layers, hf)
        return {
            "tensorrt_llm": None,
            "tensorrt_llm_refused": refused,
            "hf": hf,
            "num_layers": hf["num_layers"],
        }
    summary = validate_trtllm_checkpoint(tmp, recipe)
    check_exported_factors(layers, summary["kv_cache_scaling_factors"])
    # the LLM API's and vLLM's artifact: checked as strictly
    if (tmp / layout.HF / "config.json").is_file():
        summary["hf"] = validate_hf_checkpoint(tmp, recipe)
    return summary


def _attn_head(hf_dir: Path, layers: list[Any], model: Any, num_layers: int) -> dict[str, Any]:
    """Write the per-(layer, KV head) scales into hf/ in vLLM's compressed-tensors form, then check
    it as vLLM reads it."""
    from trtkv.calibrate.attn_head import convert_export
    from trtkv.kvcache.attn_head import validate_attn_head_export

    heads = int(
        getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads
    )
    converted = convert_export(hf_dir, layers, heads)
    checked = validate_attn_head_export(hf_dir, num_layers, heads)
    return {**checked, "removed_per_layer_scales": converted["removed_per_layer_scales"]}


def _per_tensor(hf_dir: Path, layers: list[Any], num_layers: int) -> dict[str, Any]:
    """Write the per-tensor compressed-tensors kv_cache_scheme into hf/, then check it as vLLM reads
    it: the scales it loads are the ones computed from the calibrated amaxes (kv_scales.json)."""
    from trtkv.kvcache import validate_per_tensor_export, write_per_tensor_scheme

    write_per_tensor_scheme(hf_dir)
    checked = validate_per_tensor_export(hf_dir, num_layers)
    check_exported_hf_scales(layers, checked)
    return checked


def _save_hf_config(model: Any, model_dir: Path | None, target: Path) -> None:
    """The model's config.json (the source folder's file when known, else the loaded model's
    config)."""
    source = model_dir / "config.json" if model_dir is not None else None
    if source is not None and source.is_file():
        target.write_bytes(source.read_bytes())
    else:
        target.write_text(model.config.to_json_string(use_diff=False))


def _peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


# ---------------------------------------------------------------------------------------------
# Data


def calibration_batches(tokenizer: Any, recipe: Recipe) -> list[torch.Tensor]:
    """num_samples x seq_len tokens of the recipe's calibration text
    (trtkv.kvcache.scales.calibration_batches: the batches `trtkv probe` builds for the same recipe
    too)."""
    from trtkv.core.texts import load_texts

    c = recipe.calibration
    return kv_scales.calibration_batches(
        tokenizer,
        load_texts(c.dataset),
        c.num_samples,
        c.seq_len,
        c.batch_size,
        c.seed,
        where=f"calibration.dataset {c.dataset!r}",
    )


def _kv_statistics(model: Any, batches: list[torch.Tensor]) -> tuple[str | None, str]:
    """K/V statistics from trtkv.kvcache.stats (the probe's module) on the unquantized model."""
    import torch

    from trtkv.kvcache.stats import collect_kv_stats

    with torch.no_grad():
        stats = collect_kv_stats(model, batches)
    return str(stats.to_markdown()), (
        "From trtkv.kvcache.stats.collect_kv_stats(model, batches) on the unquantized "
        "model (same calibration batches)."
    )
