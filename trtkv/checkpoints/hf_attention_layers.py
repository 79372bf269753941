"""Each layer's attention from config.json: `layer_types`, sliding windows (a pattern, Gemma 2's
alternation, Qwen2's `max_window_layers`, a Mistral-style per-layer list), chunked local attention
(`attention_chunk_size`, `no_rope_layers`), MLA; with the fields each answer came from
(trtkv.checkpoints.hf_config reads the rest of the model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.checkpoints.hf_config_fields import ModelConfigError, positive_int
from trtkv.checkpoints.model_facts import ModelFacts
from trtkv.recipe.attention import AttentionKind, LayerAttention

LAYER_TYPE_WORDS = {
    "full_attention": AttentionKind.FULL,
    "sliding_attention": AttentionKind.SLIDING,
    "chunked_attention": AttentionKind.CHUNKED,
    "attention": AttentionKind.FULL,
}


def read_attention_layers(
    cfg: dict[str, Any], f: ModelFacts, file: Path
) -> tuple[tuple[LayerAttention, ...], str]:
    """Per-layer attention and the fields it came from."""
    n, p = f.num_layers, f.prefix
    if f.kv_lora_rank:
        return (
            LayerAttention(AttentionKind.MLA),
        ) * n, f"{p}kv_lora_rank + {p}qk_rope_head_dim (MLA)"
    window = cfg.get("sliding_window")
    chunk = positive_int(cfg.get("attention_chunk_size"))
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n:
            raise ModelConfigError(
                [
                    f"{file}: {p}layer_types has {len(types)} entries for {p}num_hidden_layers "
                    f"{n}. Next: fix the config (one entry per layer)."
                ]
            )
        unknown = sorted({str(t) for t in types if t not in LAYER_TYPE_WORDS})
        if unknown:
            raise ModelConfigError(
                [
                    f"{file}: {p}layer_types holds {', '.join(unknown)}: not attention trtkv "
                    f"prices (known: {', '.join(LAYER_TYPE_WORDS)}); state-space and "
                    "linear-attention layers are refused until priced. Next: plan an "
                    "attention-only model."
                ]
            )
        out = []
        for t in types:
            kind = LAYER_TYPE_WORDS[t]
            size = (
                _window(window, file, p)
                if kind is AttentionKind.SLIDING
                else chunk
                if kind is AttentionKind.CHUNKED
                else None
            )
            if kind is not AttentionKind.FULL and not size:
                raise ModelConfigError(
                    [
                        f"{file}: {p}layer_types says {t} but {p}"
                        f"{'sliding_window' if kind is AttentionKind.SLIDING else 'attention_chunk_size'}"  # noqa: E501
                        f" is missing. Next: fix the config."
                    ]
                )
            out.append(LayerAttention(kind, size) if size else LayerAttention(AttentionKind.FULL))
        src = (
            f"{p}layer_types"
            + (f" + {p}sliding_window" if window else "")
            + (f" + {p}attention_chunk_size" if chunk else "")
        )
        return tuple(out), src
    if chunk:
        nope = cfg.get("no_rope_layers")
        if isinstance(nope, list) and len(nope) == n:
            rope = [bool(x) for x in nope]
            src = f"{p}attention_chunk_size + {p}no_rope_layers"
        else:
            interval = positive_int(cfg.get("no_rope_layer_interval")) or 4
            rope = [(i + 1) % interval != 0 for i in range(n)]
            src = (
                f"{p}attention_chunk_size + {p}no_rope_layer_interval {interval} (transformers' "
                "default when no_rope_layers is empty)"
            )
        return tuple(
            LayerAttention(AttentionKind.CHUNKED, chunk)
            if r
            else LayerAttention(AttentionKind.FULL)
            for r in rope
        ), src
    if cfg.get("use_sliding_window") is False:  # Qwen2/Qwen3: the window is set but off
        return (LayerAttention(AttentionKind.FULL),) * n, f"{p}use_sliding_window false"
    if isinstance(window, list):  # Mistral-style per-layer list, repeated over the layers
        if not window:
            raise ModelConfigError(
                [
                    f"{file}: {p}sliding_window: an empty list (a per-layer list needs one entry "
                    "per layer, null for a full layer). Next: fix the config."
                ]
            )
        sizes = [_window(w, file, p) if w else None for w in window]
        mpe = f.max_position_embeddings
        out = [
            LayerAttention(AttentionKind.SLIDING, s)
            if s and (mpe is None or s < mpe)
            else LayerAttention(AttentionKind.FULL)
            for s in (sizes[i % len(sizes)] for i in range(n))
        ]
        return tuple(out), f"{p}sliding_window (a per-layer list, repeated)"
    if window is None:
        return (
            LayerAttention(AttentionKind.FULL),
        ) * n, f"no {p}layer_types, sliding_window or attention_chunk_size: every layer full"
    size = _window(window, file, p)
    pattern = positive_int(cfg.get("sliding_window_pattern"))
    if pattern is None and f.model_type == "gemma2":
        # Gemma 2 alternates in code (even layers sliding); its config.json has no pattern
        pattern = 2
    if pattern:
        src = (
            f"{p}sliding_window + {p}sliding_window_pattern {pattern}"
            if cfg.get("sliding_window_pattern")
            else f"{p}sliding_window + Gemma 2's alternation (layer i sliding when i is even)"
        )
        return tuple(
            LayerAttention(AttentionKind.SLIDING, size)
            if (i + 1) % pattern
            else LayerAttention(AttentionKind.FULL)
            for i in range(n)
        ), src
    first_full = positive_int(cfg.get("max_window_layers")) if "use_sliding_window" in cfg else None
    # Qwen2 with use_sliding_window true: layers from max_window_layers on slide
    if first_full is not None:
        return tuple(
            LayerAttention(AttentionKind.SLIDING, size)
            if i >= first_full
            else LayerAttention(AttentionKind.FULL)
            for i in range(n)
        ), f"{p}use_sliding_window + {p}sliding_window + {p}max_window_layers {first_full}"
    return (
        LayerAttention(AttentionKind.SLIDING, size),
    ) * n, f"{p}sliding_window (every layer, Mistral-7B-v0.1 style)"


def _window(value: Any, file: Path, prefix: str) -> int:
    size = positive_int(value)
    if size is None:
        raise ModelConfigError(
            [
                f"{file}: {prefix}sliding_window: {value!r} is not a positive integer. Next: fix "
                "the config."
            ]
        )
    return size
