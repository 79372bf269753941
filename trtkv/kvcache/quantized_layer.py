"""QuantizedKVLayer: one layer's quantized K/V store (codes + float16 scales/zero points, KIVI's
float16 window), the layer trtkv.kvcache.cache's QuantizedKVCache keeps per model layer.

Sliding-window layers (`sliding_window=`) keep only their window, as vLLM and TensorRT-LLM do: after
each update a layer holds the last `window - 1` tokens (rounded up to whole KIVI key groups) and
returns the last `window - 1` + new ones, which is what transformers' DynamicSlidingWindowLayer
returns and sizes its sliding mask for; a decode step then attends to exactly `window` tokens.
"""

from __future__ import annotations

import math

import torch
from transformers.cache_utils import DynamicLayer

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.codecs import LayerCodecs
from trtkv.kvcache.rows import Encoded, RowStore, encode_rows

RESIDUAL_DTYPE = torch.float16  # KIVI's full-precision window is stored like the fp16 baseline


class QuantizedKVLayer(DynamicLayer):
    """One layer's quantized K/V store (+ KIVI's full-precision window in self.keys/self.values);
    with `sliding_window` it keeps only that window (see the module docstring)."""

    def __init__(
        self,
        codecs: LayerCodecs,
        record_positions: bool = False,
        track_clipping: bool = True,
        sliding_window: int | None = None,
        keep_decoded: bool = False,
    ):
        super().__init__()
        if sliding_window is not None and sliding_window < 1:
            raise TrtkvError(
                f"sliding_window {sliding_window}: must be >= 1 (or None for full attention)."
            )
        self.codecs = codecs
        self.record_positions = record_positions
        self.track_clipping = track_clipping or record_positions
        self.sliding_window = sliding_window
        # read by transformers' masks (Cache.is_sliding)
        self.is_sliding = sliding_window is not None
        self.k_store, self.v_store = RowStore(), RowStore()
        # keep_decoded: the store's dequantized rows kept beside it, each token decoded once when it
        # is stored (see _dequantized); only for codecs whose decode of a chunk is the same rows as
        # the decode of the whole store
        self.keep_decoded = keep_decoded and codecs.key.row_separable and codecs.value.row_separable
        self.k_decoded, self.v_decoded = RowStore(), RowStore()
        self.decoded_dtype: torch.dtype | None = None
        self.quantized_tokens = 0  # tokens ever quantized into the store
        self.stored_tokens = 0  # tokens the store holds now (fewer on a sliding layer)
        self.cumulative_length = 0
        self.clip = {"key": 0, "value": 0}  # elements beyond the static range
        self.elements = {"key": 0, "value": 0}
        self.observed_amax = {"key": 0.0, "value": 0.0}
        # per stored token: clipped K+V elements (record_positions)
        self.clip_positions: list[torch.Tensor] = []

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch_size, self.num_heads, _, self.head_dim = key_states.shape
        self.keys = torch.zeros(
            (*key_states.shape[:2], 0, key_states.shape[-1]),
            dtype=RESIDUAL_DTYPE,
            device=self.device,
        )
        self.values = torch.zeros_like(self.keys)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens, return the dequantized K/V of all tokens (the attention's view)."""
        return self.update_encoded(key_states, value_states, None)

    def update_encoded(
        self, key_states: torch.Tensor, value_states: torch.Tensor, pre: Encoded | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """update(), with the new tokens' codes (and decode, clip counts) already computed in `pre`
        (update_rows: one encode call for the rows of many sequences), or None to compute them
        here."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        past = self.cumulative_length
        keys, values = self._update(key_states, value_states, pre)
        if self.sliding_window is None:
            return keys, values
        # what get_mask_sizes announced
        attended = min(past, self.sliding_window - 1) + key_states.shape[-2]
        self._slide()
        return keys[..., -attended:, :], values[..., -attended:, :]

    def _update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, pre: Encoded | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.cumulative_length += key_states.shape[-2]
        window = self.codecs.residual
        if not window:
            self._store(key_states, value_states, pre=pre)
            return self._dequantized(key_states.dtype)
        res_k, res_v = self._window()
        res_k = torch.cat([res_k, key_states.to(RESIDUAL_DTYPE)], dim=-2)
        res_v = torch.cat([res_v, value_states.to(RESIDUAL_DTYPE)], dim=-2)
        old_k, old_v = self._dequantized(key_states.dtype)
        keys = torch.cat([old_k, res_k.to(key_states.dtype)], dim=-2)
        values = torch.cat([old_v, res_v.to(key_states.dtype)], dim=-2)
        flush = (res_k.shape[-2] // window) * window
        if flush:
            self._store(res_k[..., :flush, :], res_v[..., :flush, :], key_states.dtype)
            res_k, res_v = res_k[..., flush:, :].contiguous(), res_v[..., flush:, :].contiguous()
        self.keys, self.values = res_k, res_v
        return keys, values

    def _slide(self) -> None:
        """Drop the stored tokens a sliding layer no longer needs: keep the last window - 1 (whole
        key groups)."""
        if self.sliding_window is None:
            return
        residual = self._window()[0].shape[-2] if self.codecs.residual else 0
        excess = self.stored_tokens + residual - (self.sliding_window - 1)
        group = math.lcm(self.codecs.key.token_group, self.codecs.value.token_group)
        drop = min(excess, self.stored_tokens) // group * group
        if drop > 0:
            for store in (self.k_store, self.v_store, self.k_decoded, self.v_decoded):
                store.drop_front(drop, self.stored_tokens)
            self.stored_tokens -= drop

    def _window(self) -> tuple[torch.Tensor, torch.Tensor]:
        """KIVI's full-precision window (kept in self.keys/self.values, as DynamicLayer keeps its
        tensors)."""
        if self.keys is None or self.values is None:
            raise TrtkvError("QuantizedKVLayer used before initialization.")
        return self.keys, self.values

    def _store(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        dtype: torch.dtype | None = None,
        pre: Encoded | None = None,
    ) -> None:
        """Quantize k/v into the store (with keep_decoded, also their decode in `dtype`, the
        attention's; default k's); `pre`: those codes, decodes and clip counts computed already
        (update_rows)."""
        dtype = dtype or k.dtype
        if pre is None:
            pre = (encode_rows(self, k, v, dtype, split=False) or [])[0]
        if pre.clip is not None:
            self._count(k, v, pre.clip, pre.amax)
            if self.record_positions:
                self._positions(k, v)
        self.k_store.append(pre.k_parts)
        self.v_store.append(pre.v_parts)
        if pre.k_decoded is not None and pre.v_decoded is not None:
            self.decoded_dtype = dtype
            self.k_decoded.append({"x": pre.k_decoded})
            self.v_decoded.append({"x": pre.v_decoded})
        # another dtype than the first store's: decode the whole store from now on
        elif self.keep_decoded:
            self.keep_decoded = False
            self.k_decoded, self.v_decoded = RowStore(), RowStore()
        self.quantized_tokens += k.shape[-2]
        self.stored_tokens += k.shape[-2]

    def tracks(self) -> bool:
        """Whether stores count clipped elements (a static codec and track_clipping)."""
        return self.track_clipping and (self.codecs.key.static or self.codecs.value.static)

    def _count(
        self, k: torch.Tensor, v: torch.Tensor, clip: tuple[int, int], amax: tuple[float, float]
    ) -> None:
        for role, x, clipped, top in (("key", k, clip[0], amax[0]), ("value", v, clip[1], amax[1])):
            self.clip[role] += clipped
            self.elements[role] += x.numel()
            self.observed_amax[role] = max(self.observed_amax[role], top) if x.numel() else 0.0

    def _positions(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """record_positions: clipped K+V elements per stored token."""
        per_token = self.codecs.key.beyond(k).sum(dim=(0, 1, 3)) + self.codecs.value.beyond(v).sum(
            dim=(0, 1, 3)
        )
        self.clip_positions.append(per_token)

    def _dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The store's K/V in `dtype`. With keep_decoded, the rows decoded when each token was
        stored (the same numbers: a token's decode depends on its own codes and the layer's scales
        only, `Codec.row_separable`), so a decode step costs O(1) decode work instead of
        O(context)."""
        if not self.k_store.rows:
            empty = torch.zeros(
                (self.batch_size, self.num_heads, 0, self.head_dim), dtype=dtype, device=self.device
            )
            return empty, empty
        if self.keep_decoded and self.decoded_dtype == dtype:
            return self.k_decoded.view()["x"], self.v_decoded.view()["x"]
        return self.codecs.key.decode(self.k_store.view(), dtype), self.codecs.value.decode(
            self.v_store.view(), dtype
        )

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.sliding_window if self.sliding_window is not None else -1

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the keys the next update returns, as transformers' DynamicLayer
        and DynamicSlidingWindowLayer report them (transformers sizes the attention mask with
        these)."""
        if self.sliding_window is None:
            return self.cumulative_length + query_length, 0
        past = self.cumulative_length
        return min(past, self.sliding_window - 1) + query_length, max(
            past - self.sliding_window + 1, 0
        )

    def stored_bytes(self) -> int:
        return self.quantized_bytes() + self.residual_bytes() + self.static_scale_bytes()

    def quantized_bytes(self) -> int:
        return self.k_store.used_bytes() + self.v_store.used_bytes()

    def residual_bytes(self) -> int:
        if not self.is_initialized:
            return 0
        res_k, res_v = self._window()
        return res_k.numel() * res_k.element_size() + res_v.numel() * res_v.element_size()

    def static_scale_bytes(self) -> int:
        """Per-layer constants: one float32 scale per static codec, plus fp8_affine's bias (kv_heads
        x head_dim)."""
        return self.codecs.key.static_bytes() + self.codecs.value.static_bytes()

    def allocated_bytes(self) -> int:
        return (
            self.k_store.allocated_bytes() + self.v_store.allocated_bytes() + self.residual_bytes()
        )

    def _map_batch(self, fn) -> None:  # noqa: ANN001
        for store in (self.k_store, self.v_store, self.k_decoded, self.v_decoded):
            store.map(fn)
        if self.is_initialized:
            res_k, res_v = self._window()
            self.keys, self.values = fn(res_k), fn(res_v)
            self.batch_size = self.keys.shape[0]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices, ...])

    def crop(self, max_length: int) -> None:
        """Drop tokens beyond max_length (negative: remove that many); per-token formats only."""
        if max_length < 0:
            max_length = self.cumulative_length - abs(max_length)
        if self.cumulative_length <= max_length:
            return
        if self.sliding_window is not None and self.cumulative_length >= self.sliding_window:
            raise TrtkvError(
                f"crop() after {self.cumulative_length} tokens on a sliding layer (window "
                f"{self.sliding_window}): the tokens before the window are gone."
            )
        if self.codecs.residual or self.codecs.key.token_group != 1:
            raise TrtkvError(
                "crop() is not supported for KIVI formats (their keys are quantized in token "
                "groups)."
            )
        for store in (self.k_store, self.v_store, self.k_decoded, self.v_decoded):
            store.truncate(max_length)
        self.quantized_tokens = self.stored_tokens = self.cumulative_length = max_length

    @property
    def rows_portable(self) -> bool:
        """Whether a span of stored tokens can be copied out and into another cache bit for bit
        (export_rows / import_rows: a prefix cache's blocks): one code row per token for K and V,
        no KIVI window, no sliding window."""
        c = self.codecs
        return (
            not c.residual
            and c.key.token_group == 1
            and c.value.token_group == 1
            and c.key.row_separable
            and c.value.row_separable
            and self.sliding_window is None
        )

    def export_rows(self, start: int, end: int) -> tuple[dict[str, torch.Tensor], ...]:
        """Copies of the stored codes (K parts, V parts) of tokens [start, end): what a prefix
        cache's block keeps (rows_portable layers only)."""
        if not self.rows_portable or end > self.stored_tokens or start < 0:
            raise TrtkvError(
                f"export_rows({start}, {end}): the layer holds {self.stored_tokens} tokens"
                + ("" if self.rows_portable else " in a format whose rows cannot be copied")
            )
        return tuple(
            {k: t[..., start:end, :].clone() for k, t in store.view().items()}
            for store in (self.k_store, self.v_store)
        )

    def import_rows(
        self, k_parts: dict[str, torch.Tensor], v_parts: dict[str, torch.Tensor], like: torch.Tensor
    ) -> None:
        """Append stored codes exported by export_rows (the next tokens of this layer), as if
        update() had stored them; `like`: an empty (1, kv_heads, 0, head_dim) tensor of the
        attention's dtype. Each token's decode depends on its own codes only (row_separable), so
        the kept decode is the one update() would have kept."""
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        n = next(iter(k_parts.values())).shape[-2]
        self.k_store.append(k_parts)
        self.v_store.append(v_parts)
        if self.keep_decoded:
            self.decoded_dtype = like.dtype
            self.k_decoded.append({"x": self.codecs.key.decode(k_parts, like.dtype)})
            self.v_decoded.append({"x": self.codecs.value.decode(v_parts, like.dtype)})
        self.quantized_tokens += n
        self.stored_tokens += n
        self.cumulative_length += n

    def reset(self) -> None:
        self.k_store, self.v_store = RowStore(), RowStore()
        self.k_decoded, self.v_decoded = RowStore(), RowStore()
        self.quantized_tokens = self.stored_tokens = self.cumulative_length = 0
        if self.is_initialized:
            res_k, res_v = self._window()
            self.keys, self.values = res_k[..., :0, :], res_v[..., :0, :]

    def offload(self) -> None:
        raise TrtkvError("QuantizedKVCache does not support offloading.")
