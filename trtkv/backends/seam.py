"""The seam between trtkv's stages and its engine backends: a few small protocols, and one
`EngineBackend` per recipe `build.backend` composed of them.

- `Builder`: what `trtkv build` does (check its input, write the build output, print a dry run).
- `RepoLayout`: what `trtkv repo` writes (a Triton model repository in one layout, and its README's
  prose); a backend without one (`repo is None`) is served by its own OpenAI-compatible server.
- `Serving` and `OpenAIServer`: how `trtkv serve` and `trtkv deploy` run it (the bundled or
  containerised tritonserver, or an OpenAI server of its own, or both).
- `Runner`: how `trtkv generate` runs it; `DynamoWorker`: NVIDIA Dynamo's worker for it (None:
  Dynamo cannot run it).
- `MemoryRule`: the KV-pool rule its engine follows and the memory flags its served command carries
  (both from the engine's own module under trtkv.engines), so the plan and the served engine size
  the pool alike.

The stages ask these objects (`backend.repo is None`, `backend.serving.ranks(recipe)`) and never
which backend it is (tests/backends/test_backends.py fails on a stage that imports a concrete
backend or compares a backend's name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from trtkv.contracts.interface import ModelInterface
from trtkv.engines.activation import ModelShape, Setup
from trtkv.engines.kv_tiers import HostTier
from trtkv.engines.pool import (
    BatchLimit,
    EngineKnobs,
    EngineTokens,
    PoolEstimate,
    PoolRule,
    ServedPool,
    TokenFacts,
)
from trtkv.platform.hardware import GPU
from trtkv.platform.versions import Row
from trtkv.recipe import Backend, Recipe
from trtkv.recipe.layout import Artifacts

# the layout name of a backend with no Triton repository (its own OpenAI server)
OPENAI_LAYOUT = "openai"


class TokenizerSource(Enum):
    """Where a repository's tokenizer comes from."""

    # the calibrated checkpoint's tokenizer (else the local model's), copied into the repository
    COPY = "copy"
    # the calibrated checkpoint's tokenizer folder, named by path (a warning while missing)
    REFERENCE = "reference"
    # the HF export the engine loads carries it (the input's own warning covers it)
    SERVED_MODEL = "served_model"


@dataclass(frozen=True)
class BuildJob:
    """One build as the build stage hands it to `Builder.build`."""

    recipe: Recipe
    ckpt: Path  # the input folder (`Builder.prepare`'s)
    tmp: Path  # the folder written, renamed to `final` on success
    final: Path  # the engine folder the written files name
    info: dict[str, Any]  # `Builder.prepare`'s findings
    log: Callable[[str], None]


class Builder(Protocol):
    """What `trtkv build` does for a backend."""

    @property
    def sections(self) -> tuple[str, ...]: ...  # recipe sections the build output depends on

    def kv_source_line(self, recipe: Recipe) -> str: ...

    def prepare(self, recipe: Recipe) -> tuple[Path, dict[str, Any]]: ...

    def build(self, job: BuildJob) -> dict[str, Any]: ...

    def dry_run_lines(self, recipe: Recipe, ckpt: Path, out: Path) -> list[str]: ...


class RepoLayout(Protocol):
    """What `trtkv repo` writes: the model folders, extra files, template values and the README's
    prose."""

    # "ensemble" (inflight_batcher_llm's models), "llmapi" (upstream's one-model layout)
    @property
    def name(self) -> str: ...

    @property
    def interface(self) -> ModelInterface: ...  # the request tensors a client (bench, canary) sends

    @property
    def tokenizer(self) -> TokenizerSource: ...

    # True: each Python model.py gets trtkv's shared module beside it
    @property
    def shared_module(self) -> bool: ...

    def models(self) -> dict[str, tuple[str, str | None]]:
        """Model folder -> (config.pbtxt template, model.py template or None), paths under
        trtkv/repo/templates."""
        ...

    def template_values(self, recipe: Recipe) -> dict[str, str]: ...

    def input(self, recipe: Recipe) -> tuple[Path, str]:
        """What the repository points at, and the stage that writes it."""
        ...

    def files(self, recipe: Recipe) -> dict[str, str]: ...

    def readme_lines(self, recipe: Recipe, tokenizer: str) -> list[str]: ...

    def client_lines(self, recipe: Recipe) -> list[str]: ...

    def launch_lines(
        self, recipe: Recipe, ranks: int, row: Row | None, image: str
    ) -> tuple[str, str]:
        """The README's (software stack, processes) sentences for the GPU container."""
        ...


# data_parallel_nodes' stand-ins, replaced by each deployment's shell words
DP_ADDRESS = "\x00DP_ADDRESS"
DP_START = "\x00DP_START"


class OpenAIServer(Protocol):
    """An OpenAI-compatible server (/v1/completions) the backend can run instead of tritonserver."""

    @property
    def name(self) -> str: ...  # the frontend recorded in server.json: "vllm", "trtllm-serve"

    @property
    def label(self) -> str: ...  # its name in prose: "vLLM"

    @property
    def metrics_path(self) -> str | None: ...  # Prometheus text on the HTTP port (None: none)

    # its own cheap health endpoint (GET, 200 when up): the pods' liveness probe
    @property
    def health_path(self) -> str: ...

    # the memory-backed /dev/shm it needs (docker --shm-size, the pods' /dev/shm)
    @property
    def shm_gib(self) -> int: ...

    # the variable it reads its API key from (None: it has no API key)
    @property
    def key_env(self) -> str | None: ...

    # across nodes a Ray cluster (one task per node); False: mpirun/srun, a task per rank
    @property
    def ray(self) -> bool: ...

    # Slurm starts one task per rank and each runs node_command (trtllm-llmapi-launch under srun
    # --mpi=pmix); False: one process per instance that starts its own TP workers (vLLM, SGLang)
    @property
    def rank_tasks(self) -> bool: ...

    @property
    def non_root(self) -> bool: ...  # its image runs as any user

    @property
    def key_note(self) -> str: ...  # the deployment README's line on its API key

    def image(self, recipe: Recipe) -> str | None:
        """Its container image (None: the Triton TensorRT-LLM image of trtkv's version matrix)."""
        ...

    def command(self, recipe: Recipe, host: str, at: Artifacts | None = None) -> list[str]:
        """The server command inside its image, bound to `host`, reading the artifacts at `at`
        (default: where the recipe's server reads them, trtkv.recipe.layout.served_artifacts:
        /models/<recipe> in a container)."""
        ...

    def node_command(self, recipe: Recipe, host: str) -> list[str]:
        """What each node (or Slurm task) of a deployment runs."""
        ...

    def leader_command(self, recipe: Recipe, host: str, ranks: int) -> list[str]:
        """The multi-node launch on the first node."""
        ...

    def data_parallel_nodes(
        self, recipe: Recipe, host: str, gpus_per_node: int
    ) -> tuple[list[str], list[str]] | None:
        """Across nodes, (the first node's command, every other node's) where the server spreads
        its attention-DP ranks over the nodes itself (DP_ADDRESS and DP_START stand for the first
        node's address and this node's first DP rank); None: its usual multi-node launch."""
        ...

    def reads(self, recipe: Recipe) -> list[Path]:
        """The folders it reads (a deployment copies and mounts only these)."""
        ...

    def served_model(self, recipe: Recipe, at: Artifacts | None = None) -> str: ...

    def problem(self, recipe: Recipe) -> str | None:
        """Why it would fail on this machine, said before minutes of loading (None: no known
        reason)."""
        ...

    def here(self, recipe: Recipe, *, check: bool = True) -> tuple[list[str], dict[str, str]]:
        """(command, extra environment) `trtkv serve` runs on this machine; `check`: StageError when
        not installed."""
        ...


class Serving(Protocol):
    """How `trtkv serve` and `trtkv deploy` run a backend."""

    # the image follows the TensorRT-LLM the build manifest records
    @property
    def records_versions(self) -> bool: ...

    # one tritonserver per rank (mpirun/srun span nodes); False: one for all
    @property
    def rank_processes(self) -> bool: ...

    # its own server (the only one when repo is None), or --trtllm-serve's
    @property
    def openai(self) -> OpenAIServer | None: ...

    def serves_locally(self, recipe: Recipe) -> bool: ...

    def ranks(self, recipe: Recipe) -> int: ...

    def require_input(self, recipe: Recipe) -> None: ...


class Runner(Protocol):
    """How `trtkv generate` runs a backend: on this machine, or as a script for TensorRT-LLM's own
    runner."""

    def describe_local_generate(
        self, recipe: Recipe, max_tokens: int, checkpoint: Path | None
    ) -> str: ...

    def local_generate(
        self, recipe: Recipe, prompt: str, max_tokens: int, checkpoint: Path | None
    ) -> str: ...

    def generate_job(
        self, recipe: Recipe, prompt: str, max_tokens: int
    ) -> tuple[str, dict[str, Any]]: ...


class DynamoWorker(Protocol):
    """NVIDIA Dynamo's worker for a backend (python3 -m dynamo.<framework>)."""

    @property
    def framework(self) -> str: ...  # Dynamo's backendFramework

    @property
    def component(self) -> str: ...  # the aggregated worker's component name

    @property
    def runtime_image(self) -> str: ...  # nvcr.io/nvidia/ai-dynamo/<runtime_image>:<version>

    def args(self, recipe: Recipe, hf_dir: Path, role: str, config_dir: str) -> list[str]: ...

    def engine_config(self, recipe: Recipe, role: str) -> dict[str, Any] | None:
        """The --extra-engine-args YAML of `role` (None: the worker takes every argument on its
        command line)."""
        ...


def _build_tokens_per_block(recipe: Recipe) -> int:
    return recipe.build.tokens_per_block


def _build_max_num_tokens(recipe: Recipe) -> int:
    return recipe.build.max_num_tokens


@dataclass(frozen=True)
class MemoryRule:
    """The KV-pool rule a backend's engine follows and the memory flags its served command carries.

    `pool` is the engine's rule (trtkv.engines.<engine>, called by trtkv.plan.engine_pool;
    `cpu_pool` on the CPU); `knobs` gives the flags and values (the same call the serve, deploy and
    repo commands make); `block_tokens` is the KV block the engine allocates in; `step_tokens` the
    tokens of its profiling or warm-up forward (vLLM max_num_batched_tokens, SGLang's chunked
    prefill, TensorRT-LLM max_num_tokens); `served` reads the pool the running engine reports."""

    pool: PoolRule
    knobs: Callable[[Recipe], EngineKnobs]
    block_tokens: Callable[[Recipe], int] = _build_tokens_per_block
    step_tokens: Callable[[Recipe], int] = _build_max_num_tokens
    cpu_pool: PoolRule | None = None
    # the pool the running engine reports (recipe, its HTTP base URL, its log): `trtkv status` and
    # `trtkv bench` compare it with the plan
    served: Callable[[Recipe, str, Path | None], ServedPool | None] | None = None
    # the most requests the engine runs at once by its own default (recipe, pool tokens per GPU):
    # the ceiling `trtkv init` sizes max_batch_size under; None: the engine has no limit of its own
    batch_limit: Callable[[Recipe, int], BatchLimit] | None = None
    # what one token of the engine's printed token count holds (plan's engine columns); None: the
    # exact account's token (a token in every layer)
    tokens: Callable[[TokenFacts], EngineTokens] | None = None
    # the recipe's host KV tier (triton.kv_host_tier_gib_per_replica) as the engine is told it:
    # its pinned bytes, flag, unit and scope (trtkv.engines.kv_tiers); None: the engine has none
    host_tier: Callable[[Recipe], HostTier | None] | None = None
    # the engine release its rules follow (trtkv's pin); None: the recipe's tensorrt_llm_version
    release: str | None = None
    # its rule at a named release (shape, setup, version, knob, token cap), for the published
    # startup logs in tests/data
    at_release: Callable[[ModelShape, Setup, str, float, int | None], PoolEstimate] | None = None
    # its own per-step token default on a GPU, and why (init's build.max_num_tokens; None: init's)
    default_step: Callable[[GPU], tuple[int, str]] | None = None

    def pool_for(self, recipe: Recipe) -> PoolRule:
        """The rule for the recipe's hardware (`cpu_pool` on the CPU where the engine has one)."""
        return (
            self.cpu_pool
            if self.cpu_pool is not None and recipe.hardware.gpu is GPU.CPU
            else self.pool
        )


@dataclass(frozen=True)
class EngineBackend:
    """One backend: its recipe value and the parts each stage asks for."""

    backend: Backend
    builder: Builder
    repo: RepoLayout | None  # None: no Triton repository (served by serving.openai)
    serving: Serving
    runner: Runner
    dynamo: DynamoWorker | None = None  # None: Dynamo's workers cannot run it
    gpu_engine: bool = True  # False: trtkv's own CPU runtime (not a deployment target on a GPU)
    # None only for a backend without a KV pool of its own (none today)
    memory: MemoryRule | None = None
    # the checkpoint quant methods (quantization_config.quant_method) whose stored weights this
    # engine reads calibrated KV scales beside, so `trtkv calibrate` writes them there
    kv_scales_beside_stored: frozenset[str] = frozenset()

    @property
    def layout(self) -> str:
        """The repository layout's name ("openai": none, its own OpenAI server)."""
        return self.repo.name if self.repo is not None else OPENAI_LAYOUT
