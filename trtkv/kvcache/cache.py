"""A transformers Cache that stores K/V quantized (codes + float16 scales/zero points) and dequantizes for attention.

Works as `past_key_values=` in `model(...)` and `model.generate(...)` of transformers 5.x:

    cache = QuantizedKVCache(config=model.config, fmt="int8", k_scales=ks, v_scales=vs)
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=32)
    cache.stored_bytes()

Attention semantics (the same in prefill and decode): the new tokens' K/V are quantized and stored first, then every
query attends to the dequantized cache, its own position included, as a decode step reading back what it just wrote
(vLLM's paged attention does this). For per-token formats a token's stored value depends on that token only, so a
single prefill pass gives exactly what token-by-token decoding would. KIVI keeps the most recent tokens in a float16
window: each update attends to quantized history + that window, then flushes whole windows (128 tokens) into the
quantized store, as KIVI's reference code does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.formats import KVFormat, boundary_layers
from trtkv.kvcache.quant import AffineScale, FormatChoice, KVScale, LayerCodecs, layer_codecs, parse_format

BLOCK_ROWS = 256  # storage grows by this many rows (tokens) at a time: little slack, amortized copies
RESIDUAL_DTYPE = torch.float16  # KIVI's full-precision window is stored like the fp16 baseline


class RowStore:
    """Named tensors growing along dim -2 in blocks; each part counts its own used rows (KIVI's K scales have one
    row per 32 tokens)."""

    def __init__(self, block: int = BLOCK_ROWS):
        self.block = block
        self.used: dict[str, int] = {}
        self.buffers: dict[str, torch.Tensor] = {}

    def append(self, parts: dict[str, torch.Tensor]) -> None:
        most = max(v.shape[-2] for v in parts.values())
        for name, value in parts.items():
            n = value.shape[-2]
            rows = self.used.get(name, 0)
            buf = self.buffers.get(name)
            if buf is None or rows + n > buf.shape[-2]:
                block = max(1, -(-self.block * n // most)) if most else self.block  # parts with fewer rows per token
                new = self._alloc(value, -(-(rows + n) // block) * block)
                if buf is not None:
                    new[..., :rows, :] = buf[..., :rows, :]
                self.buffers[name] = buf = new
            buf[..., rows: rows + n, :] = value
            self.used[name] = rows + n

    @staticmethod
    def _alloc(like: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.empty((*like.shape[:-2], rows, like.shape[-1]), dtype=like.dtype, device=like.device)

    @property
    def rows(self) -> int:
        return max(self.used.values(), default=0)

    def view(self) -> dict[str, torch.Tensor]:
        return {k: v[..., : self.used[k], :] for k, v in self.buffers.items()}

    def used_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.view().values())

    def allocated_bytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.buffers.values())

    def map(self, fn) -> None:  # noqa: ANN001 - fn: Tensor -> Tensor over the batch dim
        self.buffers = {k: fn(v) for k, v in self.buffers.items()}

    def truncate(self, rows: int) -> None:
        """Keep the first `rows` rows of every part (per-token formats only)."""
        self.used = {k: min(v, rows) for k, v in self.used.items()}


class QuantizedKVLayer(DynamicLayer):
    """One layer's quantized K/V store (+ KIVI's full-precision window in self.keys/self.values)."""

    def __init__(self, codecs: LayerCodecs, record_positions: bool = False, track_clipping: bool = True):
        super().__init__()
        self.codecs = codecs
        self.record_positions = record_positions
        self.track_clipping = track_clipping or record_positions
        self.k_store, self.v_store = RowStore(), RowStore()
        self.quantized_tokens = 0
        self.cumulative_length = 0
        self.clip = {"key": 0, "value": 0}  # elements beyond the static range
        self.elements = {"key": 0, "value": 0}
        self.observed_amax = {"key": 0.0, "value": 0.0}
        self.clip_positions: list[torch.Tensor] = []  # per stored token: clipped K+V elements (record_positions)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch_size, self.num_heads, _, self.head_dim = key_states.shape
        self.keys = torch.zeros((*key_states.shape[:2], 0, key_states.shape[-1]), dtype=RESIDUAL_DTYPE,
                                device=self.device)
        self.values = torch.zeros_like(self.keys)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens, return the dequantized K/V of all tokens (the attention's view)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        window = self.codecs.residual
        if not window:
            self._store(key_states, value_states)
            return self._dequantized(key_states.dtype)
        res_k, res_v = self._window()
        res_k = torch.cat([res_k, key_states.to(RESIDUAL_DTYPE)], dim=-2)
        res_v = torch.cat([res_v, value_states.to(RESIDUAL_DTYPE)], dim=-2)
        old_k, old_v = self._dequantized(key_states.dtype)
        keys = torch.cat([old_k, res_k.to(key_states.dtype)], dim=-2)
        values = torch.cat([old_v, res_v.to(key_states.dtype)], dim=-2)
        flush = (res_k.shape[-2] // window) * window
        if flush:
            self._store(res_k[..., :flush, :], res_v[..., :flush, :])
            res_k, res_v = res_k[..., flush:, :].contiguous(), res_v[..., flush:, :].contiguous()
        self.keys, self.values = res_k, res_v
        return keys, values

    def _window(self) -> tuple[torch.Tensor, torch.Tensor]:
        """KIVI's full-precision window (kept in self.keys/self.values, as DynamicLayer keeps its tensors)."""
        if self.keys is None or self.values is None:
            raise TrtkvError("QuantizedKVLayer used before initialization.")
        return self.keys, self.values

    def _store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.track_clipping and (self.codecs.key.static or self.codecs.value.static):
            self._track(k, v)
        self.k_store.append(self.codecs.key.encode(k))
        self.v_store.append(self.codecs.value.encode(v))
        self.quantized_tokens += k.shape[-2]

    def _track(self, k: torch.Tensor, v: torch.Tensor) -> None:
        per_token = None
        for role, x, codec in (("key", k, self.codecs.key), ("value", v, self.codecs.value)):
            beyond = codec.beyond(x)
            self.clip[role] += int(beyond.sum())
            self.elements[role] += x.numel()
            self.observed_amax[role] = max(self.observed_amax[role], float(x.abs().amax())) if x.numel() else 0.0
            if self.record_positions:
                counts = beyond.sum(dim=(0, 1, 3))
                per_token = counts if per_token is None else per_token + counts
        if per_token is not None:
            self.clip_positions.append(per_token)

    def _dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.k_store.rows:
            empty = torch.zeros((self.batch_size, self.num_heads, 0, self.head_dim), dtype=dtype, device=self.device)
            return empty, empty
        return self.codecs.key.decode(self.k_store.view(), dtype), self.codecs.value.decode(self.v_store.view(), dtype)

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

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
        """Per-layer constants: one float32 scale per static codec, plus fp8_affine's bias (kv_heads x head_dim)."""
        return self.codecs.key.static_bytes() + self.codecs.value.static_bytes()

    def allocated_bytes(self) -> int:
        return self.k_store.allocated_bytes() + self.v_store.allocated_bytes() + self.residual_bytes()

    def _map_batch(self, fn) -> None:  # noqa: ANN001
        self.k_store.map(fn)
        self.v_store.map(fn)
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
        if self.codecs.residual or self.codecs.key.token_group != 1:
            raise TrtkvError("crop() is not supported for KIVI formats (their keys are quantized in token groups).")
        self.k_store.truncate(max_length)
        self.v_store.truncate(max_length)
        self.quantized_tokens = self.cumulative_length = max_length

    def reset(self) -> None:
        self.k_store, self.v_store = RowStore(), RowStore()
        self.quantized_tokens = self.cumulative_length = 0
        if self.is_initialized:
            res_k, res_v = self._window()
            self.keys, self.values = res_k[..., :0, :], res_v[..., :0, :]

    def offload(self) -> None:
        raise TrtkvError("QuantizedKVCache does not support offloading.")


class QuantizedKVCache(Cache):
    """KV cache storing every layer in `fmt` (the probe's and the reference runtime's):
    QuantizedKVCache(config, fmt, k_scales, v_scales)."""

    def __init__(self, config, fmt: KVFormat | str | FormatChoice, k_scales: Sequence[KVScale] | None = None,  # noqa: ANN001
                 v_scales: Sequence[KVScale] | None = None, *, record_positions: bool = False,
                 track_clipping: bool = True, keep_layers: Sequence[int] = (), keep_format: KVFormat | str = "bf16"):
        """`keep_layers`: layers stored in `keep_format` (the model dtype) instead of `fmt`, as vLLM's
        --kv-cache-dtype-skip-layers keeps them (per-layer KV precision); the packed formats (turboquant_*,
        ultraquant_4bit) add vLLM's boundary layers, which vLLM keeps whatever the flags say."""
        self.format = parse_format(fmt)
        text = config.get_text_config(decoder=True)
        layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
        if set(layer_types) - {"full_attention"}:
            raise TrtkvError(f"QuantizedKVCache supports full-attention layers only; this model has "
                             f"{sorted(set(layer_types))}.")
        n = text.num_hidden_layers
        ks, vs = self._scales(self.format, n, k_scales, v_scales)
        self.k_scales, self.v_scales = ks, vs
        keep = set(keep_layers)
        if keep - set(range(n)):
            raise TrtkvError(f"keep_layers {sorted(keep - set(range(n)))} do not exist (the model has {n} layers).")
        keep |= set(boundary_layers(self.format.base, n))  # vLLM always keeps these for turboquant_*/ultraquant_4bit
        self.keep_layers = sorted(keep)
        self.qlayers = [QuantizedKVLayer(layer_codecs(keep_format) if i in keep else
                                         layer_codecs(self.format, ks[i], vs[i]), record_positions, track_clipping)
                        for i in range(n)]
        super().__init__(layers=list(self.qlayers))

    @staticmethod
    def _scales(choice: FormatChoice, n: int, k_scales: Sequence[KVScale] | None, v_scales: Sequence[KVScale] | None
                ) -> tuple[list[KVScale | None], list[KVScale | None]]:
        if not choice.needs_scales:
            return [None] * n, [None] * n
        if k_scales is None or v_scales is None:
            raise TrtkvError(f"KV format {choice.name} needs static per-layer k_scales and v_scales. Next: pass the "
                             f"calibrate stage's kv_scales.json (trtkv.kvcache.scales.load_kv_scales) or calibrate "
                             f"them with trtkv.kvcache.scales.calibrate_scales(model, tokenizer).")
        if len(k_scales) != n or len(v_scales) != n:
            raise TrtkvError(f"KV format {choice.name}: got {len(k_scales)} k_scales and {len(v_scales)} v_scales "
                             f"for a model with {n} layers. Next: pass one scale per layer.")
        if choice.affine:  # fp8_affine: each layer's amax and bias as they are
            if not all(isinstance(s, AffineScale) for s in (*k_scales, *v_scales)):
                raise TrtkvError(f"KV format {choice.name} needs an AffineScale (amax and bias) per layer for K and V. "
                                 f"Next: pass KVScales.for_format('{choice.name}') from a calibration pass "
                                 f"(trtkv.kvcache.scales.calibrate_scales).")
            return list(k_scales), list(v_scales)
        return [float(s) for s in k_scales], [float(s) for s in v_scales]

    def stored_bytes(self) -> int:
        """Bytes this cache holds: codes, scales/zero points, KIVI's window and the static scales."""
        return sum(layer.stored_bytes() for layer in self.qlayers)

    def quantized_bytes(self) -> int:
        return sum(layer.quantized_bytes() for layer in self.qlayers)

    def residual_bytes(self) -> int:
        return sum(layer.residual_bytes() for layer in self.qlayers)

    def allocated_bytes(self) -> int:
        """Bytes allocated (storage grows in blocks of BLOCK_ROWS tokens)."""
        return sum(layer.allocated_bytes() for layer in self.qlayers)

    def quantized_tokens(self) -> int:
        return self.qlayers[0].quantized_tokens if self.qlayers else 0

    def bytes_per_token(self) -> float:
        """Stored bytes per quantized token, KIVI's full-precision window left out (the planner's formula)."""
        tokens = self.quantized_tokens()
        return self.quantized_bytes() / tokens if tokens else 0.0

    def clip_stats(self) -> dict:
        """Clipping of the static formats: totals and per layer."""
        layers = []
        for i, layer in enumerate(self.qlayers):
            layers.append({"layer": i, "k_clip": layer.clip["key"], "v_clip": layer.clip["value"],
                           "elements": layer.elements["key"] + layer.elements["value"],
                           "k_observed_amax": layer.observed_amax["key"],
                           "v_observed_amax": layer.observed_amax["value"],
                           "k_limit": layer.codecs.key.limit, "v_limit": layer.codecs.value.limit})
        clipped = sum(x["k_clip"] + x["v_clip"] for x in layers)
        total = sum(x["elements"] for x in layers)
        return {"clipped": clipped, "elements": total, "clip_rate": clipped / total if total else 0.0, "layers": layers}

    def clip_per_position(self) -> torch.Tensor | None:
        """Clipped K+V elements per stored token summed over layers (record_positions=True)."""
        per_layer = [torch.cat(layer.clip_positions) for layer in self.qlayers if layer.clip_positions]
        return torch.stack(per_layer).sum(0) if per_layer else None
