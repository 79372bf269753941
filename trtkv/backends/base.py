"""What the backends share: the defaults of the seam's parts (trtkv.backends.seam), the checkpoint
check and the command formatting of dry runs. Each backend module composes its `EngineBackend` from
these and its own parts; its recipe rules are data and code of the model layer
(trtkv.recipe.backend_rules).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.backends.seam import OpenAIServer, TokenizerSource
from trtkv.checkpoints.serving_memory import (
    TRTLLM_LOG,
    ServedPool,
    kv_bytes_per_token_per_gpu,
    trtllm_log_pool,
)
from trtkv.contracts.canary import canary_script, docker_health_args
from trtkv.contracts.interface import ENSEMBLE, ModelInterface
from trtkv.contracts.stage import manifest_hash
from trtkv.core import paths
from trtkv.core.errors import StageError
from trtkv.core.readback import log_tail
from trtkv.core.tools import quote
from trtkv.platform.hardware import GPU
from trtkv.platform.versions import Row
from trtkv.recipe import Recipe
from trtkv.recipe.layout import checkpoint_dir, engine_dir

BUILD_SECTIONS = ("model", "quantization", "build")
# inflight_batcher_llm's models around the backend's tensorrt_llm: model folder -> (config template,
# model.py template)
ENSEMBLE_MODELS: dict[str, tuple[str, str | None]] = {
    "preprocessing": ("preprocessing/config.pbtxt", "preprocessing/preprocessing.py"),
    "postprocessing": ("postprocessing/config.pbtxt", "postprocessing/postprocessing.py"),
    "ensemble": ("ensemble/config.pbtxt", None),
}
STREAM_STEP = "tensorrt_llm_stream"  # trtkv's BLS model between the C++ model and postprocessing
STREAM_MODEL = ("tensorrt_llm_stream/config.pbtxt", "tensorrt_llm_stream/tensorrt_llm_stream.py")


def prepare_checkpoint(recipe: Recipe) -> tuple[Path, dict[str, Any]]:
    """(checkpoint folder, preflight info) before a build on the TensorRT-LLM checkpoint; StageError
    listing every problem."""
    ckpt, _summary, problems = check_checkpoint(recipe)
    if problems:
        raise StageError(
            f"build {recipe.name}: the checkpoint does not fit the recipe:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    return ckpt, {"checkpoint": str(ckpt)}


class EnsembleLayout:
    """The inflight_batcher_llm layout: preprocessing -> the backend's tensorrt_llm ->
    postprocessing, as `ensemble`."""

    name = "ensemble"
    interface: ModelInterface = ENSEMBLE
    tokenizer = TokenizerSource.REFERENCE
    shared_module = True
    # tensorrt_llm model templates: (config.pbtxt, model.py or None)
    llm_model: tuple[str, str | None]
    llm_step_model = "tensorrt_llm"  # the ensemble's middle step

    def models(self) -> dict[str, tuple[str, str | None]]:
        out = {**ENSEMBLE_MODELS, "tensorrt_llm": self.llm_model}
        if self.llm_step_model == STREAM_STEP:
            out[STREAM_STEP] = STREAM_MODEL
        return out

    def template_values(self, recipe: Recipe) -> dict[str, str]:
        return {"llm_step_model": self.llm_step_model, "llm_module": ""}

    def input(self, recipe: Recipe) -> tuple[Path, str]:
        return engine_dir(recipe), "build"

    def files(self, recipe: Recipe) -> dict[str, str]:
        return {}

    def summary(self, recipe: Recipe) -> str:
        """One line for the README: what the tensorrt_llm model is."""
        raise NotImplementedError

    def notes(self, recipe: Recipe) -> list[str]:
        """Extra README paragraphs."""
        return []

    def readme_lines(self, recipe: Recipe, tokenizer: str) -> list[str]:
        return [
            "| model | what |",
            "|---|---|",
            "| `preprocessing` | Python: text -> `input_ids`, `input_lengths`, "
            f"`request_output_len`, end/pad ids, stop/bad words; tokenizer {tokenizer} |",
            f"| `tensorrt_llm` | {self.summary(recipe)}; decoupled: "
            f"{str(recipe.triton.decoupled).lower()} |",
            "| `postprocessing` | Python: token ids -> text |",
            "| `ensemble` | platform `ensemble`: preprocessing -> tensorrt_llm -> postprocessing |",
            "",
            *self.notes(recipe),
        ]

    def client_lines(self, recipe: Recipe) -> list[str]:
        t = recipe.triton
        body = (
            '{"text_input": "The capital of France is", "max_tokens": 8, "bad_words": "", '
            '"stop_words": ""}'
        )
        stream_body = body[:-1] + ', "stream": true}'
        return [
            "## Ask it something",
            "",
            "```",
            f"curl -s -X POST http://{t.host}:{t.http_port}/v2/models/ensemble/generate -d "
            f"'{body}'",
            f"curl -s -N -X POST http://{t.host}:{t.http_port}/v2/models/ensemble/generate_stream "
            f"-d '{stream_body}'",
            "```",
            "",
            f"gRPC streaming (decoupled) on {t.host}:{t.grpc_port}: model `ensemble`, inputs "
            "`text_input` (BYTES, shape [1, 1]), `max_tokens` (INT32 [1, 1]), `stream` (BOOL [1, "
            "1]) and optionally `temperature`, `top_k`, `top_p`, `seed`, `end_id`, `pad_id`, "
            "`stop_words`, `bad_words`; output `text_output`. Streamed responses carry only the "
            "new text. `trtkv bench` is such a client.",
            "",
        ]

    def launch_lines(
        self, recipe: Recipe, ranks: int, row: Row | None, image: str
    ) -> tuple[str, str]:
        stack = (
            f"The image ships TensorRT-LLM {row.tensorrt_llm} and TensorRT {row.tensorrt} (trtkv's "
            "version matrix, `trtkv/data/trtllm_versions.json`); an engine runs only under the "
            "TensorRT-LLM/TensorRT that built it."
            if row
            else f"`{image}` is not in trtkv's version matrix: check that it ships the "
            "TensorRT-LLM that built the engine."
        )
        mpi = (
            f"tp_size x pp_size = {recipe.world_size}: one tritonserver per rank under `mpirun`."
            if ranks > 1
            else "One GPU rank: a single tritonserver."
        )
        return stack, mpi


class TritonServing:
    """Served by tritonserver from the repository: the bundled one on hardware.gpu cpu, else the GPU
    container."""

    records_versions = False
    rank_processes = True
    openai: OpenAIServer | None = None  # no OpenAI server of its own

    def serves_locally(self, recipe: Recipe) -> bool:
        """True: the bundled tritonserver runs it on this machine (hardware.gpu cpu); False: the GPU
        container."""
        return recipe.hardware.gpu is GPU.CPU

    def ranks(self, recipe: Recipe) -> int:
        """tritonserver processes per model instance (one per rank under mpirun for the engine
        path)."""
        return 1

    def require_input(self, recipe: Recipe) -> None:
        """StageError unless what the server loads is there (default: the build output)."""
        from trtkv.contracts.stage import require_input

        require_input(engine_dir(recipe), "serve", "build", recipe)


class RefusingRunner:
    """A seam.Runner whose methods refuse (`trtkv generate`'s defaults): a backend subclasses it and
    overrides what it runs."""

    def describe_local_generate(
        self, recipe: Recipe, max_tokens: int, checkpoint: Path | None
    ) -> str:
        raise StageError(f"backend {recipe.build.backend.value} does not run on this machine")

    def local_generate(
        self, recipe: Recipe, prompt: str, max_tokens: int, checkpoint: Path | None
    ) -> str:
        raise StageError(f"backend {recipe.build.backend.value} does not run on this machine")

    def generate_job(
        self, recipe: Recipe, prompt: str, max_tokens: int
    ) -> tuple[str, dict[str, Any]]:
        """A runner script and its JSON arguments for TensorRT-LLM's own runner (GPU backends)."""
        raise StageError(f"backend {recipe.build.backend.value} has no TensorRT-LLM runner")


def failed_log_path(recipe: Recipe) -> Path:
    """Where a failed build's log is kept (the temporary engine folder itself is removed)."""
    return paths.recipe_output_dir(recipe.name) / "engine.failed-build.log"


def check_checkpoint(recipe: Recipe) -> tuple[Path, dict[str, Any], list[str]]:
    """The checkpoint folder, its validation summary and every problem with it (empty when it fits
    the recipe).

    One source of truth: trtkv.checkpoints.trtllm_checkpoint.validate_trtllm_checkpoint (the check
    calibrate runs after export).
    """
    from trtkv.checkpoints.trtllm_checkpoint import validate_trtllm_checkpoint

    ckpt = checkpoint_dir(recipe)
    if manifest_hash(ckpt) is None:
        return (
            ckpt,
            {},
            [
                f"{ckpt}: missing or incomplete (no manifest.json). Next: run `trtkv calibrate "
                f"{recipe.name}` (or `make engine RECIPE={recipe.name}`, which runs calibrate then "
                "build)"
            ],
        )
    try:
        summary = validate_trtllm_checkpoint(ckpt, recipe)
    except StageError as exc:
        return ckpt, {}, [str(exc).replace("<recipe>", recipe.name) + " (or fix the recipe)"]
    return ckpt, summary, []


def command_block(cmd: list[str]) -> list[str]:
    """A command as copy-pasteable shell lines (flag/value pairs joined with backslash
    continuations)."""
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
        "      " + line + (" \\" if n < len(lines) - 2 else "") for n, line in enumerate(lines[1:])
    ]


# ---------------------------------------------------------------------------------------------
# The served pool (MemoryRule.served): what a running engine reports


# /metrics of a busy server is tens of KiB; a log tail is read from its end
MAX_READ_BYTES = 4 << 20


def http_get_text(url: str, timeout_s: float = 5.0) -> str | None:
    """The body of one GET answered 200 (trtkv.core.httpcall: the API key, one deadline, at most
    MAX_READ_BYTES); None on any failure, a larger answer included (half a /metrics page would read
    as wrong numbers)."""
    from trtkv.core.httpcall import request

    try:
        answer = request(url, timeout_s=timeout_s, max_bytes=MAX_READ_BYTES)
    except OSError:
        return None
    return answer.text if answer.status == 200 else None


def log_text(log: Path | None, source: str = "the server log") -> str:
    """The server log's last MAX_READ_BYTES (the startup lines of a long-running server are kept by
    trtkv's log, which serve starts afresh); empty when there is none. Read by
    trtkv.core.readback.log_tail: never through a symbolic link, a FIFO or a device (ReadBackError
    naming `source`)."""
    return "" if log is None else log_tail(log, source, MAX_READ_BYTES)


def tokens_pool(recipe: Recipe, tokens: int | None, source: str) -> ServedPool | None:
    """A pool an engine reports in tokens, in bytes per GPU at the recipe's KV bytes per token."""
    if tokens is None:
        return None
    per_token = kv_bytes_per_token_per_gpu(recipe)
    return ServedPool(None if per_token is None else tokens * per_token, tokens, source)


def trtllm_served(recipe: Recipe, http: str, log: Path | None) -> ServedPool | None:
    """TensorRT-LLM (LLM API and engine path): its log line 'Allocated X GiB for max tokens in paged
    KV cache (N)'."""
    found = trtllm_log_pool(log_text(log, TRTLLM_LOG))
    if found is None:
        return None
    return ServedPool(
        found[0],
        found[1],
        "TensorRT-LLM log: 'Allocated X GiB for max tokens in paged KV cache (N)'",
    )


def openai_docker_run(
    recipe: Recipe, model_name: str, shm_gib: int, mounts: list[tuple[Path, Path]]
) -> list[str]:
    """The `docker run` head of an OpenAI server's container on the GPUs (vLLM, SGLang): removed on
    exit, every GPU, --shm-size rather than --ipc=host (vLLM's docs allow either; the host's
    IPC namespace stays closed), named trtkv-<recipe>, the HTTP port published on the recipe's host,
    the canary request as the container's health check, and each (host, container) folder mounted
    read-only (the server only reads them). The image and its arguments follow."""
    t = recipe.triton
    health = docker_health_args(
        canary_script(t.http_port, openai_model=model_name), t.startup_timeout_s
    )
    volumes = [a for host, inside in mounts for a in ("-v", f"{host}:{inside}:ro")]
    return [
        "docker",
        "run",
        "--rm",
        "--gpus",
        "all",
        f"--shm-size={shm_gib}g",
        "--name",
        f"trtkv-{recipe.name}",
        "-p",
        f"{t.host}:{t.http_port}:{t.http_port}",
        *health,
        *volumes,
    ]
