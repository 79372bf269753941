"""The build stage: a TensorRT-LLM checkpoint in, `engines/<recipe>/engine/` out.

Three backends, one stage contract (manifest, atomic output, up-to-date skip):
- `tensorrt`: runs `trtllm-build` (TensorRT-LLM <= 1.2.x) after a preflight (tensorrt_llm, GPUs, checkpoint).
- `pytorch`: writes `extra_llm_api_options.yaml` and the `trtllm-serve` command for the HF export (LLM API).
- `reference`: writes `runtime.json` for trtkv's CPU runtime (trtkv.runtime) and checks that it loads and decodes.

The KV cache precision is never a `trtllm-build` flag: it is the checkpoint's `quantization.kv_cache_quant_algo`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trtkv import layout, model, paths, trtllm, versions
from trtkv.errors import StageError, ToolError
from trtkv.layout import checkpoint_dir, engine_dir, kv_cache_quant_algo
from trtkv.recipe import Backend, GemmPlugin, KVCacheQuant, Recipe, WeightQuant
from trtkv.stage import VERSIONED_TOOLS, StageResult, manifest_hash, run_stage
from trtkv.tools import quote, run_logged, tail

STAGE = "build"
SECTIONS = ("model", "quantization", "build")  # + "triton" for pytorch (its serve command and KV memory fraction)
TRTLLM_MIN, TRTLLM_MAX = (1, 0), (1, 3)  # trtllm-build engines: TensorRT-LLM >= 1.0 and < 1.3
TRTLLM_DEFAULT_TOKENS_PER_BLOCK = 32  # PluginConfig.tokens_per_block default in TensorRT-LLM 1.x
BUILD_LOG = "build.log"
BUILD_COMMAND = "build_command.txt"
SERVE_COMMAND = "serve_command.txt"
LLM_API_OPTIONS = "extra_llm_api_options.yaml"
RUNTIME_JSON = "runtime.json"
HF_CONFIG = layout.HF_CONFIG
ACTIVATIONS_NOTE = ("activations are not quantized by the reference runtime (the checkpoint's "
                    "activation_scaling_factor tensors are ignored; GEMMs run in float32 on dequantized weights)")


# ---------------------------------------------------------------------------------------------
# Where things are (engines/<recipe>/checkpoint and engine come from trtkv.layout)


def failed_log_path(recipe: Recipe) -> Path:
    """Where a failed build's log is kept (the temporary engine folder itself is removed)."""
    return paths.recipe_output_dir(recipe.name) / "engine.failed-build.log"


# ---------------------------------------------------------------------------------------------
# Commands (pure functions of the recipe: the dry-run and the real run print the same thing)


def gemm_plugin(recipe: Recipe) -> str:
    """`--gemm_plugin`: fp8 with FP8 weights when the recipe says auto, else the recipe's value."""
    chosen = recipe.build.gemm_plugin
    if chosen is GemmPlugin.AUTO:
        return "fp8" if recipe.quantization.weights is WeightQuant.FP8 else "auto"
    return chosen.value


def _onoff(flag: bool) -> str:
    return "enable" if flag else "disable"


def trtllm_build_command(recipe: Recipe, ckpt: Path, output: Path) -> list[str]:
    """The `trtllm-build` argument list; every flag exists in TensorRT-LLM 1.2 (tests check the list)."""
    b = recipe.build
    cmd = [
        "trtllm-build",
        "--checkpoint_dir", str(ckpt),
        "--output_dir", str(output),
        "--max_batch_size", str(b.max_batch_size),
        "--max_input_len", str(b.max_input_len),
        "--max_seq_len", str(b.max_seq_len),
        "--max_num_tokens", str(b.max_num_tokens),
        "--gemm_plugin", gemm_plugin(recipe),
        "--gpt_attention_plugin", "auto",
        "--kv_cache_type", "paged",
        "--use_paged_context_fmha", _onoff(recipe.paged_context_fmha),
        "--use_fp8_context_fmha", _onoff(recipe.fp8_context_fmha),
        "--remove_input_padding", "enable",
        "--logits_dtype", "float32",  # the Triton configs declare FP32 logits (context/generation_logits outputs)
        "--multiple_profiles", _onoff(b.multiple_profiles),
        "--workers", str(recipe.world_size),
    ]
    if b.tokens_per_block != TRTLLM_DEFAULT_TOKENS_PER_BLOCK:
        cmd += ["--tokens_per_block", str(b.tokens_per_block)]
    return cmd


def context_fmha_line(recipe: Recipe) -> str:
    """Why the two context-FMHA flags have the values they have (TensorRT-LLM's own rules)."""
    kv, w = recipe.quantization.kv_cache, recipe.quantization.weights
    paged = _onoff(recipe.paged_context_fmha)
    if kv is KVCacheQuant.INT8:
        why_paged = "forced off: paged context FMHA doesn't work with an INT8 KV cache"
    elif kv is KVCacheQuant.FP8 and w is not WeightQuant.FP8:
        why_paged = "forced off: FP8 paged context FMHA needs the FP8 quantization workflow (FP8 weights)"
    else:
        why_paged = f"build.use_paged_context_fmha = {str(recipe.build.use_paged_context_fmha).lower()}"
    fp8 = _onoff(recipe.fp8_context_fmha)
    why_fp8 = ("build.use_fp8_context_fmha" if recipe.build.use_fp8_context_fmha is not None else
               "default: on exactly when the KV cache and the weights are both FP8")
    return f"context FMHA: --use_paged_context_fmha {paged} ({why_paged}); --use_fp8_context_fmha {fp8} ({why_fp8})"


def llm_api_options(recipe: Recipe) -> dict[str, Any]:
    """`extra_llm_api_options.yaml` for TensorRT-LLM's LLM API / `trtllm-serve` (PyTorch backend)."""
    kv_dtype = "fp8" if recipe.quantization.kv_cache is KVCacheQuant.FP8 else "auto"
    options: dict[str, Any] = {
        "tensor_parallel_size": recipe.build.tp_size,
        "pipeline_parallel_size": recipe.build.pp_size,
        "max_batch_size": recipe.build.max_batch_size,
        "max_num_tokens": recipe.build.max_num_tokens,
        "max_seq_len": recipe.build.max_seq_len,
        "kv_cache_config": {
            "dtype": kv_dtype,
            "free_gpu_memory_fraction": recipe.triton.kv_cache_free_gpu_mem_fraction,
            "enable_block_reuse": recipe.triton.enable_kv_cache_reuse,
        },
    }
    if recipe.chunked_context:  # a prompt longer than max_num_tokens is refused unless the scheduler may chunk it
        options["enable_chunked_prefill"] = True
    return options


def trtllm_serve_command(recipe: Recipe, hf_dir: Path, options: Path) -> list[str]:
    """The `trtllm-serve` command for the PyTorch backend (an OpenAI-compatible server on the HF export)."""
    return [
        "trtllm-serve", str(hf_dir),
        "--backend", "pytorch",
        "--host", recipe.triton.host,
        "--port", str(recipe.triton.http_port),
        "--tp_size", str(recipe.build.tp_size),
        "--pp_size", str(recipe.build.pp_size),
        "--max_batch_size", str(recipe.build.max_batch_size),
        "--max_num_tokens", str(recipe.build.max_num_tokens),
        "--max_seq_len", str(recipe.build.max_seq_len),
        "--kv_cache_free_gpu_memory_fraction", str(recipe.triton.kv_cache_free_gpu_mem_fraction),
        "--extra_llm_api_options", str(options),
    ]


def kv_source_line(recipe: Recipe) -> str:
    """One line saying where the KV cache precision comes from, per backend."""
    algo = kv_cache_quant_algo(recipe)
    backend = recipe.build.backend
    if backend is Backend.PYTORCH:
        value = "fp8" if algo == "FP8" else "auto"
        return (f"KV cache: {algo or 'unquantized'}, from {LLM_API_OPTIONS} kv_cache_config.dtype = {value} "
                f"(and the HF export's hf_quant_config.json kv_cache_quant_algo)")
    if backend is Backend.REFERENCE:
        return (f"KV cache: {algo or 'unquantized'}, from checkpoint config quantization.kv_cache_quant_algo, with the "
                f"per-layer kv_cache_scaling_factor of rank0.safetensors (one scale shared by K and V, as TensorRT-LLM); "
                f"{ACTIVATIONS_NOTE}")
    flag = {"FP8": "--fp8_kv_cache", "INT8": "--int8_kv_cache"}.get(algo or "", "--<dtype>_kv_cache")
    return (f"KV cache: {algo or 'unquantized'}, from checkpoint config quantization.kv_cache_quant_algo — "
            f"trtllm-build has no {flag} flag")


def _describe_calibration(recipe: Recipe) -> list[str]:
    """The calibrate stage's own dry-run lines (the dry run of `make engine` covers both stages)."""
    from trtkv.calibrate import describe_calibration  # light at import time: ModelOpt and torch load lazily

    return list(describe_calibration(recipe))


def _command_block(cmd: list[str]) -> list[str]:
    """A command as copy-pasteable shell lines (flag/value pairs joined with backslash continuations)."""
    quoted = [quote([c]) for c in cmd]
    head, rest = quoted[:1], quoted[1:]
    parts: list[str] = []
    i = 0
    while i < len(rest):
        if rest[i].startswith("--") and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            parts.append(f"{rest[i]} {rest[i + 1]}")
            i += 2
        else:
            parts.append(rest[i])
            i += 1
    lines = [" ".join(head + parts[:1])] + parts[1:]
    return ["  $ " + lines[0] + (" \\" if len(lines) > 1 else "")] + [
        "      " + line + (" \\" if n < len(lines) - 2 else "") for n, line in enumerate(lines[1:])]


def dry_run_lines(recipe: Recipe) -> list[str]:
    """Every command `make engine` would run for this recipe (calibrate, then build); nothing is touched."""
    ckpt, out = checkpoint_dir(recipe), engine_dir(recipe)
    backend = recipe.build.backend
    lines = [f"# dry run of `make engine RECIPE={recipe.name}` (trtkv calibrate + trtkv build): nothing is written",
             f"[calibrate] -> {ckpt}/", f"  $ trtkv calibrate {recipe.name}"]
    lines += ["  " + line for line in _describe_calibration(recipe)]
    lines += [f"[build] backend {backend.value} -> {out}/", f"  $ trtkv build {recipe.name}"]
    lines.append("  " + kv_source_line(recipe))
    if backend is Backend.TENSORRT:
        image = versions.image_for_recipe(recipe)
        place = trtllm.where(image)
        row = versions.row_for_trtllm(recipe.build.tensorrt_llm_version)
        lines += [f"  TensorRT-LLM {recipe.build.tensorrt_llm_version} (TensorRT {row.tensorrt}; served by {image}) "
                  f"runs where trtkv.trtllm finds it: {place.why}"
                  + (" -- nothing to run it with on this machine" if place.kind == "missing" else ""),
                  f"  preflight: import tensorrt_llm there (version {recipe.build.tensorrt_llm_version}, >= "
                  f"{'.'.join(map(str, TRTLLM_MIN))} and < {'.'.join(map(str, TRTLLM_MAX))}); "
                  f"`nvidia-smi -L` >= {recipe.world_size} GPU(s); {ckpt}/config.json has kv_cache_quant_algo = "
                  f"{kv_cache_quant_algo(recipe)}, dtype = {recipe.model.dtype.value}, mapping tp_size = "
                  f"{recipe.build.tp_size}, pp_size = {recipe.build.pp_size}"]
        lines.append("  " + context_fmha_line(recipe))
        lines.append(f"  run (log: {out / BUILD_LOG}, command saved to {out / BUILD_COMMAND}):")
        plain = trtllm_build_command(recipe, ckpt, out)
        if place.kind != "missing":
            lines.append(f"  started as: {quote(place.tool_command(plain[0], []))} <the flags below>")
        lines += _command_block(plain)
    elif backend is Backend.PYTORCH:
        options = out / LLM_API_OPTIONS
        lines.append(f"  write {options}:")
        lines += ["      " + line for line in yaml.safe_dump(llm_api_options(recipe), sort_keys=False).splitlines()]
        lines.append(f"  serve command (saved to {out / SERVE_COMMAND}; `trtkv serve` or a GPU host runs it):")
        lines += _command_block(trtllm_serve_command(recipe, ckpt / "hf", options))
    else:
        lines.append(f"  write {out / RUNTIME_JSON} (checkpoint {ckpt}, max_seq_len {recipe.build.max_seq_len}), "
                     f"then load it with trtkv.runtime.ReferenceRuntime and decode one token (CPU, float32; "
                     f"weights dequantized, {ACTIVATIONS_NOTE.split(' (')[0]})")
    return lines


# ---------------------------------------------------------------------------------------------
# Preflight


def _parse_version(text: str) -> tuple[int, int] | None:
    match = re.match(r"^(\d+)\.(\d+)", text.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def tensorrt_llm_version(place: trtllm.TrtllmPlace, timeout_s: float = 900.0) -> dict[str, str]:
    """{"tensorrt_llm", "tensorrt"} versions where TensorRT-LLM runs (a subprocess: importing it is heavy)."""
    code = ("import sys, tensorrt_llm, tensorrt; sys.stdout.write('\\nTRTKV_VERSION=' + tensorrt_llm.__version__ + "
            "' ' + tensorrt.__version__ + '\\n')")
    cmd = place.python_command(["-c", code])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise StageError(f"`import tensorrt_llm` did not finish in {timeout_s:.0f} s ({place.why}).") from exc
    except OSError as exc:
        raise StageError(f"could not start {cmd[0]} ({exc}); {place.why}.") from exc
    found = re.findall(r"TRTKV_VERSION=(\S+) (\S+)", proc.stdout)
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise StageError(f"tensorrt_llm is not importable ({place.why}: {last}).")
    return {"tensorrt_llm": found[-1][0], "tensorrt": found[-1][1]}


def visible_gpus() -> tuple[int, str]:
    """GPUs this process can see and how that was found: `nvidia-smi -L`, else torch.cuda.device_count()."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            proc = None
        if proc is not None and proc.returncode == 0:
            return sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU ")), "nvidia-smi -L"
    import torch

    return int(torch.cuda.device_count()), f"{'nvidia-smi failed' if smi else 'no nvidia-smi'}; torch.cuda.device_count()"


def check_checkpoint(recipe: Recipe) -> tuple[Path, dict[str, Any], list[str]]:
    """The checkpoint folder, its validation summary and every problem with it (empty when it fits the recipe).

    One source of truth: trtkv.checkpoint.validate_trtllm_checkpoint (the check calibrate runs after export).
    """
    from trtkv.checkpoint import validate_trtllm_checkpoint

    ckpt = checkpoint_dir(recipe)
    if manifest_hash(ckpt) is None:
        return ckpt, {}, [f"{ckpt}: missing or incomplete (no manifest.json). Next: run `trtkv calibrate "
                          f"{recipe.name}` (or `make engine RECIPE={recipe.name}`, which runs calibrate then build)"]
    try:
        summary = validate_trtllm_checkpoint(ckpt, recipe)
    except StageError as exc:
        return ckpt, {}, [str(exc).replace("<recipe>", recipe.name) + " (or fix the recipe)"]
    return ckpt, summary, []


def preflight_tensorrt(recipe: Recipe) -> dict[str, Any]:
    """Everything trtllm-build needs, checked before it starts; one StageError listing every problem."""
    problems: list[str] = []
    image = versions.image_for_recipe(recipe)
    place = trtllm.where(image)
    found: dict[str, str] = {}
    if place.kind == "missing":
        problems.append(f"TensorRT-LLM is not available here: {place.why}. Next: {trtllm.install_hint(image)}; or "
                        f"use build.backend=reference on a machine without GPUs")
    elif missing := trtllm.image_missing(place):
        problems.append(missing)
    else:
        try:
            found = tensorrt_llm_version(place)
        except StageError as exc:
            problems.append(f"{exc} Next: {trtllm.install_hint(image)}")
    if found:
        parsed = _parse_version(found["tensorrt_llm"])
        wanted = recipe.build.tensorrt_llm_version
        if parsed is None or not TRTLLM_MIN <= parsed < TRTLLM_MAX:
            problems.append(f"tensorrt_llm {found['tensorrt_llm']} ({place.why}); trtllm-build engines need >= "
                            f"{'.'.join(map(str, TRTLLM_MIN))} and < {'.'.join(map(str, TRTLLM_MAX))} (1.3 removed the "
                            f"TensorRT engine path). Next: use {image}, or build.backend=pytorch")
        elif versions.release(found["tensorrt_llm"]) != versions.release(wanted):
            problems.append(f"tensorrt_llm {found['tensorrt_llm']} ({place.why}), but the recipe's "
                            f"build.tensorrt_llm_version is {wanted} (image {image}): the engine would not load in the "
                            f"image trtkv serves it with. Next: set build.tensorrt_llm_version="
                            f"{versions.release(found['tensorrt_llm'])} if the matrix has it, or build in {image}")
    gpus, how = visible_gpus()
    if gpus < recipe.world_size:
        problems.append(f"{gpus} GPU(s) visible ({how}), the recipe needs build.tp_size x pp_size = "
                        f"{recipe.world_size}. Next: run on a machine with {recipe.world_size} GPU(s) or set "
                        f"CUDA_VISIBLE_DEVICES")
    ckpt, _cfg, ckpt_problems = check_checkpoint(recipe)
    problems += ckpt_problems
    if problems:
        raise StageError(f"build {recipe.name}: preflight found {len(problems)} problem(s):\n"
                         + "\n".join(f"  - {p}" for p in problems))
    return {"versions": {**found, "image": image if place.kind == "container" else None, "where": place.why},
            "visible_gpus": gpus, "checkpoint": str(ckpt), "place": place}


# ---------------------------------------------------------------------------------------------
# Known pitfalls (facts.md): a hint for each, chosen from the failed run's log

PITFALLS: list[tuple[str, str]] = [
    (r"Paged Context FMHA doesn't work with int8 kv cache",
     "paged context FMHA does not work with an INT8 KV cache: trtkv passes --use_paged_context_fmha disable for "
     "INT8 KV; if this engine was built by hand, do the same (or recalibrate with quantization.kv_cache=fp8)"),
    (r"FP8 Paged Context FMHA only works with fp8 quantization workflow|must be used together with the fp8 "
     r"quantization workflow",
     "FP8 (paged) context FMHA needs FP8 weights as well as an FP8 KV cache: recalibrate with "
     "quantization.weights=fp8, or set build.use_fp8_context_fmha=false"),
    (r"INT8/INT4 quantization is not supported on SM>=100|SmoothQuant is not supported on SM>=100",
     "Blackwell (SM>=100, B200) has no INT8 KV cache, SmoothQuant or INT4 weight path in trtllm-build: use "
     "quantization.kv_cache=fp8 and quantization.weights=fp8 or none"),
    (r"use_fp8_context_fmha|fp8 context fmha|FP8 Context FMHA",
     "--use_fp8_context_fmha enable needs an FP8 KV cache (checkpoint kv_cache_quant_algo FP8); set "
     "build.use_fp8_context_fmha=false or recalibrate with quantization.kv_cache=fp8"),
    (r"builder_config|version mismatch|Version mismatch|was built with",
     "engine/runtime version mismatch: build and serve with the same TensorRT-LLM version (the container's), and "
     "rebuild the checkpoint with a matching ModelOpt"),
    (r"out of memory|OutOfMemory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation",
     "GPU out of memory while building: lower build.max_num_tokens / max_batch_size, or build with fewer "
     "parallel workers"),
    (r"Unsupported model architecture|KeyError: '.*ForCausalLM'",
     "the checkpoint architecture is not known to this TensorRT-LLM version: check model.architecture"),
    (r"No module named|ImportError|undefined symbol",
     "the TensorRT-LLM installation is broken or incomplete: build inside the version matrix's container (trtkv "
     "does this when docker is on PATH) or point TRTKV_TRTLLM_PYTHON at a working environment"),
    (r"kv_cache_scaling_factor|kv_cache_quant_algo",
     "the checkpoint's KV-cache quantization does not load: rerun `trtkv calibrate --force`"),
]


# Lines that are not errors: TensorRT-LLM's own info/warning/verbose lines (`[TRT-LLM] [I] Set
# PluginConfig.use_fp8_context_fmha to True.` and `[TRT-LLM] [W] FP8 Context FMHA is disabled because it must be used
# together with the fp8 quantization workflow.` appear in ordinary successful builds: tensorrt_llm/builder.py and
# plugin/plugin.py, 1.x), and the `$ command` line run_logged writes first.
BENIGN_LINE = re.compile(r"^\$ |\[TRT-LLM\](?: \[MPI_Rank \d+\])? \[[IWV]\] |\[TensorRT-LLM\]\[(?:INFO|WARNING|VERBOSE)\]")


def pitfall_hints(log_text: str) -> list[str]:
    """Hints for the known pitfalls the log's error lines show (info and warning lines never trigger one)."""
    body = "\n".join(line for line in log_text.splitlines() if not BENIGN_LINE.search(line))
    return [hint for pattern, hint in PITFALLS if re.search(pattern, body, re.IGNORECASE)]


# ---------------------------------------------------------------------------------------------
# Backends


def _build_tensorrt(recipe: Recipe, ckpt: Path, tmp: Path, final: Path, place: trtllm.TrtllmPlace,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """Run trtllm-build (where TensorRT-LLM lives) into `tmp`; keep the log beside the engine folder when it fails."""
    shown = trtllm_build_command(recipe, ckpt, final)
    plain = trtllm_build_command(recipe, ckpt, tmp)
    run = place.tool_command(plain[0], plain[1:])
    (tmp / BUILD_COMMAND).write_text(
        f"# {kv_source_line(recipe)}\n"
        f"# trtkv ran this with --output_dir {tmp} (a temporary sibling renamed to {final} on success), "
        f"{place.why}:\n# {quote(run)}\n"
        + quote(shown) + "\n")
    log_path = tmp / BUILD_LOG
    try:
        run_logged(run, log_path)
    except ToolError as exc:
        kept = failed_log_path(recipe)
        if log_path.is_file():
            shutil.copyfile(log_path, kept)
        hints = pitfall_hints(tail(log_path, 200))
        extra = "".join(f"\nhint: {h}" for h in hints)
        message = str(exc).replace(str(log_path), str(kept))
        raise ToolError(f"build {recipe.name}: {message}\nno engine folder was written (full log: {kept}).{extra}") \
            from exc
    engines = [tmp / f"rank{r}.engine" for r in range(recipe.world_size)]
    missing = [p.name for p in engines if not p.is_file()]
    if missing or not (tmp / "config.json").is_file():
        raise StageError(f"build {recipe.name}: trtllm-build exited 0 but did not write "
                         f"{', '.join(missing + ([] if (tmp / 'config.json').is_file() else ['config.json']))}. "
                         f"Next: read {failed_log_path(recipe)}.")
    return {"backend": "tensorrt", "command": shown, "ran": run, "engines": [p.name for p in engines]}


_UNREADABLE = object()


def _hf_kv_algo(path: Path, recipe: Recipe, problems: list[str]) -> Any:
    """hf_quant_config.json's quantization.kv_cache_quant_algo; a problem (and _UNREADABLE) when it is not JSON."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path}: not readable as JSON ({exc}). Next: `trtkv calibrate {recipe.name} --force`")
        return _UNREADABLE
    quant = data.get("quantization") if isinstance(data, dict) else None
    return quant.get("kv_cache_quant_algo") if isinstance(quant, dict) else None


def _build_pytorch(recipe: Recipe, ckpt: Path, tmp: Path, final: Path) -> dict[str, Any]:
    """Write the LLM API options and the trtllm-serve command that serves the HF export."""
    hf = ckpt / "hf"
    problems = []
    if not (hf / "config.json").is_file():
        problems.append(f"{hf}: no HF export (config.json). The pytorch backend serves the HF checkpoint that "
                        f"calibrate exports with an FP8 KV cache. Next: `trtkv calibrate {recipe.name} --force`")
    quant_cfg = hf / "hf_quant_config.json"
    if quant_cfg.is_file() and recipe.quantization.kv_cache is KVCacheQuant.FP8:
        algo = _hf_kv_algo(quant_cfg, recipe, problems)
        if algo is not _UNREADABLE and algo != "FP8":
            problems.append(f"{quant_cfg}: kv_cache_quant_algo is {algo!r}, the recipe needs 'FP8'")
    if problems:
        raise StageError(f"build {recipe.name}: " + "; ".join(problems))
    options = llm_api_options(recipe)
    (tmp / LLM_API_OPTIONS).write_text(f"# {kv_source_line(recipe)}\n" + yaml.safe_dump(options, sort_keys=False))
    cmd = trtllm_serve_command(recipe, hf, final / LLM_API_OPTIONS)
    (tmp / SERVE_COMMAND).write_text(quote(cmd) + "\n")
    return {"backend": "pytorch", "serve_command": cmd, "llm_api_options": options}


def _hf_config_source(ckpt: Path) -> Path | None:
    """The HF config.json describing the checkpoint's model (rope, norms): the copy calibrate saves, else the HF
    export. Never resolves the model (an INT8-KV checkpoint has no hf/, and resolving may convert or download)."""
    for path in (ckpt / HF_CONFIG, ckpt / "hf" / "config.json", ckpt / "tokenizer" / "config.json"):
        if path.is_file():
            return path
    return None


def _tokenizer_dir(recipe: Recipe, ckpt: Path) -> Path | None:
    """The checkpoint's tokenizer copy, else the HF export's, else the model folder when it is on disk already."""
    for folder in (ckpt / "tokenizer", ckpt / "hf"):
        if (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file():
            return folder
    local = model.local_model_dir(recipe)
    return local if local is not None and (local / "tokenizer_config.json").is_file() else None


def _build_reference(recipe: Recipe, ckpt: Path, tmp: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Write runtime.json (+ the HF config), then load the runtime from `tmp` and decode one token as a check."""
    from trtkv.runtime import ReferenceRuntime

    hf_config = _hf_config_source(ckpt)
    if hf_config is not None:
        shutil.copyfile(hf_config, tmp / HF_CONFIG)
    else:
        log(f"build: no HF config.json in {ckpt} (rope scaling, norms): the runtime derives the model config from "
            f"the TensorRT-LLM config.json alone. Rerun `trtkv calibrate {recipe.name} --force` to save one.")
    tokenizer = _tokenizer_dir(recipe, ckpt)
    settings = {
        "backend": "reference",
        "checkpoint": str(ckpt),
        "checkpoint_relative": os.path.relpath(ckpt, tmp),  # used when the engines folder has moved
        "tokenizer": str(tokenizer) if tokenizer else None,
        "hf_config": HF_CONFIG if hf_config else None,
        "hf_config_source": str(hf_config) if hf_config else None,
        "kv_cache_quant_algo": kv_cache_quant_algo(recipe),
        "max_seq_len": recipe.build.max_seq_len,
        "max_batch_size": recipe.build.max_batch_size,
        "max_num_tokens": recipe.build.max_num_tokens,
        "enable_chunked_context": recipe.chunked_context,
        "compute_dtype": "float32",
        "kv_scale_semantics": "TensorRT-LLM <= 1.2: one per-layer kv_cache_scaling_factor shared by K and V "
                              "(dequantization multiplier; FP8 export clamps it to >= 1.0)",
        "activations": ACTIVATIONS_NOTE,
    }
    (tmp / RUNTIME_JSON).write_text(json.dumps(settings, indent=2) + "\n")
    runtime = ReferenceRuntime.load(tmp)
    prompt = [runtime.bos_token_id if runtime.bos_token_id is not None else 0]
    first = runtime.generate(prompt, max_tokens=1)
    log(f"build: reference runtime loaded ({runtime.num_layers} layers, KV {runtime.kv_format}); smoke token {first}")
    return {"backend": "reference", "runtime": settings, "kv_format": runtime.kv_format,
            "kv_scales": runtime.kv_scales, "smoke_token": first}


def build(recipe: Recipe, *, force: bool = False, log: Callable[[str], None] = print) -> StageResult:
    """Run the build stage for the recipe's backend (skipped when up to date)."""
    backend = recipe.build.backend
    out = engine_dir(recipe)
    if backend is Backend.TENSORRT:
        info = preflight_tensorrt(recipe)
        place = info.pop("place")
        ckpt = Path(info["checkpoint"])
    else:
        ckpt, _cfg, problems = check_checkpoint(recipe)
        if problems:
            raise StageError(f"build {recipe.name}: the checkpoint does not fit the recipe:\n"
                             + "\n".join(f"  - {p}" for p in problems))
        info = {"checkpoint": str(ckpt)}
    log(f"build {recipe.name}: backend {backend.value}; {kv_source_line(recipe)}")

    def work(tmp: Path) -> dict[str, Any]:
        if backend is Backend.TENSORRT:
            # the versions that built the engine: `trtkv repo/serve` pick the Triton image from them
            extra = {**_build_tensorrt(recipe, ckpt, tmp, out, place, log), "versions": info["versions"]}
        elif backend is Backend.PYTORCH:
            extra = _build_pytorch(recipe, ckpt, tmp, out)
        else:
            extra = _build_reference(recipe, ckpt, tmp, log)
        return {**extra, "preflight": info}

    sections = (*SECTIONS, "triton") if backend is Backend.PYTORCH else SECTIONS
    return run_stage(STAGE, recipe, out, work, sections=sections, input_dir=ckpt, force=force, log=log,
                     versioned_tools=VERSIONED_TOOLS)
