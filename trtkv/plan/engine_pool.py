"""The recipe's engine and knobs -> the KV pool that engine allocates on each GPU
(trtkv.plan.engine_memory's rules), and the knob values the served commands carry so the engine
allocates what the plan says.

One mapping for every backend (the planner, serve, deploy and repo all read it):
  vllm      --gpu-memory-utilization (triton.gpu_memory_utilization; None: vLLM's default),
  --kv-cache-memory-bytes
            pins the pool (triton.kv_pool_gib_per_gpu); on the CPU the pool is pinned to
            max_batch_size sequences unless the recipe sets either knob
  sglang    --mem-fraction-static (triton.mem_fraction_static; None: SGLang's computed default),
  --max-total-tokens
            caps it (triton.kv_pool_gib_per_gpu / bytes per token)
  llmapi    kv_cache_config.free_gpu_memory_fraction (triton.kv_cache_free_gpu_mem_fraction; None:
  0.9),
            kv_cache_config.max_tokens caps it
  tensorrt  kv_cache_free_gpu_mem_fraction (the same field), max_tokens_in_paged_kv_cache caps it
  reference the reference runtime holds max_batch_size sequences of max_seq_len (a cache per
  request): no knob
"""

from __future__ import annotations

from dataclasses import replace

from trtkv.backends import for_recipe
from trtkv.backends.seam import MemoryRule
from trtkv.checkpoints.serving_memory import SGLANG_VERSION, VLLM_VERSION, EngineKnobs
from trtkv.plan.engine_activation import ModelShape, Setup
from trtkv.plan.engine_memory import GIB, PoolEstimate, Term, vllm_pool
from trtkv.plan.engine_memory_others import sglang_pool, trt_engine_pool, trtllm_pool
from trtkv.plan.model import DTYPE_BYTES, Architecture, seq_bytes, weights_bytes
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import Recipe
from trtkv.recipe.attention import layer_formats

__all__ = [
    "ENGINES",
    "RECIPE_RULES",
    "memory_rule",
    "model_shape",
    "nvswitch",
    "pool_at_version",
    "recipe_pool",
    "recipe_setup",
]


def nvswitch(gpu: GPU) -> bool:
    """Whether TP ranks on this GPU model talk over an NVSwitch with NCCL NVLS (Hopper and Blackwell
    SXM parts)."""
    spec = GPU_SPECS.get(gpu)
    return spec is not None and spec.arch in ("Hopper", "Blackwell") and gpu is not GPU.L40S


def model_shape(arch: Architecture, act_bytes: int) -> ModelShape:
    """The architecture figures activation memory depends on."""
    moe = arch.moe
    dense = arch.intermediate_size or 0
    if moe is not None and len(moe.moe_layers) >= arch.num_layers:
        dense = 0  # every layer routes: no dense MLP
    return ModelShape(
        layers=arch.num_layers,
        hidden=arch.hidden_size,
        intermediate=dense,
        vocab=arch.vocab_size or 0,
        act_bytes=act_bytes,
        experts_per_token=moe.experts_per_token if moe else 0,
        expert_intermediate=moe.expert_intermediate_size if moe else 0,
        shared_intermediate=moe.shared_intermediate_size if moe else 0,
    )


def gpu_total_bytes(recipe: Recipe) -> float:
    """The GPU's memory (hardware.memory_gib when given, else the GPU table's), in bytes."""
    hw = recipe.hardware
    spec = GPU_SPECS.get(hw.gpu)
    gib = hw.memory_gib or (spec.memory_gib if spec else 0.0)
    return gib * GIB


def memory_rule(recipe: Recipe) -> MemoryRule:
    """The recipe's backend's memory rule (which engine rule, which flags)."""
    rule = for_recipe(recipe).memory
    if rule is None:  # pragma: no cover - every backend names one (tests/backends/test_backends.py)
        raise ValueError(f"backend {recipe.build.backend.value} names no memory rule")
    return rule


def recipe_setup(recipe: Recipe, arch: Architecture) -> Setup:
    """One GPU of the recipe's deployment as its engine sees it (the limits the served command
    passes)."""
    b = recipe.build
    mem = memory_rule(recipe)
    fmts = layer_formats(
        arch.layer_list(),
        recipe.kv_format,
        tuple(recipe.quantization.kv_skip_layers),
        recipe.kv_skip_format,
    )
    per_token = seq_bytes(arch, fmts, 1, b.tp_size, b.pp_size)
    return Setup(
        gpu_total_bytes=gpu_total_bytes(recipe),
        tp=b.tp_size,
        pp=b.pp_size,
        weights_bytes=weights_bytes(arch, recipe)[1],
        kv_bytes_per_token=per_token,
        max_num_tokens=mem.step_tokens(recipe),
        max_num_seqs=b.max_batch_size,
        nvswitch=nvswitch(recipe.hardware.gpu),
        tokens_per_block=mem.block_tokens(recipe),
        blackwell_datacenter=recipe.hardware.gpu is GPU.B200,
    )


def _recipe_vllm(
    recipe: Recipe, arch: Architecture, setup: Setup, knobs: EngineKnobs
) -> PoolEstimate:
    pin = float(knobs.cap_value) if knobs.cap_value is not None else None
    return vllm_pool(
        model_shape(arch, DTYPE_BYTES[recipe.model.dtype]),
        setup,
        VLLM_VERSION,
        float(knobs.value or 0),
        pin,
        is_default=knobs.is_default,
    )


def _recipe_vllm_cpu(
    recipe: Recipe, arch: Architecture, setup: Setup, knobs: EngineKnobs
) -> PoolEstimate:
    from trtkv.plan.engine_cpu import vllm_cpu_pool

    return vllm_cpu_pool(recipe, setup, knobs)


def _recipe_sglang(
    recipe: Recipe, arch: Architecture, setup: Setup, knobs: EngineKnobs
) -> PoolEstimate:
    return sglang_pool(
        setup,
        SGLANG_VERSION,
        float(knobs.value or 0),
        fraction_is_default=knobs.is_default,
        max_total_tokens=knobs.cap_value,
    )


def _recipe_trtllm(
    recipe: Recipe, arch: Architecture, setup: Setup, knobs: EngineKnobs
) -> PoolEstimate:
    return trtllm_pool(
        model_shape(arch, DTYPE_BYTES[recipe.model.dtype]),
        setup,
        recipe.build.tensorrt_llm_version,
        float(knobs.value or 0),
        fraction_is_default=knobs.is_default,
        max_tokens=knobs.cap_value,
    )


def _recipe_trt_engine(
    recipe: Recipe, arch: Architecture, setup: Setup, knobs: EngineKnobs
) -> PoolEstimate:
    return trt_engine_pool(
        model_shape(arch, DTYPE_BYTES[recipe.model.dtype]),
        setup,
        recipe.build.tensorrt_llm_version,
        float(knobs.value or 0),
        fraction_is_default=knobs.is_default,
        max_tokens=knobs.cap_value,
    )


def recipe_pool(recipe: Recipe, arch: Architecture) -> PoolEstimate:
    """The KV pool the recipe's engine allocates on each GPU, by that engine's rule at trtkv's
    pinned version, with the flags its served command carries (the backend's MemoryRule: the same
    call serve, deploy and repo make)."""
    mem = memory_rule(recipe)
    setup = recipe_setup(recipe, arch)
    return RECIPE_RULES[mem.rule_for(recipe)](recipe, arch, setup, mem.knobs(recipe))


def reference_pool(
    recipe: Recipe, arch: Architecture, setup: Setup, knobs: EngineKnobs
) -> PoolEstimate:
    """The reference runtime: one cache per request, at most max_batch_size requests of
    max_seq_len."""
    from trtkv.plan.model import recipe_accounting

    b = recipe.build
    accounting, block = recipe_accounting(recipe)
    fmts = layer_formats(
        arch.layer_list(),
        recipe.kv_format,
        tuple(recipe.quantization.kv_skip_layers),
        recipe.kv_skip_format,
    )
    pool = b.max_batch_size * seq_bytes(
        arch, fmts, b.max_seq_len, b.tp_size, b.pp_size, accounting, b.max_num_tokens, block
    )
    est = PoolEstimate(
        "reference",
        "trtkv",
        "reference runtime: max_batch_size sequences of max_seq_len, one cache "
        "per request (trtkv.runtime.batch.Batcher admits max_batch_size)",
        "trtkv/runtime/batch.py Batcher, trtkv/runtime/engine.py ReferenceRuntime.new_cache",
        "none",
        0.0,
        True,
        pool,
        (Term("weights", setup.weights_bytes, "weights"),),
        pool,
        pool,
    )
    return replace(est, bound="pin")


RECIPE_RULES = {
    "vllm": _recipe_vllm,
    "vllm-cpu": _recipe_vllm_cpu,
    "sglang": _recipe_sglang,
    "trtllm": _recipe_trtllm,
    "tensorrt": _recipe_trt_engine,
    "reference": reference_pool,
}


def _vllm_at(
    shape: ModelShape, setup: Setup, version: str, knob: float, cap: int | None, pin: float | None
) -> PoolEstimate:
    return vllm_pool(shape, setup, version, knob, pin, is_default=False)


def _sglang_at(
    shape: ModelShape, setup: Setup, version: str, knob: float, cap: int | None, pin: float | None
) -> PoolEstimate:
    return sglang_pool(setup, version, knob, fraction_is_default=False, max_total_tokens=cap)


def _trtllm_at(
    shape: ModelShape, setup: Setup, version: str, knob: float, cap: int | None, pin: float | None
) -> PoolEstimate:
    return trtllm_pool(shape, setup, version, knob, fraction_is_default=False, max_tokens=cap)


def _trt_engine_at(
    shape: ModelShape, setup: Setup, version: str, knob: float, cap: int | None, pin: float | None
) -> PoolEstimate:
    return trt_engine_pool(shape, setup, version, knob, fraction_is_default=False, max_tokens=cap)


# The engines by the names the published-log data uses: vllm, sglang, trtllm (PyTorch backend / LLM
# API) and tensorrt (the engine path).
ENGINE_RULES = {
    "vllm": _vllm_at,
    "sglang": _sglang_at,
    "trtllm": _trtllm_at,
    "tensorrt": _trt_engine_at,
}
ENGINES = tuple(ENGINE_RULES)


def pool_at_version(
    engine: str,
    version: str,
    shape: ModelShape,
    setup: Setup,
    knob_value: float,
    *,
    cap_tokens: int | None = None,
    pin_bytes: float | None = None,
) -> PoolEstimate:
    """One engine's pool by the rule of a named release (the published-log tests plan each log with
    its own version's rule; recipe_pool uses trtkv's pinned releases)."""
    rule = ENGINE_RULES.get(engine)
    if rule is None:
        raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    return rule(shape, setup, version, knob_value, cap_tokens, pin_bytes)
