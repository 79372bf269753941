"""The probe's window-aware cache for sliding-window hybrids (Gemma 3): a sliding layer keeps only
its window, as the engines' caches do, so attention over it costs O(n * window); the full-attention
layers keep every token.

WindowedKVCache is QuantizedKVCache (trtkv.kvcache.cache) with each sliding layer replaced by
SlidingQuantizedLayer: the same codecs and numerics, the stored rows trimmed after each update to
the last window - 1 tokens (KIVI: whole 32-token key groups covering them), and transformers' mask
told where the kept rows start (get_mask_sizes), so the sliding mask of a chunk sees exactly the
keys a full cache would let it see. A per-token format stores each token independently, so trimming
changes nothing a query can see: the chunked, trimmed pass equals the naive one
(tests/probe/test_window.py). trtkv.kvcache.cache now trims sliding layers too; WindowedKVCache
builds its base with every layer full (no window given) and trims in SlidingQuantizedLayer only, so
nothing is trimmed twice. LastLayerAt: where only some rows' outputs are scored (the LM head's
sampled positions, a needle's digits), the last layer runs its queries, attention and MLP at those
rows only.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import torch

from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.formats import KVFormat
from trtkv.kvcache.names import FormatChoice
from trtkv.kvcache.quantized_layer import QuantizedKVLayer

SLIDING = "sliding_attention"
# prefill chunk of the windowed passes: sliding attention costs chunk x (window + chunk)
WINDOW_CHUNK = 512


def layer_types(config) -> list[str]:  # noqa: ANN001
    """Per-layer attention kind of a transformers config ("full_attention" where it names none)."""
    text = config.get_text_config(decoder=True)
    return list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)


def sliding_window(config) -> int | None:  # noqa: ANN001
    """The window of the model's sliding layers, None for a model without any."""
    if SLIDING not in layer_types(config):
        return None
    return int(config.get_text_config(decoder=True).sliding_window)


class SlidingQuantizedLayer(QuantizedKVLayer):
    """A sliding-window layer's quantized store: after each update only the last window - 1 tokens
    stay (the ones the next query can still see), as DynamicSlidingWindowLayer does for 16-bit
    K/V."""

    is_sliding = True

    def __init__(
        self,
        codecs,
        window: int,
        record_positions: bool = False,
        track_clipping: bool = True,  # noqa: ANN001
        trim: bool = True,
    ):
        super().__init__(codecs, record_positions, track_clipping)
        self.sliding_window = window
        # QuantizedKVLayer set False (no window given to it); transformers' masks read this
        self.is_sliding = True
        # False: keep every token (the naive path the tests compare with; the mask still slides)
        self.trim = trim
        self.rate = 0.0  # quantized bytes per stored token, measured before each trim

    def kept_tokens(self) -> int:
        """Tokens this layer returns ahead of the new ones: trimmed quantized store + KIVI's fp16
        window."""
        residual = self.keys.shape[-2] if self.is_initialized and self.keys is not None else 0
        return self.stored_tokens + residual

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # the plain store-and-return of QuantizedKVLayer (not its own sliding trim: this layer trims
        # in _trim and tells the mask where its kept rows start)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self._update(key_states, value_states)
        if self.trim:
            self._trim()
        return keys, values

    def _trim(self) -> None:
        if self.sliding_window is None:  # a full-attention layer keeps everything
            return
        keep = self.sliding_window - 1
        residual = self.keys.shape[-2] if self.keys is not None else 0
        need = max(0, keep - residual)  # quantized tokens still visible to the next query
        group = max(self.codecs.key.token_group, self.codecs.value.token_group, 1)
        # whole token groups only (KIVI's key groups)
        drop = ((self.stored_tokens - need) // group) * group
        if self.stored_tokens:
            self.rate = self.quantized_bytes() / self.stored_tokens
        if drop > 0:
            self.k_store.drop_front(drop, self.stored_tokens)
            self.v_store.drop_front(drop, self.stored_tokens)
            self.stored_tokens -= drop

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Keys returned by the next update: the kept tokens (starting at absolute position
        cumulative - kept), then the new ones; transformers' sliding mask hides kept tokens older
        than the window."""
        kept = self.kept_tokens()
        return kept + query_length, self.cumulative_length - kept


class WindowedKVCache(QuantizedKVCache):
    """QuantizedKVCache for a model with sliding-window layers: those keep their window only
    (SlidingQuantizedLayer), the full-attention layers everything; same arguments as
    QuantizedKVCache."""

    def __init__(
        self,
        config: Any,
        fmt: KVFormat | str | FormatChoice,
        *args: Any,
        trim: bool = True,
        **kw: Any,
    ) -> None:
        """QuantizedKVCache's arguments; `trim` False keeps every token (the naive path the tests
        compare with)."""
        kinds = layer_types(config)
        window = int(config.get_text_config(decoder=True).sliding_window or 0)
        full_view = SimpleNamespace(
            get_text_config=lambda decoder=True: SimpleNamespace(
                # QuantizedKVCache's own check: all layers full
                layer_types=None,
                num_hidden_layers=len(kinds),
            )
        )
        super().__init__(full_view, fmt, *args, **kw)
        self.layer_kinds = kinds
        for i, kind in enumerate(kinds):
            if kind == SLIDING:
                old = self.qlayers[i]
                self.qlayers[i] = SlidingQuantizedLayer(
                    old.codecs, window, old.record_positions, old.track_clipping, trim
                )
                self.layers[i] = self.qlayers[i]

    def bytes_per_token(self) -> float:
        """Stored bytes per token summed over layers, each layer's rate over the tokens it holds (a
        sliding layer holds its window): the planner's per-token formula, KIVI's fp16 window left
        out."""
        rates = [isinstance(layer, SlidingQuantizedLayer) and layer.rate for layer in self.qlayers]
        return sum(
            rate or (layer.quantized_bytes() / layer.stored_tokens if layer.stored_tokens else 0.0)
            for layer, rate in zip(self.qlayers, rates, strict=True)
        )


class LastLayerAt(torch.nn.Module):
    """The model's last decoder layer with its output computed only at `rows` of each chunk (K/V
    still for every token, which later queries attend to): the model's output then has those rows
    only. Gemma 3's last layer is a full-attention one, a third of the full-attention work; exact
    (tests/probe/test_window.py)."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer
        self.rows = torch.zeros(0, dtype=torch.long)

    @staticmethod
    def supports(layer: torch.nn.Module) -> bool:
        """A Gemma-3-shaped decoder layer (four norms, q/k norms) on SDPA: the only kind this
        rewrite reproduces."""
        attn = getattr(layer, "self_attn", None)
        names = (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
            "mlp",
        )
        from trtkv.kvcache.attention_hook import ENGINE_IMPL

        return (
            attn is not None
            and all(hasattr(layer, n) for n in names)
            and hasattr(attn, "q_norm")
            and getattr(attn.config, "_attn_implementation", None) in ("sdpa", ENGINE_IMPL)
            and getattr(attn.config, "attn_logit_softcapping", None) is None
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,  # noqa: D102
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        past_key_values=None,
        **kwargs,
    ) -> torch.Tensor:  # noqa: ANN001, ANN003
        layer: Any = self.layer
        attn: Any = layer.self_attn
        rows = self.rows.to(hidden_states.device)
        rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        x = layer.input_layernorm(hidden_states)
        kv_shape = (*x.shape[:-1], -1, attn.head_dim)
        key = attn.k_norm(attn.k_proj(x).view(kv_shape).transpose(1, 2))
        value = attn.v_proj(x).view(kv_shape).transpose(1, 2)
        if position_embeddings is None:
            raise ValueError("LastLayerAt needs the model's position_embeddings.")
        cos, sin = position_embeddings
        _, key = rotate(key, key, cos, sin)
        keys, values = past_key_values.update(key, value, attn.layer_idx)
        if rows.numel() == 0:
            return hidden_states[:, :0]
        xq = x[:, rows]
        query = attn.q_norm(attn.q_proj(xq).view(*xq.shape[:-1], -1, attn.head_dim).transpose(1, 2))
        query, _ = rotate(query, query, cos[:, rows], sin[:, rows])
        # transformers skipped it (no past, causal): build the causal rows
        if attention_mask is None:
            k_pos = torch.arange(keys.shape[-2], device=rows.device)
            q_pos = rows + (keys.shape[-2] - x.shape[1])
            allowed = k_pos[None, :] <= q_pos[:, None]
            if attn.sliding_window:
                allowed &= q_pos[:, None] - k_pos[None, :] < attn.sliding_window
            mask = allowed[None, None].expand(x.shape[0], 1, -1, -1)
        else:
            mask = attention_mask[:, :, rows]
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        from trtkv.kvcache.attention_hook import ENGINE_IMPL, engine_attention_forward

        # an engine kernel's numerics at these rows, else SDPA's
        engine = attn.config._attn_implementation == ENGINE_IMPL
        forward = engine_attention_forward if engine else sdpa_attention_forward
        extra = (
            {"trtkv_q_rows": rows, "trtkv_new_tokens": x.shape[1]}
            if engine
            else {"sliding_window": attn.sliding_window}
        )
        out, _ = forward(attn, query, keys, values, mask, scaling=attn.scaling, **extra)
        h = attn.o_proj(out.reshape(*xq.shape[:-1], -1).contiguous())
        h = hidden_states[:, rows] + layer.post_attention_layernorm(h)
        return h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
