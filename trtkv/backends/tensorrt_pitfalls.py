"""Known pitfalls of `trtllm-build` (TensorRT-LLM's build errors as its users report them): a hint
for each, chosen from a failed run's log, whose info and warning lines never trigger one.
"""

from __future__ import annotations

import re

PITFALLS: list[tuple[str, str]] = [
    (
        r"Paged Context FMHA doesn't work with int8 kv cache",
        "paged context FMHA does not work with an INT8 KV cache: trtkv passes "
        "--use_paged_context_fmha disable for INT8 KV; if this engine was built by hand, do the "
        "same (or recalibrate with quantization.kv_cache=fp8)",
    ),
    (
        r"FP8 Paged Context FMHA only works with fp8 quantization workflow|must be used together "
        r"with the fp8 quantization workflow",
        "FP8 (paged) context FMHA needs FP8 weights as well as an FP8 KV cache: recalibrate with "
        "quantization.weights=fp8, or set build.use_fp8_context_fmha=false",
    ),
    (
        r"INT8/INT4 quantization is not supported on SM>=100|SmoothQuant is not supported on "
        r"SM>=100",
        "Blackwell (SM>=100, B200) has no INT8 KV cache, SmoothQuant or INT4 weight path in "
        "trtllm-build: use quantization.kv_cache=fp8 and quantization.weights=fp8 or none",
    ),
    (
        r"use_fp8_context_fmha|fp8 context fmha|FP8 Context FMHA",
        "--use_fp8_context_fmha enable needs an FP8 KV cache (checkpoint kv_cache_quant_algo FP8); "
        "set build.use_fp8_context_fmha=false or recalibrate with quantization.kv_cache=fp8",
    ),
    (
        r"builder_config|version mismatch|Version mismatch|was built with",
        "engine/runtime version mismatch: build and serve with the same TensorRT-LLM version (the "
        "container's), and rebuild the checkpoint with a matching ModelOpt",
    ),
    (
        r"out of memory|OutOfMemory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation",
        "GPU out of memory while building: lower build.max_num_tokens / max_batch_size, or build "
        "with fewer parallel workers",
    ),
    (
        r"Unsupported model architecture|KeyError: '.*ForCausalLM'",
        "the checkpoint architecture is not known to this TensorRT-LLM version: check "
        "model.architecture",
    ),
    (
        r"No module named|ImportError|undefined symbol",
        "the TensorRT-LLM installation is broken or incomplete: build inside the version matrix's "
        "container (trtkv does this when docker is on PATH) or point TRTKV_TRTLLM_PYTHON at a "
        "working environment",
    ),
    (
        r"kv_cache_scaling_factor|kv_cache_quant_algo",
        "the checkpoint's KV-cache quantization does not load: rerun `trtkv calibrate --force`",
    ),
]


# Lines that are not errors: TensorRT-LLM's own info/warning/verbose lines (`[TRT-LLM] [I] Set
# PluginConfig.use_fp8_context_fmha to True.` and `[TRT-LLM] [W] FP8 Context FMHA is disabled
# because it must be used together with the fp8 quantization workflow.` appear in ordinary
# successful builds: tensorrt_llm/builder.py and plugin/plugin.py, 1.x), and the `$ command` line
# run_logged writes first.
BENIGN_LINE = re.compile(
    r"^\$ |\[TRT-LLM\](?: \[MPI_Rank \d+\])? \[[IWV]\] "
    r"|\[TensorRT-LLM\]\[(?:INFO|WARNING|VERBOSE)\]"
)


def pitfall_hints(log_text: str) -> list[str]:
    """Hints for the known pitfalls the log's error lines show (info and warning lines never trigger
    one)."""
    body = "\n".join(line for line in log_text.splitlines() if not BENIGN_LINE.search(line))
    return [hint for pattern, hint in PITFALLS if re.search(pattern, body, re.IGNORECASE)]
