"""The recipe schema: enums (the one source of truth for every choice) and the pydantic sections
(extra keys forbidden, validators that list the valid values); the section base and quantization
live in recipe/sections.py, the triton, bench and probe sections in recipe/triton_section.py,
bench_section.py and probe_section.py, re-exported here; the model section in
recipe/model_section.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from trtkv.kvcache.engines import FormatRow
from trtkv.kvcache.formats import KVFormat
from trtkv.platform import versions
from trtkv.platform.gpu_names import gpu_from_name, known_gpus
from trtkv.platform.hardware import GPU
from trtkv.recipe.bench_section import BenchConfig  # noqa: F401 - re-exported: the schema's public face
from trtkv.recipe.enums import (  # noqa: F401 - re-exported: the schema's public face
    BACKEND_ALIASES,
    ENGINE_KV_FORMATS,
    KV_CACHE_ALIASES,
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
    StateDtype,
    WeightQuant,
    kv_algo,
    kv_row,
)
from trtkv.recipe.limits import bounded
from trtkv.recipe.model_section import ModelConfig
from trtkv.recipe.parallel import Parallelism
from trtkv.recipe.probe_section import ProbeConfig
from trtkv.recipe.sections import QuantizationConfig, Section  # noqa: F401 - re-exported: the schema's public face
from trtkv.recipe.triton_section import TritonConfig  # noqa: F401 - re-exported: the schema's public face

# ---------------------------------------------------------------------------------------------
# Schema


class CalibrationConfig(Section):
    dataset: str = Field(
        "calibration_data/calib/*.jsonl",
        description='`.jsonl` (`{"text": ...}`) or `.txt` file, folder or glob; relative paths '
        "are from the project root.",
    )
    num_samples: int = bounded(16, "requests", description="Calibration sequences.")
    seq_len: int = bounded(256, "positions", description="Tokens per calibration sequence.")
    batch_size: int = bounded(4, "batch", description="Sequences per forward pass.")
    seed: int = bounded(
        1234, "seed", description="Seed for sample selection (same seed, same scales)."
    )


class BuildConfig(Section):
    backend: Backend = Field(
        Backend.TENSORRT,
        description="Engine backend: tensorrt (trtllm-build engines, TensorRT-LLM <= 1.2.x), "
        "llmapi (the LLM API on the HF checkpoint, any TensorRT-LLM; `pytorch` is accepted as an "
        "alias), reference (trtkv's CPU runtime), vllm (vLLM's OpenAI server on the HF "
        "checkpoint), sglang (SGLang's OpenAI server on the HF checkpoint, GPU only).",
    )
    max_batch_size: int = bounded(8, "batch", description="Largest in-flight batch.")
    max_input_len: int = bounded(2048, "positions", description="Longest prompt in tokens.")
    max_seq_len: int = bounded(4096, "positions", description="Prompt + generated tokens.")
    max_num_tokens: int = bounded(
        8192, "positions", description="Tokens per engine step (packed batch)."
    )
    tp_size: int = bounded(1, "gpus", description="Tensor parallelism.")
    pp_size: int = bounded(1, "gpus", description="Pipeline parallelism.")
    ep_size: int = bounded(
        1,
        "gpus",
        description="Expert parallelism (MoE models): the routed experts spread over ep_size of "
        "the tp_size GPUs, each expert tensor parallel over tp_size / ep_size (SGLang --ep-size, "
        "TensorRT-LLM moe_expert_parallel_size; vLLM --enable-expert-parallel spreads them over "
        "all: ep_size = tp_size). GPUs stay tp_size x pp_size.",
    )
    attention_dp_size: int = bounded(
        1,
        "gpus",
        description="Attention data parallelism: the tp_size GPUs form attention_dp_size groups, "
        "each attending to its own sequences with tp_size / attention_dp_size-way TP and keeping "
        "their KV, while the experts stay spread over all tp_size (SGLang --attn-dp-size, "
        "TensorRT-LLM enable_attention_dp: attention_dp_size = tp_size; vLLM --data-parallel-size "
        "with --tensor-parallel-size tp_size / attention_dp_size).",
    )
    gemm_plugin: GemmPlugin = Field(
        GemmPlugin.AUTO,
        description="trtllm-build `--gemm_plugin`; auto follows "
        "TensorRT-LLM's perf best practices: FP8 weights: fp8 at max_batch_size <= 4 (the "
        "experimental FP8 plugin's small-batch case), else disable; other weights: the "
        "model dtype.",
    )
    use_paged_context_fmha: bool = Field(
        True,
        description="trtllm-build `--use_paged_context_fmha` (needed for chunked context and KV "
        "reuse); forced off for an INT8 KV cache (TensorRT-LLM refuses it) and for an FP8 KV cache "
        "without FP8 weights.",
    )
    use_fp8_context_fmha: bool | None = Field(
        None,
        description="trtllm-build `--use_fp8_context_fmha`; default: on exactly when the KV cache "
        "and the weights are both FP8 (TensorRT-LLM needs both).",
    )
    multiple_profiles: bool = Field(True, description="trtllm-build `--multiple_profiles`.")
    tokens_per_block: int = bounded(32, "positions", description="Paged KV block size in tokens.")
    mamba_cache_dtype: StateDtype = Field(
        "auto",
        description="Linear-attention / Mamba conv state dtype (vLLM "
        "--mamba-cache-dtype; auto: the model dtype).",
    )
    mamba_ssm_cache_dtype: StateDtype = Field(
        "auto",
        description="Recurrent state dtype (vLLM --mamba-ssm-cache-dtype;"
        " auto: the engine's default, trtkv.recipe.state.state_dtypes).",
    )
    moe_activations: Literal["auto", "bf16", "mxfp8"] = Field(
        "auto",
        description="The activations MXFP4 experts (gpt-oss) run with: auto, the engine's own "
        "choice (TensorRT-LLM and SGLang: mxfp8 on Blackwell; vLLM: bf16; every engine bf16 below "
        "Blackwell); mxfp8 on vLLM adds `--quantization-config` moe.activation (Blackwell only); "
        "bf16 on SGLang adds `--flashinfer-mxfp4-moe-precision bf16` (SM10x only). The plan prices "
        "the experts with the matching kernel rows (trtkv.recipe.moe_activations).",
    )
    tensorrt_llm_version: str = Field(
        versions.DEFAULT_TRTLLM,
        description="TensorRT-LLM release that builds and serves the engine; picks the Triton "
        "image from trtkv's version matrix (`trtkv/data/trtllm_versions.json`).",
    )

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_alias(cls, value: Any) -> Any:
        return BACKEND_ALIASES.get(value, value) if isinstance(value, str) else value

    @field_validator("tensorrt_llm_version")
    @classmethod
    def _known_release(cls, value: str) -> str:
        """A release the version matrix knows, matched whole (it lands in image names and shell
        lines)."""
        releases = versions.supported_trtllm()
        builds = [row.tensorrt_llm for row in versions.rows() if row.tensorrt_llm not in releases]
        if value not in releases and value not in builds:
            extra = f" (or the NGC build {', '.join(dict.fromkeys(builds))})" if builds else ""
            raise ValueError(
                f"TensorRT-LLM {value!r} is not in trtkv's version matrix (the whole version must "
                f"match). Allowed: {', '.join(releases)}{extra}"
            )
        return value


class HardwareConfig(Section):
    gpu: GPU = Field(GPU.CPU, description="Target accelerator, or `cpu`.")
    count: int = bounded(
        1, "gpus", description="GPUs used by one model instance (= tp_size x pp_size)."
    )
    gpus_per_node: int = bounded(
        8,
        "gpus",
        description="GPUs in one node; a model instance larger than this spans "
        "count / gpus_per_node whole nodes (`trtkv deploy`).",
    )
    memory_gib: float | None = bounded(
        None, "memory_gib", description="Override the GPU's memory (GiB)."
    )
    hbm_bandwidth_gbps: float | None = bounded(
        None, "bandwidth_gbps", description="Override the GPU's memory bandwidth (GB/s)."
    )
    activation_reserve_gib: float | None = Field(
        None,
        description="Removed (a value is refused): each engine's own "
        "memory rule sizes activation and buffers (docs/plan.md).",
    )

    @field_validator("activation_reserve_gib")
    @classmethod
    def _reserve_removed(cls, value: float | None) -> float | None:
        if value is not None:
            raise ValueError(
                "no longer used: the planner follows each engine's own memory rule (activation "
                "from the architecture and the batch limits). Remove it; to keep memory free, "
                "lower the engine's knob (triton.gpu_memory_utilization for vllm, "
                "triton.mem_fraction_static for sglang, triton.kv_cache_free_gpu_mem_fraction for "
                "llmapi/tensorrt) or set triton.kv_pool_gib_per_gpu"
            )
        return value

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_by_any_name(cls, value: Any) -> Any:
        """trtkv's name, nvidia-smi's (`NVIDIA H100 80GB HBM3`) or GPU feature discovery's label
        value."""
        if isinstance(value, str) and gpu_from_name(value) is None:
            raise ValueError(
                f"unknown GPU {value[:80]!r}: use one of {known_gpus()} (a name as nvidia-smi "
                "prints it, e.g. 'NVIDIA H100 80GB HBM3', works too); for a GPU not listed pick "
                "the nearest and set hardware.memory_gib and hardware.hbm_bandwidth_gbps"
            )
        return gpu_from_name(value) if isinstance(value, str) else value


class Recipe(Section):
    """One deployment: model, quantization, calibration, build, hardware, serving and benchmark
    settings."""

    model: ModelConfig
    quantization: QuantizationConfig = QuantizationConfig()
    calibration: CalibrationConfig = CalibrationConfig()
    build: BuildConfig = BuildConfig()
    hardware: HardwareConfig = HardwareConfig()
    triton: TritonConfig = TritonConfig()
    bench: BenchConfig = BenchConfig()
    probe: ProbeConfig = ProbeConfig()
    description: str = Field("", description="One line shown by `trtkv ls`.")

    @field_validator("description")
    @classmethod
    def _printable(cls, value: str) -> str:
        """One line: it lands in `trtkv ls`, READMEs and reports."""
        if not value.isprintable():
            raise ValueError(
                "must be one line of printable text (no line breaks or control characters)"
            )
        return value

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
    def parallelism(self) -> Parallelism:
        """TP, PP, EP and attention DP as one value (trtkv.recipe.parallel): the one accessor the
        memory rule, the speed model and aiconfigurator's mapping read."""
        b = self.build
        return Parallelism(b.tp_size, b.pp_size, b.ep_size, b.attention_dp_size)

    @property
    def fp8_kv_and_weights(self) -> bool:
        """FP8 KV cache and FP8 weights: what TensorRT-LLM's FP8 (paged) context FMHA needs."""
        q = self.quantization
        return q.kv_cache is KVCacheQuant.FP8 and q.weights is WeightQuant.FP8

    @property
    def fp8_context_fmha(self) -> bool:
        """`--use_fp8_context_fmha`: the recipe's flag, by default on exactly when KV and weights
        are both FP8."""
        flag = self.build.use_fp8_context_fmha
        return self.fp8_kv_and_weights if flag is None else flag

    @property
    def kv_row(self) -> FormatRow:
        """The registry row of quantization.kv_cache (trtkv/data/kv_formats.json): its choice
        (kind, checkpoint kv_cache_quant_algo, storage), numerics and engine values."""
        return kv_row(self.quantization.kv_cache)

    @property
    def kv_format(self) -> KVFormat:
        """The KV cache format the recipe deploys (its row's storage: fp8_attn_head stores as fp8,
        fp8_cast as fp8_scale1), the model dtype when unquantized."""
        choice = self.kv_row.choice
        if choice.kind != "unquantized":
            return KVFormat(choice.storage)
        return KVFormat.BF16 if self.model.dtype is ModelDtype.BFLOAT16 else KVFormat.FP16

    @property
    def kv_skip_format(self) -> KVFormat:
        """The format of the layers in quantization.kv_skip_layers: the model dtype."""
        return KVFormat.FP16 if self.model.dtype is ModelDtype.FLOAT16 else KVFormat.BF16

    @property
    def kv_format_label(self) -> str:
        """The deployed KV format, with the layers kept in the model dtype, e.g. `fp8` or
        `fp8+bf16[0,29]`."""
        skip = self.quantization.kv_skip_layers
        choice = self.kv_row.choice  # a format calibrated in one engine's form: its own name
        base = choice.name if choice.kind == "calibrated_engine" else self.kv_format.value
        return f"{base}+{self.kv_skip_format.value}[{','.join(map(str, skip))}]" if skip else base

    @property
    def chunked_context(self) -> bool:
        """Prompts longer than max_num_tokens need chunked context/prefill; every backend then turns
        it on (tensorrt: enable_chunked_context + paged context FMHA; LLM API:
        enable_chunked_prefill; reference: chunked prefill passes of max_num_tokens)."""
        return self.build.max_input_len > self.build.max_num_tokens

    @property
    def paged_context_fmha(self) -> bool:
        """`--use_paged_context_fmha`: the recipe's flag, forced off where TensorRT-LLM cannot run
        it.

        INT8 KV: "Paged Context FMHA doesn't work with int8 kv cache currently" (builder and
        attention plugin). FP8 KV without FP8 weights: "FP8 Paged Context FMHA only works with fp8
        quantization workflow".
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


def _dig(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data
