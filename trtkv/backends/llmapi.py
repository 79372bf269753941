"""Backend `pytorch`: TensorRT-LLM's LLM API (PyTorch backend) on the calibrated HF checkpoint; the build stage writes
`extra_llm_api_options.yaml` and the `trtllm-serve` command, the Triton repository runs a Python `tensorrt_llm` model
that drives `tensorrt_llm.LLM`. KV dtype: `kv_cache_config.dtype` (fp8, or auto = the checkpoint's).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trtkv.backends.base import BUILD_SECTIONS, EngineBackend, command_block
from trtkv.errors import StageError
from trtkv.hardware import GPU
from trtkv.layout import checkpoint_dir, kv_cache_quant_algo
from trtkv.recipe import Backend, KVCacheQuant, Recipe
from trtkv.tools import quote

SERVE_COMMAND = "serve_command.txt"
LLM_API_OPTIONS = "extra_llm_api_options.yaml"
LLMAPI_RUNNER = """\
import json, sys
from tensorrt_llm import LLM, SamplingParams
from tensorrt_llm.llmapi import KvCacheConfig
a = json.loads(sys.argv[1])
llm = LLM(model=a["hf"], tensor_parallel_size=a["tp"], pipeline_parallel_size=a["pp"],
          kv_cache_config=KvCacheConfig(dtype=a["kv_dtype"], free_gpu_memory_fraction=a["kv_fraction"]))
out = llm.generate([a["prompt"]], SamplingParams(max_tokens=a["max_tokens"], temperature=0.0))
print("TRTKV_TEXT"); print(out[0].outputs[0].text)
"""

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


def _build_llmapi(recipe: Recipe, ckpt: Path, tmp: Path, final: Path) -> dict[str, Any]:
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
    (tmp / LLM_API_OPTIONS).write_text(f"# {BACKEND.kv_source_line(recipe)}\n" + yaml.safe_dump(options, sort_keys=False))
    cmd = trtllm_serve_command(recipe, hf, final / LLM_API_OPTIONS)
    (tmp / SERVE_COMMAND).write_text(quote(cmd) + "\n")
    return {"backend": "pytorch", "serve_command": cmd, "llm_api_options": options}




class LlmApiBackend(EngineBackend):
    backend = Backend.PYTORCH
    llm_model = ("tensorrt_llm/config.pytorch.pbtxt", "tensorrt_llm/tensorrt_llm_pytorch.py")
    build_sections = (*BUILD_SECTIONS, "triton")  # the serve command and the KV memory fraction

    def problems(self, recipe: Recipe) -> list[tuple[str, str]]:
        out = []
        if recipe.hardware.gpu is GPU.CPU:
            out.append(("build.backend", f"backend {recipe.build.backend.value} needs a GPU and TensorRT-LLM; with "
                                         f"hardware.gpu cpu use backend reference"))
        if recipe.quantization.kv_cache is KVCacheQuant.INT8:
            out.append(("quantization.kv_cache", "TensorRT-LLM's PyTorch backend has no INT8 KV cache "
                                                 "(kv_cache_config dtype is auto or fp8): use backend tensorrt or "
                                                 "kv_cache fp8"))
        return out

    def kv_source_line(self, recipe: Recipe) -> str:
        algo = kv_cache_quant_algo(recipe)
        value = "fp8" if algo == "FP8" else "auto"
        return (f"KV cache: {algo or 'unquantized'}, from {LLM_API_OPTIONS} kv_cache_config.dtype = {value} "
                f"(and the HF export's hf_quant_config.json kv_cache_quant_algo)")

    def build(self, recipe: Recipe, ckpt: Path, tmp: Path, final: Path, info: dict[str, Any],
              log: Callable[[str], None]) -> dict[str, Any]:
        return _build_llmapi(recipe, ckpt, tmp, final)

    def dry_run_lines(self, recipe: Recipe, ckpt: Path, out: Path) -> list[str]:
        options = out / LLM_API_OPTIONS
        lines = [f"  write {options}:"]
        lines += ["      " + line for line in yaml.safe_dump(llm_api_options(recipe), sort_keys=False).splitlines()]
        lines.append(f"  serve command (saved to {out / SERVE_COMMAND}; `trtkv serve` or a GPU host runs it):")
        return lines + command_block(trtllm_serve_command(recipe, ckpt / "hf", options))

    def repo_input(self, recipe: Recipe) -> tuple[Path, str]:
        return checkpoint_dir(recipe) / "hf", "calibrate"

    def require_served_input(self, recipe: Recipe) -> None:
        """The server loads the HF export of the checkpoint (no build output)."""
        from trtkv.stage import require_input

        ckpt = checkpoint_dir(recipe)
        require_input(ckpt, "serve", "calibrate", recipe)
        if not (ckpt / "hf" / "config.json").is_file():
            raise StageError(f"serve: {ckpt / 'hf'} has no config.json: the pytorch backend serves the HF export that "
                             f"`trtkv calibrate` writes for an FP8 (or no) KV cache. Next: `trtkv calibrate "
                             f"{recipe.name} --force`.")

    def repo_summary(self, recipe: Recipe) -> str:
        return f"Python model on TensorRT-LLM's LLM API (PyTorch backend), model `{checkpoint_dir(recipe)}/hf`"

    def generate_job(self, recipe: Recipe, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
        kv = kv_cache_quant_algo(recipe)
        return LLMAPI_RUNNER, {"hf": str(checkpoint_dir(recipe) / "hf"), "tp": recipe.build.tp_size,
                               "pp": recipe.build.pp_size, "kv_dtype": "fp8" if kv == "FP8" else "auto",
                               "kv_fraction": recipe.triton.kv_cache_free_gpu_mem_fraction, "prompt": prompt,
                               "max_tokens": max_tokens}


BACKEND = LlmApiBackend()
