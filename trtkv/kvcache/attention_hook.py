"""A transformers model computing its attention with an engine kernel's numerics
(trtkv.kvcache.attention) over a trtkv quantized cache, for the length of a `with
engine_attention(model, run):` block.

The function is registered with transformers' AttentionInterface as ENGINE_IMPL (and its mask as a
full boolean mask: sdpa_mask without the causal skip), and the model's config switched to it inside
the block. Each call reads, from the cache it was given, where the layer's keys sit (absolute
positions: the KV tile grid starts at 0) and picks per query row the prefill or the decode kernel
(`EngineRun.decode_from`: rows at or after that position are decoded; 0: every row, the probe's
decode view; None: every row prefilled). A kernel reading `fresh` K/V (a context FMHA over the
prompt's own 16-bit K/V) gets the raw K/V the cache was handed, kept per layer while the block runs.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.attention import kernel_attention
from trtkv.kvcache.attention_modes import AttentionMode, KernelNumerics

ENGINE_IMPL = "trtkv_engine"
_ACTIVE: contextvars.ContextVar[EngineRun | None] = contextvars.ContextVar(
    "trtkv_engine_run", default=None
)


@dataclass
class EngineRun:
    """One pass's engine attention: the mode, the cache it runs over, which rows decode, each
    layer's Q scale."""

    mode: AttentionMode
    cache: Any
    decode_from: int | None = 0
    q_scales: list[float] = field(default_factory=list)
    head_dim: int = 0
    fresh: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    def kernel(self, decode: bool) -> KernelNumerics:
        return self.mode.decode if decode else self.mode.prefill

    def needs_fresh(self) -> bool:
        return self.decode_from != 0 and self.mode.prefill.kv == "fresh"


def q_scales_for(cache: Any, mode: AttentionMode) -> list[float]:
    """Per layer, the scale Q is quantized with: the layer's KV-cache scale for `kv_scale` kernels
    (one scale shared by K and V, TensorRT-LLM's: the larger of the two static scales), else 1.0 (no
    q_scale in a ModelOpt checkpoint)."""
    kinds = {mode.prefill.q_scale, mode.decode.q_scale}
    out = []
    for layer in getattr(cache, "qlayers", getattr(cache, "layers", [])):
        codecs = getattr(layer, "codecs", None)
        scales = (
            [getattr(c, "scale", None) for c in (codecs.key, codecs.value)]
            if codecs is not None
            else []
        )
        known = [float(s) for s in scales if isinstance(s, (int, float))]
        out.append(max(known) if "kv_scale" in kinds and known else 1.0)
    return out


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ENGINE_IMPL, engine_attention_forward)
    AttentionMaskInterface.register(ENGINE_IMPL, partial(sdpa_mask, allow_is_causal_skip=False))


def _configs(model: Any) -> list[Any]:
    config = model.config
    subs = [getattr(config, name, None) for name in ("text_config",)]
    return [config, *(s for s in subs if s is not None and s is not config)]


@contextmanager
def engine_attention(model: Any, run: EngineRun) -> Iterator[EngineRun]:
    """Inside the block the model attends with run.mode's kernels over run.cache; outside, as
    before."""
    _register()
    configs = _configs(model)
    before = [c._attn_implementation for c in configs]
    token = _ACTIVE.set(run)
    update = run.cache.update
    if run.needs_fresh():

        def keep(
            key_states: torch.Tensor,
            value_states: torch.Tensor,
            layer_idx: int,
            *args: Any,
            **kwargs: Any,
        ):
            run.fresh.setdefault(layer_idx, []).append((key_states, value_states))
            return update(key_states, value_states, layer_idx, *args, **kwargs)

        run.cache.update = keep
    try:
        for c in configs:
            c._attn_implementation = ENGINE_IMPL
        yield run
    finally:
        for c, impl in zip(configs, before, strict=True):
            c._attn_implementation = impl
        if run.needs_fresh():
            del run.cache.update  # back to the class's method
        _ACTIVE.reset(token)


def _layer_length(cache: Any, layer_idx: int) -> int:
    layer = cache.layers[layer_idx]
    length = getattr(layer, "cumulative_length", None)
    if length is None:
        raise TrtkvError(
            f"engine attention: cache layer {layer_idx} ({type(layer).__name__}) does not say how "
            "many tokens it has seen. Next: run it over a trtkv QuantizedKVCache."
        )
    return int(length)


def _fresh(
    run: EngineRun, layer_idx: int, first: int, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    parts = run.fresh.get(layer_idx, [])
    keys = torch.cat([k for k, _ in parts], dim=-2)
    values = torch.cat([v for _, v in parts], dim=-2)
    return keys[..., first : first + count, :], values[..., first : first + count, :]


def engine_attention_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: returns ([B, T, Hq, D] in query's dtype,
    None)."""
    run = _ACTIVE.get()
    if run is None:
        raise TrtkvError(
            f"attention implementation {ENGINE_IMPL!r} used outside trtkv's engine_attention block."
        )
    layer_idx = module.layer_idx
    length = _layer_length(run.cache, layer_idx)
    total, t = key.shape[-2], query.shape[-2]
    first = length - total
    rows = kwargs.get("trtkv_q_rows")
    q_pos = (
        torch.arange(length - t, length)
        if rows is None
        else rows.cpu() + length - int(kwargs.get("trtkv_new_tokens", t))
    )
    if attention_mask is None:
        k_pos = torch.arange(first, length)
        allowed = (k_pos[None, :] <= q_pos[:, None])[None, None].to(query.device)
    else:
        allowed = (
            attention_mask.bool() if attention_mask.dtype == torch.bool else attention_mask == 0
        )
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    sliding = getattr(module, "sliding_window", None) is not None
    softcap = kwargs.get("softcap")
    out = torch.empty(
        query.shape, dtype=torch.promote_types(query.dtype, torch.float32), device=query.device
    )
    decode_rows = (
        torch.ones_like(q_pos, dtype=torch.bool)
        if run.decode_from == 0
        else torch.zeros_like(q_pos, dtype=torch.bool)
        if run.decode_from is None
        else q_pos >= run.decode_from
    )
    for decode in (False, True):
        sel = (decode_rows == decode).nonzero().flatten()
        if sel.numel() == 0:
            continue
        kernel = run.kernel(decode)
        k, v = key, value
        if kernel.kv == "fresh":
            k, v = _fresh(run, layer_idx, first, total)
        idx = sel.to(query.device)
        out[:, :, idx] = kernel_attention(
            query[:, :, idx],
            k,
            v,
            allowed[:, :, idx] if allowed.shape[2] > 1 else allowed,
            scaling,
            kernel,
            run.q_scales[layer_idx] if run.q_scales else 1.0,
            first,
            kernel.tile(query.shape[-1], sliding),
            softcap,
        )
    return out.to(query.dtype).transpose(1, 2).contiguous(), None
