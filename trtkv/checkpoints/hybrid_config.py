"""The 2026 hybrids' config.json fields: which layers hold a fixed state instead of a KV cache, that
state's shape, the parameters of those layers, and Gemma 4's per-layer attention geometry. Field
names as transformers 5.14 and vLLM 0.32.0 read them:

- Gated DeltaNet (Qwen3-Next `qwen3_next`, Qwen3.5/3.6 `qwen3_5`, `qwen3_5_moe`): `layer_types`
  (linear_attention / full_attention) or `full_attention_interval`; `linear_num_key_heads`,
  `linear_num_value_heads`, `linear_key_head_dim`, `linear_value_head_dim`, `linear_conv_kernel_dim`
  (vLLM qwen3_next.py, qwen3_5.py get_mamba_state_shape_from_config).
- Mamba-2 (Nemotron-H `nemotron_h`: `hybrid_override_pattern` M/*/-/E or `layers_block_type`;
  `mamba_num_heads`, `mamba_head_dim`, `n_groups`, `ssm_state_size`, `conv_kernel`, intermediate =
  heads x head_dim; Granite 4 `granitemoehybrid`: `layer_types` mamba/attention; `mamba_n_heads`,
  `mamba_d_head`, `mamba_n_groups`, `mamba_d_state`, `mamba_d_conv`, intermediate = `mamba_expand` x
  hidden (vLLM nemotron_h.py, granitemoehybrid.py)).
- Mamba-1 (Jamba `jamba`: attention where i % `attn_layer_period` == `attn_layer_offset`;
  `mamba_d_state`, `mamba_d_conv`, intermediate = `mamba_expand` x hidden (vLLM jamba.py)).
- Gemma 4 (`gemma4`, `gemma4_text`): full layers use `global_head_dim` and, with `attention_k_eq_v`,
  `num_global_key_value_heads`; the last `num_kv_shared_layers` layers read an earlier layer's KV
  and keep none (transformers Gemma4TextConfig per_layer_config, vLLM gemma4.py
  kv_sharing_target_layer_name). With attention_k_eq_v vLLM loads K into both the K and V slots and
  caches both, so K and V are priced as two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trtkv.recipe.attention import AttentionKind, LayerAttention
from trtkv.recipe.state import StateSpec, gated_deltanet, mamba1, mamba2

GDN_TYPES = {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
GEMMA4_TYPES = {"gemma4", "gemma4_text"}
# layer words (transformers 5 renames mamba -> linear_attention, attention -> full_attention;
# Nemotron-H adds mlp/moe)
STATE_WORDS = {"linear_attention", "mamba"}
NO_CACHE_WORDS = {"mlp", "moe"}
NEMOTRON_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


@dataclass
class HybridFacts:
    """What a hybrid config adds to the attention facts: per-layer words, the state, the
    non-attention parameters."""

    # one per layer: full_attention, sliding_attention, linear_attention, mamba, mlp, moe
    words: list[str]
    source: str
    state: StateSpec | None = None
    state_kind: AttentionKind = AttentionKind.MAMBA
    state_params: float = 0.0  # parameters of one state layer's mixer
    # False: a layer is attention, state or MLP alone (Nemotron-H)
    attention_in_every_layer: bool = False
    mlp_matrices: int = 3  # gated MLP (gate, up, down) or 2 (up, down: Nemotron-H's relu2)
    # Nemotron-H's mamba_ssm_cache_dtype (vLLM's default for it)
    config_ssm_dtype: str | None = None
    notes: list[str] = field(default_factory=list)


class HybridConfigError(ValueError):
    """A hybrid config without the fields its state is priced from (the message names them)."""


def _need(cfg: dict[str, Any], names: list[str], prefix: str, what: str) -> list[int]:
    values = {n: cfg.get(n) for n in names}
    missing = [
        f"{prefix}{n}"
        for n, v in values.items()
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0
    ]
    if missing:
        raise HybridConfigError(
            f"{what} needs {', '.join(missing)} (positive integers) to price its per-sequence "
            f"state; the config lacks them"
        )
    return [int(v) for v in values.values()]  # type: ignore[arg-type]


def read_hybrid(
    cfg: dict[str, Any], model_type: str, n: int, hidden: int, prefix: str
) -> HybridFacts | None:
    """The state-layer facts of a Gated DeltaNet or Mamba hybrid; None for any other model."""
    if model_type in GDN_TYPES:
        return _gated_deltanet(cfg, n, hidden, prefix)
    if model_type == "nemotron_h":
        return _nemotron_h(cfg, n, hidden, prefix)
    if model_type == "granitemoehybrid":
        return _granite(cfg, n, hidden, prefix)
    if model_type == "jamba":
        return _jamba(cfg, n, hidden, prefix)
    return None


def _gated_deltanet(cfg: dict[str, Any], n: int, hidden: int, p: str) -> HybridFacts:
    names = ["linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim"]
    names += ["linear_value_head_dim", "linear_conv_kernel_dim"]
    kh, vh, kd, vd, conv = _need(cfg, names, p, "Gated DeltaNet (linear_attention layers)")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        words, src = [str(t) for t in types], f"{p}layer_types"
    else:
        interval = cfg.get("full_attention_interval") or 4
        words = [
            "full_attention" if (i + 1) % int(interval) == 0 else "linear_attention"
            for i in range(n)
        ]
        src = f"{p}full_attention_interval {interval}"
    spec = gated_deltanet(
        kh,
        vh,
        kd,
        vd,
        conv,
        f"{p}linear_num_key_heads {kh}, linear_num_value_heads {vh}, linear_key_head_dim {kd}, "
        f"linear_value_head_dim {vd}, linear_conv_kernel_dim {conv}",
    )
    # in_proj_qkvz (q, k: kh x kd; v, z: vh x vd), in_proj_ba (vh each), out_proj (vh x vd ->
    # hidden), conv
    params = (
        hidden * (2 * kh * kd + 2 * vh * vd + 2 * vh)
        + vh * vd * hidden
        + spec.conv_dim * (spec.conv_len + 1)
    )
    return HybridFacts(
        words, src, spec, AttentionKind.LINEAR, float(params), attention_in_every_layer=True
    )


def _mamba2_params(
    hidden: int, intermediate: int, groups: int, heads: int, d_state: int, spec: StateSpec
) -> float:
    """in_proj (z, x, B, C, dt), conv, out_proj (Mamba-2 mixer)."""
    return float(
        hidden * (2 * intermediate + 2 * groups * d_state + heads)
        + intermediate * hidden
        + spec.conv_dim * (spec.conv_len + 1)
    )


def _nemotron_h(cfg: dict[str, Any], n: int, hidden: int, p: str) -> HybridFacts:
    pattern = cfg.get("hybrid_override_pattern")
    listed = cfg.get("layers_block_type") or cfg.get("layer_types")
    if isinstance(pattern, str) and pattern:
        unknown = sorted(set(pattern) - set(NEMOTRON_PATTERN))
        if unknown:
            raise HybridConfigError(f"{p}hybrid_override_pattern holds {unknown}: not M, *, - or E")
        words, src = [NEMOTRON_PATTERN[c] for c in pattern], f"{p}hybrid_override_pattern"
    elif isinstance(listed, list) and listed:
        words, src = [str(t) for t in listed], f"{p}layers_block_type"
    else:
        raise HybridConfigError(
            f"Nemotron-H needs {p}hybrid_override_pattern or {p}layers_block_type (which layer is "
            f"Mamba, attention, MLP or MoE)"
        )
    names = ["mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel"]
    heads, hd, groups, ds, conv = _need(cfg, names, p, "Nemotron-H (Mamba-2 layers)")
    spec = mamba2(
        heads * hd,
        groups,
        heads,
        hd,
        ds,
        conv,
        f"{p}mamba_num_heads {heads} x mamba_head_dim {hd}, n_groups {groups}, ssm_state_size "
        f"{ds}, conv_kernel {conv}",
    )
    dtype = cfg.get("mamba_ssm_cache_dtype")
    return HybridFacts(
        words,
        src,
        spec,
        AttentionKind.MAMBA,
        _mamba2_params(hidden, heads * hd, groups, heads, ds, spec),
        attention_in_every_layer=False,
        mlp_matrices=2,
        config_ssm_dtype=str(dtype) if isinstance(dtype, str) else None,
    )


def _granite(cfg: dict[str, Any], n: int, hidden: int, p: str) -> HybridFacts:
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if not isinstance(types, list) or not types:
        raise HybridConfigError(
            f"Granite 4 hybrid needs {p}layer_types (mamba / attention per layer)"
        )
    names = ["mamba_n_heads", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand"]
    heads, groups, ds, conv, expand = _need(cfg, names, p, "Granite 4 (Mamba-2 layers)")
    intermediate = expand * hidden
    head = cfg.get("mamba_d_head")
    # "auto"
    hd = int(head) if isinstance(head, int) and head > 0 else intermediate // heads
    spec = mamba2(
        intermediate,
        groups,
        heads,
        hd,
        ds,
        conv,
        f"{p}mamba_expand {expand} x hidden, mamba_n_heads {heads}, mamba_d_head {hd}, "
        f"mamba_n_groups {groups}, mamba_d_state {ds}, mamba_d_conv {conv}",
    )
    return HybridFacts(
        [str(t) for t in types],
        f"{p}layer_types",
        spec,
        AttentionKind.MAMBA,
        _mamba2_params(hidden, intermediate, groups, heads, ds, spec),
        attention_in_every_layer=True,
    )


def _jamba(cfg: dict[str, Any], n: int, hidden: int, p: str) -> HybridFacts:
    names = ["attn_layer_period", "mamba_d_state", "mamba_d_conv", "mamba_expand"]
    period, ds, conv, expand = _need(cfg, names, p, "Jamba (Mamba layers)")
    offset = int(cfg.get("attn_layer_offset") or 0)
    words = ["full_attention" if i % period == offset else "mamba" for i in range(n)]
    intermediate = expand * hidden
    spec = mamba1(
        intermediate,
        ds,
        conv,
        f"{p}mamba_expand {expand} x hidden, mamba_d_state {ds}, mamba_d_conv {conv}",
    )
    rank = cfg.get("mamba_dt_rank")
    # "auto": ceil(hidden / 16)
    dt_rank = int(rank) if isinstance(rank, int) and rank > 0 else -(-hidden // 16)
    # in_proj (x, z), conv, x_proj (dt, B, C), dt_proj, A_log + D, out_proj
    params = (
        hidden * 2 * intermediate
        + intermediate * spec.conv_len
        + intermediate * (dt_rank + 2 * ds)
        + dt_rank * intermediate
        + intermediate * ds
        + intermediate * hidden
    )
    return HybridFacts(
        words,
        f"{p}attn_layer_period {period}, attn_layer_offset {offset}",
        spec,
        AttentionKind.MAMBA,
        float(params),
        attention_in_every_layer=True,
    )


def gemma4_layers(
    cfg: dict[str, Any], layers: list[LayerAttention], heads: int, head_dim: int, p: str
) -> tuple[list[LayerAttention], str]:
    """Gemma 4's full layers at global_head_dim (and num_global_key_value_heads with
    attention_k_eq_v); the last num_kv_shared_layers layers keep no KV of their own."""
    g_dim = cfg.get("global_head_dim") or 512  # Gemma4TextConfig's default
    k_eq_v = bool(cfg.get("attention_k_eq_v"))
    g_heads = int(cfg.get("num_global_key_value_heads") or heads) if k_eq_v else heads
    out = [
        LayerAttention(x.kind, x.window, g_heads, int(g_dim))
        if x.kind is AttentionKind.FULL and (g_dim != head_dim or g_heads != heads)
        else x
        for x in layers
    ]
    shared = int(cfg.get("num_kv_shared_layers") or 0)
    if shared:
        out = out[: len(out) - shared] + [LayerAttention(AttentionKind.NONE)] * min(
            shared, len(out)
        )
    src = (
        f" + {p}global_head_dim {g_dim}"
        + (f" + {p}num_global_key_value_heads {g_heads} ({p}attention_k_eq_v)" if k_eq_v else "")
        + (f" + {p}num_kv_shared_layers {shared}" if shared else "")
    )
    return out, src
