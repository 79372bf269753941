"""The llmapi backend's LLM() arguments (TensorRT-LLM's TorchLlmArgs): one dict per recipe, shared
by the Triton model's model.yaml, trtllm-serve's --config YAML (trtkv.backends.llmapi_serve),
Dynamo's engine arguments and `trtkv generate`; with the KV-cache memory fields the plan used and a
sliding-window model's per-layer attention windows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.engines.kv_tiers import llmapi_tier_config
from trtkv.engines.trtllm import LLMAPI_CAP_KEY, LLMAPI_FRACTION_KEY, llmapi_memory_knobs
from trtkv.recipe import Recipe
from trtkv.recipe.layout import HF, checkpoint_dir
from trtkv.recipe.prefix_cache import prefix_cache


def kv_dtype(recipe: Recipe) -> str:
    """kv_cache_config.dtype: the LLM API's value for the recipe's format in its registry row
    (trtkv/data/kv_formats.json: fp8, nvfp4; auto, the model dtype, for none), its rows of
    TensorRT-LLM 1.3 (the engine recipe.engine_formats.TABLE_ENGINE gives the llmapi backend)."""
    return recipe.kv_row.engine_value("tensorrt_llm", "1.3") or "auto"


def _period(values: list[int]) -> list[int]:
    """The shortest prefix that repeats to `values` (TensorRT-LLM repeats max_attention_window over
    the layers)."""
    n = len(values)
    for p in range(1, n + 1):
        if n % p == 0 and values == values[:p] * (n // p):
            return values[:p]
    return values


def model_layers(recipe: Recipe) -> list[Any] | None:
    """The model's per-layer attention: the recipe's model.attention_layers (what `trtkv init` read
    from config.json), else the HF export's config.json layer_types + sliding_window when calibrate
    has written it; None when unknown."""
    import json

    from trtkv.recipe.attention import AttentionKind, LayerAttention, parse_layers

    if recipe.model.attention_layers:
        return list(parse_layers(recipe.model.attention_layers))
    config = hf_checkpoint_dir(recipe) / "config.json"
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    types, window = text.get("layer_types"), text.get("sliding_window")
    if not isinstance(types, list) or not isinstance(window, int) or window <= 0:
        return None
    return [
        LayerAttention(AttentionKind.SLIDING, window)
        if kind == "sliding_attention"
        else LayerAttention(AttentionKind.FULL)
        for kind in types
    ]


def max_attention_window(recipe: Recipe) -> list[int] | None:
    """kv_cache_config.max_attention_window for a sliding-window hybrid (Gemma 3: [512]*5 +
    [max_seq_len]): without it TensorRT-LLM's PyTorch backend sizes every layer's KV cache for
    max_seq_len (its variable-window layout is on only when the list holds more than one value:
    `is_vswa_enabled`, `_torch/pyexecutor/_util.py` @d8ae02ca), while the model still attends within
    each window and trtkv's planner counts each sliding layer's window only. Full layers get
    max_seq_len, windows are capped at it (as TensorRT-LLM normalizes them), and the list is its
    shortest repeating period (TensorRT-LLM repeats it over the layers; upstream's Gemma 3 VSWA
    example writes the same 6 values). None for a model without sliding layers, or whose windows all
    reach max_seq_len."""
    from trtkv.recipe.attention import AttentionKind

    layers = model_layers(recipe)
    if not layers or not any(x.kind is AttentionKind.SLIDING for x in layers):
        return None
    seq = recipe.build.max_seq_len
    windows = [
        min(x.window, seq) if x.kind is AttentionKind.SLIDING and x.window else seq for x in layers
    ]
    return _period(windows) if len(set(windows)) > 1 else None


def llm_args(recipe: Recipe, hf_dir: Path) -> dict[str, Any]:
    """The LLM() keyword arguments for the recipe (model.yaml, the trtllm-serve config and `trtkv
    generate`). Every key is a field of TensorRT-LLM's TorchLlmArgs
    (tests/data/llm_args_fields.json). The KV-cache memory fields are the ones trtkv's plan used
    (llmapi_memory_knobs)."""
    b = recipe.build
    knobs = llmapi_memory_knobs(recipe)
    args: dict[str, Any] = {
        "model": str(hf_dir),
        "backend": "pytorch",
        "tensor_parallel_size": b.tp_size,
        "pipeline_parallel_size": b.pp_size,
        # per attention-DP rank (each schedules its own requests)
        "max_batch_size": recipe.parallelism.per_group(b.max_batch_size),
        "max_num_tokens": b.max_num_tokens,
        "max_seq_len": b.max_seq_len,
        "max_input_len": b.max_input_len,
        # a prompt longer than max_num_tokens needs it
        "enable_chunked_prefill": recipe.chunked_context,
        "kv_cache_config": {
            "dtype": kv_dtype(recipe),
            LLMAPI_FRACTION_KEY: knobs.value,
            # explicit: the engine's default where it may reuse
            "enable_block_reuse": prefix_cache(recipe).enabled,
            **llmapi_tier_config(recipe),  # the host KV tier: host_cache_size, bytes per rank
        },
    }
    # triton.kv_pool_gib_per_gpu: TensorRT-LLM takes the smaller of the two
    if knobs.cap_value is not None:
        args["kv_cache_config"][LLMAPI_CAP_KEY] = knobs.cap_value
    windows = max_attention_window(recipe)
    if windows is not None:
        args["kv_cache_config"]["max_attention_window"] = windows
    # a linear-attention / Mamba layer's recurrent state: what the plan priced
    if b.mamba_ssm_cache_dtype != "auto":
        args["kv_cache_config"]["mamba_ssm_cache_dtype"] = b.mamba_ssm_cache_dtype
    return {**args, **parallel_args(recipe)}


def parallel_args(recipe: Recipe) -> dict[str, Any]:
    """EP and attention DP as LLM() arguments (TorchLlmArgs fields): moe_expert_parallel_size x
    moe_tensor_parallel_size = tensor_parallel_size (tensorrt_llm/mapping.py), enable_attention_dp
    over every TP rank; none when the layout is plain TP x PP."""
    p, out = recipe.parallelism, {}
    if p.ep > 1:
        out["moe_expert_parallel_size"] = p.ep
        out["moe_tensor_parallel_size"] = p.moe_tp
    if p.attention_dp > 1:
        out["enable_attention_dp"] = True
    return out


def model_yaml(recipe: Recipe, hf_dir: Path) -> dict[str, Any]:
    """tensorrt_llm/1/model.yaml: LLM() arguments + triton_config (max_batch_size 0: one prompt per
    request, the LLM batches in flight; decoupled from the recipe)."""
    return {
        **llm_args(recipe, hf_dir),
        "triton_config": {"max_batch_size": 0, "decoupled": recipe.triton.decoupled},
    }


def hf_checkpoint_dir(recipe: Recipe) -> Path:
    return checkpoint_dir(recipe) / HF
