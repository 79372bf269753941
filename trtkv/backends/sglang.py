"""Backend `sglang`: SGLang's OpenAI-compatible server (`python -m sglang.launch_server`) on the
recipe's HF export (ModelOpt's FP8 weights and per-layer k_scale/v_scale, which SGLang's
ModelOptFp8KVCacheMethod loads).

No engine and no Triton repository: the build stage validates the HF export and writes the GPU serve
command (`sglang_gpu_command.txt`, the `lmsysorg/sglang` container) and, where SGLang cannot take
the scales from the checkpoint (weights none: SGLang's ModelOptFp8Config refuses a ModelOpt config
without `quant_algo`, python/sglang/srt/layers/quantization/modelopt_quant.py, sglang 0.5.23), the
`--quantization-param-path` JSON written from calibrate's kv_scales.json. `quantization.kv_cache`
maps to `--kv-cache-dtype` as the formats table's sglang rows say (fp8 and fp8_cast: fp8_e4m3, nvfp4
on Blackwell; none: auto). Not served on the CPU by trtkv: SGLang's CPU path needs sgl-kernel's CPU
build and AMX/AVX-512; its own argument parser checks every command trtkv writes
(tests/e2e/test_sglang_args.py, `.venv-sglang`).

This module holds the command lines and the backend's parts; the scales file (and the NVFP4 scale
warning) is trtkv.backends.sglang_scales'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.backends.base import (
    BUILD_SECTIONS,
    command_block,
    http_get_text,
    openai_docker_run,
    tokens_pool,
)
from trtkv.backends.llmapi_args import hf_checkpoint_dir
from trtkv.backends.seam import BuildJob, EngineBackend, MemoryRule
from trtkv.backends.sglang_scales import (
    SCALES_FILE,
    nvfp4_scale_warning,
    uses_scales_file,
    write_scales_file,
)
from trtkv.backends.vllm import VllmRunner, VllmServing
from trtkv.backends.vllm_command import served_model_name  # /v1/models' name, as vLLM's
from trtkv.core.apikey import API_KEY_ENV
from trtkv.core.errors import StageError
from trtkv.core.files import strict_json
from trtkv.core.readback import ReadBackError
from trtkv.core.tools import quote
from trtkv.engines.kv_tiers import sglang_host_tier, sglang_tier_args
from trtkv.engines.pool import ServedPool
from trtkv.engines.sglang import (
    SGLANG_INFO,
    SGLANG_VERSION,
    sglang_at,
    sglang_batch_limit,
    sglang_chunk,
    sglang_info_tokens,
    sglang_init_step,
    sglang_knobs,
    sglang_recipe_pool,
    sglang_token_unit,
)
from trtkv.recipe import Backend, Recipe
from trtkv.recipe.layout import (
    HF,
    Artifacts,
    container_artifacts,
    engine_dir,
    kv_cache_quant_algo,
    served_artifacts,
)
from trtkv.recipe.prefix_cache import prefix_cache

# SGLANG_VERSION (trtkv.engines.sglang, beside the memory rule it pins): the parser
# .venv-sglang checks (`make install-sglang`) and the image below
# Docker Hub lmsysorg/sglang, tags v<version> (docs/docs/get-started/install.mdx @7760d526: CUDA 13
# images)
SGLANG_IMAGE = f"lmsysorg/sglang:v{SGLANG_VERSION}"
SGLANG_VENV = ".venv-sglang"
GPU_COMMAND = "sglang_gpu_command.txt"
# trtkv.deploy.launch.KEY_REF (the shell expands it to "$TRTKV_API_KEY"), spelt here: deploy imports
# the backends
KEY_REF = "\x00" + API_KEY_ENV + "\x00"
# /dev/shm for SGLang's scheduler and TP workers (docker --shm-size, the pods' memory-backed
# /dev/shm)
SHM_GIB = 16
# SGLang reads its key from the command line only (ServerArgs.api_key; no environment form)
KEY_FLAG = "--api-key"


def kv_cache_dtype(recipe: Recipe) -> str:
    """--kv-cache-dtype: the SGLang value trtkv/data/kv_formats.json gives the recipe's format (fp8:
    fp8_e4m3 with the checkpoint's or JSON scales; fp8_cast: fp8_e4m3 without scales, so 1.0;
    nvfp4), auto (the model dtype) for none."""
    value = recipe.kv_row.engine_value("sglang")
    if value is None:
        raise StageError(
            f"recipe {recipe.name}: quantization.kv_cache {recipe.kv_row.choice.name} has no "
            "sglang row in docs/kv-formats.md (trtkv/data/kv_formats.json), so SGLang has no "
            f"--kv-cache-dtype for it. Next: `trtkv validate {recipe.name}` names the formats "
            "SGLang serves."
        )
    return value


def server_args(recipe: Recipe, hf_dir: Path, host: str, scales: Path | None = None) -> list[str]:
    """SGLang's launch_server arguments (shared by `docker run` and the deploy files); `scales`
    defaults to the engine folder where the server reads it (a container:
    /models/<recipe>/engine)."""
    b = recipe.build
    args = [
        "--model-path",
        str(hf_dir),
        "--served-model-name",
        served_model_name(recipe),
        "--host",
        host,
        "--port",
        str(recipe.triton.http_port),
        "--kv-cache-dtype",
        kv_cache_dtype(recipe),
        "--context-length",
        str(b.max_seq_len),
        "--max-running-requests",
        str(b.max_batch_size),
        "--chunked-prefill-size",
        str(sglang_chunk(recipe)),
        "--enable-metrics",
        # --mem-fraction-static (the default resolved) and the --max-total-tokens cap: the values
        # trtkv's plan used
        *sglang_knobs(recipe).args(),
        *sglang_tier_args(recipe),  # the host KV tier (HiCache)
    ]
    if not prefix_cache(recipe).enabled:  # on is SGLang's default and has no flag of its own
        args.append("--disable-radix-cache")
    if uses_scales_file(recipe):
        args += [
            "--quantization-param-path",
            str(scales or served_artifacts(recipe).engine / SCALES_FILE),
        ]
    if recipe.build.moe_activations == "bf16":
        # MXFP4 experts with BF16 activations, SGLang's own pick on SM10x being MXFP8
        # (trtkv.recipe.moe_activations)
        args += ["--flashinfer-mxfp4-moe-precision", "bf16"]
    if b.tp_size > 1:
        args += ["--tp-size", str(b.tp_size)]
    if b.pp_size > 1:
        args += ["--pp-size", str(b.pp_size)]
    return args + parallel_args(recipe)


def parallel_args(recipe: Recipe) -> list[str]:
    """EP and attention DP in SGLang 0.5.23's words: they subdivide --tp-size (GPUs = tp x pp;
    sglang/srt/runtime_context.py derive_parallel_widths). `--attn-dp-size N` is what its
    deprecated `--dp-size N --enable-dp-attention` resolves to (arg_groups/parallel_hook.py)."""
    p, out = recipe.parallelism, []
    if p.attention_dp > 1:
        out += ["--attn-dp-size", str(p.attention_dp)]
    if p.ep > 1:
        out += ["--ep-size", str(p.ep)]
    return out


def gpu_command(recipe: Recipe, hf_dir: Path) -> list[str]:
    """docker run of SGLang's image on the GPUs; the folders it reads (`hf_dir` and, for the scales
    file, the engine folder, on this host) mounted read-only at their canonical container paths,
    which the arguments name."""
    box = container_artifacts(recipe)
    pairs = [(hf_dir, box.hf)] + (
        [(engine_dir(recipe), box.engine)] if uses_scales_file(recipe) else []
    )
    return [
        *openai_docker_run(recipe, served_model_name(recipe), SHM_GIB, pairs),
        SGLANG_IMAGE,
        "python3",
        "-m",
        "sglang.launch_server",
        *server_args(recipe, box.hf, "0.0.0.0", box.engine / SCALES_FILE),
    ]


def reads(recipe: Recipe) -> list[Path]:
    """The host folders the server reads: the HF export, and the engine folder for the scales
    file."""
    return [hf_checkpoint_dir(recipe)] + ([engine_dir(recipe)] if uses_scales_file(recipe) else [])


# ---------------------------------------------------------------------------------------------
# The backend's parts


class SglangBuilder:
    sections = (*BUILD_SECTIONS, "triton", "hardware")

    def kv_source_line(self, recipe: Recipe) -> str:
        where = (
            f"{SCALES_FILE} (--quantization-param-path, one scale per layer shared by K and V)"
            if uses_scales_file(recipe)
            else f"no scales: SGLang warns and uses 1.0 ({recipe.kv_row.choice.name})"
            if recipe.kv_row.choice.kind == "engine"
            else "the HF export's per-layer k_scale/v_scale (ModelOpt's config)"
        )
        return (
            f"KV cache: {kv_cache_quant_algo(recipe) or 'unquantized'}, from SGLang "
            f"--kv-cache-dtype {kv_cache_dtype(recipe)} with {where}"
        )

    def prepare(self, recipe: Recipe) -> tuple[Path, dict[str, Any]]:
        from trtkv.backends import llmapi

        # the same artifact as vLLM's and the LLM API's: ModelOpt's HF export
        return llmapi.BUILDER.prepare(recipe)

    def build(self, job: BuildJob) -> dict[str, Any]:
        recipe, tmp, hf = job.recipe, job.tmp, job.ckpt / HF
        out: dict[str, Any] = {
            "backend": Backend.SGLANG.value,
            "served_model_name": served_model_name(recipe),
            "sglang_version": SGLANG_VERSION,
        }
        if uses_scales_file(recipe):
            write_scales_file(recipe, job.ckpt, tmp)
            out["quantization_param_path"] = str(job.final / SCALES_FILE)
        gpu = gpu_command(recipe, hf)
        (tmp / GPU_COMMAND).write_text(quote(gpu) + "\n")
        job.log(
            f"build: SGLang serves {hf} (--kv-cache-dtype {kv_cache_dtype(recipe)}); command in "
            f"{job.final / GPU_COMMAND}"
        )
        if warning := nvfp4_scale_warning(recipe):
            job.log(f"build: {warning}")
            out["warning"] = warning
        return {**out, "gpu_command": gpu}

    def dry_run_lines(self, recipe: Recipe, ckpt: Path, out: Path) -> list[str]:
        hf = ckpt / HF
        lines = [f"  validate {hf} (ModelOpt's HF export), then write {out / GPU_COMMAND}"]
        if uses_scales_file(recipe):
            lines.append(
                f"  write {out / SCALES_FILE} (SGLang's --quantization-param-path) from "
                f"{ckpt / 'kv_scales.json'}"
            )
        if warning := nvfp4_scale_warning(recipe):
            lines.append(f"  {warning}")
        lines.append(
            f"  GPU ({SGLANG_IMAGE}; not served on this CPU: SGLang's CPU path needs AMX/AVX-512):"
        )
        return lines + command_block(gpu_command(recipe, hf))


class SglangServer:
    """SGLang's own OpenAI server in its container (one node: it starts its own TP workers)."""

    name = "sglang"
    label = "SGLang"
    metrics_path = "/metrics"  # --enable-metrics: Prometheus text on the HTTP port
    # 503 while starting or shutting down, else 200 (entrypoints/http_server.py, 0.5.23)
    health_path = "/health"
    shm_gib = SHM_GIB
    # no environment form: the key goes on the command line, expanded from $TRTKV_API_KEY
    key_env = None
    ray = False
    rank_tasks = False  # one `sglang.launch_server` starts its TP workers
    non_root = True  # run as uid 1000 with HOME on an emptyDir (its JIT caches live under HOME)
    key_note = (
        f"- SGLang requires `Authorization: Bearer <key>` on its API routes (`{KEY_FLAG}`, "
        "expanded in the container's shell from $TRTKV_API_KEY: SGLang has no environment form, so "
        "the key is in the server's argv inside the pod); `/health*` and `/metrics` stay open "
        "(utils/auth.py decide_request_auth)."
    )

    def image(self, recipe: Recipe) -> str | None:
        return SGLANG_IMAGE

    def command(self, recipe: Recipe, host: str, at: Artifacts | None = None) -> list[str]:
        """In its image, the artifacts at `at` (default: their canonical container paths,
        /models/<recipe>)."""
        at = at or served_artifacts(recipe)
        return [
            "python3",
            "-m",
            "sglang.launch_server",
            *server_args(recipe, at.hf, host, at.engine / SCALES_FILE),
        ]

    def node_command(self, recipe: Recipe, host: str) -> list[str]:
        return [*self.command(recipe, host), KEY_FLAG, KEY_REF]

    def data_parallel_nodes(
        self, recipe: Recipe, host: str, gpus_per_node: int
    ) -> tuple[list[str], list[str]] | None:
        return None  # its one multi-node launch (or none) carries attention DP as it is

    def leader_command(self, recipe: Recipe, host: str, ranks: int) -> list[str]:
        # one node (backend_rules refuses more than 8 GPUs per replica)
        return self.node_command(recipe, host)

    def reads(self, recipe: Recipe) -> list[Path]:
        return reads(recipe)

    def served_model(self, recipe: Recipe, at: Artifacts | None = None) -> str:
        return served_model_name(recipe)

    def problem(self, recipe: Recipe) -> str | None:
        return None

    def here(self, recipe: Recipe, *, check: bool = True) -> tuple[list[str], dict[str, str]]:
        """The container: trtkv never serves SGLang on this machine's CPU (backend_rules refuses
        hardware.gpu cpu)."""
        return gpu_command(recipe, hf_checkpoint_dir(recipe)), {}


class SglangServing(VllmServing):
    openai = SglangServer()

    def serves_locally(self, recipe: Recipe) -> bool:
        return False

    def require_input(self, recipe: Recipe) -> None:
        super().require_input(recipe)
        if uses_scales_file(recipe) and not (engine_dir(recipe) / SCALES_FILE).is_file():
            raise StageError(
                f"serve {recipe.name}: {engine_dir(recipe) / SCALES_FILE} is missing (SGLang's "
                f"--quantization-param-path). Next: `trtkv build {recipe.name}`."
            )


class SglangRunner(VllmRunner):
    """`trtkv generate` against the served SGLang: the same OpenAI /v1/completions request as
    vLLM's."""

    label = "SGLang"


SERVING = SglangServing()


def served_pool(recipe: Recipe, http: str, log: Path | None) -> ServedPool | None:
    """The pool the running SGLang reports: /get_server_info's max_total_num_tokens."""
    text = http_get_text(f"{http}/get_server_info")
    try:
        info = strict_json(text) if text else None
    except ValueError as exc:  # no NaN or Infinity, bounded nesting and number length
        raise ReadBackError(SGLANG_INFO, f"not readable JSON ({str(exc)[:120]})") from None
    if info is not None and not isinstance(info, dict):
        raise ReadBackError(SGLANG_INFO, f"a {type(info).__name__}, not an object")
    tokens = sglang_info_tokens(info) if info else None
    return tokens_pool(recipe, tokens, "SGLang /get_server_info: max_total_num_tokens")


def _one_token(recipe: Recipe) -> int:
    return 1  # SGLang's token pool: one slot per token at page_size 1


BACKEND = EngineBackend(
    Backend.SGLANG,
    SglangBuilder(),
    None,
    SERVING,
    SglangRunner(),
    None,
    memory=MemoryRule(
        sglang_recipe_pool,
        sglang_knobs,
        block_tokens=_one_token,
        step_tokens=sglang_chunk,  # tokens per prefill step: --chunked-prefill-size
        served=served_pool,
        batch_limit=sglang_batch_limit,
        tokens=sglang_token_unit,
        host_tier=sglang_host_tier,
        release=SGLANG_VERSION,
        at_release=sglang_at,
        default_step=sglang_init_step,
    ),
)
