"""trtllm-serve, TensorRT-LLM's OpenAI-compatible server, for the llmapi backend: its command on the
HF export, the --extra_llm_api_options (--config) YAML of the LLM() arguments it has no flag for,
and the `OpenAIServer` that `trtkv serve --trtllm-serve` and every multi-node or Slurm deployment of
this backend run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.backends.llmapi_args import hf_checkpoint_dir, llm_args
from trtkv.engines.trtllm import TRTLLM_SERVE_FRACTION_FLAG, llmapi_memory_knobs
from trtkv.recipe import Recipe
from trtkv.recipe.layout import Artifacts, engine_dir, host_artifacts, served_artifacts

SERVE_COMMAND = "serve_command.txt"
LLM_API_OPTIONS = "llm_api_options.yaml"
# LLM() arguments trtllm-serve takes as flags; the --config YAML carries the rest
SERVE_FLAGS = (
    "backend",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
)
# trtllm-serve's flag for the LLM() options YAML (newer name: --config)
LLMAPI_OPTIONS_FLAG = "--extra_llm_api_options"


def serve_config(recipe: Recipe) -> dict[str, Any]:
    """trtllm-serve's --extra_llm_api_options (--config) YAML: the LLM() arguments that have no flag
    of their own."""
    return {k: v for k, v in llm_args(recipe, Path()).items() if k not in ("model", *SERVE_FLAGS)}


def trtllm_serve_command(recipe: Recipe, hf_dir: Path, config: Path) -> list[str]:
    """`trtllm-serve` on the HF export: an OpenAI-compatible server (/v1/completions,
    /v1/chat/completions)."""
    b = recipe.build
    return [
        "trtllm-serve",
        str(hf_dir),
        "--backend",
        "pytorch",
        "--host",
        recipe.triton.host,
        "--port",
        str(recipe.triton.http_port),
        "--tp_size",
        str(b.tp_size),
        "--pp_size",
        str(b.pp_size),
        "--max_batch_size",
        str(recipe.parallelism.per_group(b.max_batch_size)),
        "--max_num_tokens",
        str(b.max_num_tokens),
        "--max_seq_len",
        str(b.max_seq_len),
        TRTLLM_SERVE_FRACTION_FLAG,
        f"{llmapi_memory_knobs(recipe).value:g}",
        # `--config` is the newer name of the same option (PR #9104, Nov 2025);
        # --extra_llm_api_options is accepted by every release, including the 1.0/1.1 images of
        # trtkv's version matrix
        LLMAPI_OPTIONS_FLAG,
        str(config),
    ]


class TrtllmServe:
    """TensorRT-LLM's OpenAI-compatible server on the HF export, with the build's --config: `trtkv
    serve --trtllm-serve`, and every multi-node or Slurm deployment of this backend (the Triton
    model has no multi-node)."""

    name = "trtllm-serve"
    label = "trtllm-serve"
    metrics_path = None  # no Prometheus endpoint
    # 200, or 503 when the LLM is unhealthy (tensorrt_llm/serve/openai_server.py
    # register_routes/health @00057725)
    health_path = "/health"
    shm_gib = 2  # the Triton TensorRT-LLM image's docker --shm-size=2g (trtkv.backends.container)
    key_env = None  # no API key option
    ray = False
    rank_tasks = True  # trtllm-llmapi-launch: rank 0 serves, the other ranks are its workers
    non_root = False
    key_note = (
        "- trtllm-serve has no API key option: nothing but the network (the NetworkPolicy here, "
        "your cluster network on Slurm) fences it. Put an authenticating gateway in front of it if "
        "its clients are not trusted."
    )

    def image(self, recipe: Recipe) -> str | None:
        return None  # the Triton TensorRT-LLM image of the version matrix

    def command(self, recipe: Recipe, host: str, at: Artifacts | None = None) -> list[str]:
        """`at`: where the artifacts are (default: where the recipe's server reads them, a
        container's /models)."""
        at = at or served_artifacts(recipe)
        cmd = trtllm_serve_command(recipe, at.hf, at.engine / LLM_API_OPTIONS)
        cmd[cmd.index("--host") + 1] = host
        return cmd

    def node_command(self, recipe: Recipe, host: str) -> list[str]:
        return ["trtllm-llmapi-launch", *self.command(recipe, host)]

    def data_parallel_nodes(
        self, recipe: Recipe, host: str, gpus_per_node: int
    ) -> tuple[list[str], list[str]] | None:
        return None  # its one multi-node launch (or none) carries attention DP as it is

    def leader_command(self, recipe: Recipe, host: str, ranks: int) -> list[str]:
        return [
            "mpirun",
            "--allow-run-as-root",
            "-np",
            str(ranks),
            "trtllm-llmapi-launch",
            *self.command(recipe, host),
        ]

    def reads(self, recipe: Recipe) -> list[Path]:
        # the HF export and the build's llm_api_options.yaml
        return [hf_checkpoint_dir(recipe), engine_dir(recipe)]

    def served_model(self, recipe: Recipe, at: Artifacts | None = None) -> str:
        """trtllm-serve names the model by the path it loads (where that path is: `at`, default
        served_artifacts)."""
        return str((at or served_artifacts(recipe)).hf)

    def problem(self, recipe: Recipe) -> str | None:
        return None

    def here(self, recipe: Recipe, *, check: bool = True) -> tuple[list[str], dict[str, str]]:
        """trtllm-serve installed on this machine: the host's folders."""
        return self.command(recipe, recipe.triton.host, host_artifacts(recipe)), {}
