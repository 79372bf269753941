"""The recipe's engine and knobs -> the KV pool that engine allocates on each GPU: the recipe's
model read once into a `Sizing`, then the rule its backend names (`for_recipe(recipe).memory`, a
trtkv.backends.seam.MemoryRule holding the engine's rule object from trtkv.engines) called with the
flags the served command carries, so the engine allocates what the plan says. Each engine's rule,
knobs, defaults and flags live in its own module under trtkv.engines; `pool_at_version` runs the
rule of a named release for the published-log tests (the backend's MemoryRule.at_release).
"""

from __future__ import annotations

from functools import partial

from trtkv.backends import BACKENDS, for_recipe
from trtkv.backends.seam import MemoryRule
from trtkv.engines import kv_tp
from trtkv.engines.activation import ModelShape, Setup
from trtkv.engines.pool import PoolEstimate, Sizing
from trtkv.plan.model import (
    DTYPE_BYTES,
    Architecture,
    recipe_formats,
    recipe_seq_bytes,
    seq_bytes,
    weights_bytes,
)
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import Backend, Recipe
from trtkv.units import GIB


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
    par = recipe.parallelism
    per_token = seq_bytes(arch, recipe_formats(arch, recipe), 1, kv_tp(par), b.pp_size)
    return Setup(
        gpu_total_bytes=gpu_total_bytes(recipe),
        tp=b.tp_size,
        pp=b.pp_size,
        ep=par.ep,
        attention_dp=par.attention_dp,
        weights_bytes=weights_bytes(arch, recipe)[1],
        kv_bytes_per_token=per_token,
        max_num_tokens=mem.step_tokens(recipe),
        max_num_seqs=par.per_group(b.max_batch_size),
        nvswitch=nvswitch(recipe.hardware.gpu),
        tokens_per_block=mem.block_tokens(recipe),
        blackwell_datacenter=recipe.hardware.gpu is GPU.B200,
    )


def recipe_pool(recipe: Recipe, arch: Architecture) -> PoolEstimate:
    """The KV pool the recipe's engine allocates on each GPU, by that engine's rule at trtkv's
    pinned version, with the flags its served command carries (the backend's MemoryRule: the same
    call serve, deploy and repo make)."""
    mem = memory_rule(recipe)
    sizing = Sizing(
        model_shape(arch, DTYPE_BYTES[recipe.model.dtype]),
        recipe_setup(recipe, arch),
        partial(recipe_seq_bytes, arch, recipe),
    )
    return mem.pool_for(recipe)(recipe, sizing, mem.knobs(recipe))


# The backends whose engine rule is kept at named releases (their MemoryRule.at_release)
ENGINES = tuple(b for b, be in BACKENDS.items() if be.memory and be.memory.at_release)


def pool_at_version(
    backend: Backend,
    version: str,
    shape: ModelShape,
    setup: Setup,
    knob_value: float,
    *,
    cap_tokens: int | None = None,
) -> PoolEstimate:
    """One engine's pool by the rule of a named release (the published-log tests plan each log with
    its own version's rule; recipe_pool uses trtkv's pinned releases)."""
    memory = BACKENDS[backend].memory
    if memory is None or memory.at_release is None:
        raise ValueError(f"backend {backend.value}: one of {', '.join(b.value for b in ENGINES)}")
    return memory.at_release(shape, setup, version, knob_value, cap_tokens)
