"""The attention numerics a recipe's engine computes over its KV cache (trtkv/data/kv_formats.json
`selection`): the probe measures that mode and the bench's fidelity task scores against it, so
both stages read it here."""

from __future__ import annotations

from trtkv.kvcache.attention_modes import select_mode
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe.schema import Recipe


def gpu_sm(gpu: GPU) -> tuple[int, int] | None:
    """A recipe GPU's compute capability (the GPU table's GPUSpec.sm); None for the CPU."""
    spec = GPU_SPECS.get(gpu)
    return spec.sm if spec is not None else None


def recipe_mode(recipe: Recipe) -> tuple[str, str]:
    """(mode, why) the recipe's engine, KV dtype, GPU and flags select (trtkv/data/kv_formats.json
    `selection`)."""
    flags = {"fp8_context_fmha": recipe.fp8_context_fmha}
    return select_mode(
        recipe.build.backend.value,
        recipe.quantization.kv_cache.value,
        gpu_sm(recipe.hardware.gpu),
        flags,
    )
