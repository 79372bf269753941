"""A transformers Cache that stores K/V quantized (codes + float16 scales/zero points) and
dequantizes for attention.

Works as `past_key_values=` in `model(...)` and `model.generate(...)` of transformers 5.x:

    cache = QuantizedKVCache(config=model.config, fmt="int8", k_scales=ks, v_scales=vs)
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=32)
    cache.stored_bytes()

Attention semantics (the same in prefill and decode): the new tokens' K/V are quantized and stored
first, then every query attends to the dequantized cache, its own position included, as a decode
step reading back what it just wrote (vLLM's paged attention does this). For per-token formats a
token's stored value depends on that token only, so a single prefill pass gives exactly what
token-by-token decoding would. KIVI keeps the most recent tokens in a float16 window: each update
attends to quantized history + that window, then flushes whole windows (128 tokens) into the
quantized store, as KIVI's reference code does.

Sliding-window layers (a model config's `layer_types` "sliding_attention", or `layer_windows=`) keep
only their window, as vLLM and TensorRT-LLM do (trtkv.kvcache.quantized_layer, which holds each
layer's store). Also here: update_rows, a decode step's new tokens of many sequences' caches encoded
in one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.codecs import layer_codecs
from trtkv.kvcache.formats import KVFormat, boundary_layers
from trtkv.kvcache.names import FormatChoice, parse_format
from trtkv.kvcache.numerics import AffineScale, HeadScale, KVScale
from trtkv.kvcache.quantized_layer import QuantizedKVLayer
from trtkv.kvcache.rows import encode_rows


def _same_codec(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b) or vars(a).keys() != vars(b).keys():
        return False
    for x, y in zip(vars(a).values(), vars(b).values(), strict=True):
        if torch.is_tensor(x) or torch.is_tensor(y):
            if not (
                torch.is_tensor(x)
                and torch.is_tensor(y)
                and x.shape == y.shape
                and torch.equal(x, y)
            ):
                return False
        elif x != y:
            return False
    return True


def update_rows(
    caches: Sequence[Any], layer_idx: int, key_states: torch.Tensor, value_states: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What `caches[b].update(key_states[b:b+1], value_states[b:b+1], layer_idx)` returns, for every
    b, bit for bit: a decode step's new token of B sequences, each with its own cache. Where every
    cache's layer is a QuantizedKVLayer quantizing alike (the same codecs and scales, no KIVI
    window, per-row parts), the rows are encoded (and decoded, and their clipping counted) in one
    call instead of B, which is most of a decode step's cache work for short contexts on the CPU;
    otherwise each cache updates on its own."""
    layers = [getattr(c, "layers", None) for c in caches]
    pick = [ls[layer_idx] for ls in layers if ls is not None and layer_idx < len(ls)]
    quantized = [layer for layer in pick if isinstance(layer, QuantizedKVLayer)]
    if quantized and len(quantized) == len(caches):
        first = quantized[0]
        alike = all(
            not layer.codecs.residual
            and layer.keep_decoded == first.keep_decoded
            and layer.decoded_dtype == first.decoded_dtype
            and layer.tracks() == first.tracks()
            and _same_codec(layer.codecs.key, first.codecs.key)
            and _same_codec(layer.codecs.value, first.codecs.value)
            for layer in quantized
        )
        encoded = encode_rows(first, key_states, value_states, key_states.dtype) if alike else None
        if encoded is not None:
            return [
                layer.update_encoded(key_states[b : b + 1], value_states[b : b + 1], encoded[b])
                for b, layer in enumerate(quantized)
            ]
    return [
        c.update(key_states[b : b + 1], value_states[b : b + 1], layer_idx)
        for b, c in enumerate(caches)
    ]


ATTENTION_TYPES = ("full_attention", "sliding_attention")  # config layer_types the cache stores


def config_layer_windows(config) -> list[int | None]:  # noqa: ANN001 - any transformers config
    """Per layer: the sliding window a "sliding_attention" layer keeps (config.sliding_window), None
    for a "full_attention" one; a TrtkvError for other layer types (chunked, linear attention)."""
    text = config.get_text_config(decoder=True)
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    other = sorted(set(layer_types) - set(ATTENTION_TYPES))
    if other:
        raise TrtkvError(
            f"QuantizedKVCache stores {', '.join(ATTENTION_TYPES)} layers; this model has {other}."
        )
    window = getattr(text, "sliding_window", None)
    if "sliding_attention" in layer_types and not window:
        raise TrtkvError(
            f"config layer_types has sliding_attention layers but sliding_window is {window!r}."
        )
    return [int(window or 0) if kind == "sliding_attention" else None for kind in layer_types]


class QuantizedKVCache(Cache):
    """KV cache storing every layer in `fmt` (the probe's and the reference runtime's):
    QuantizedKVCache(config, fmt, k_scales, v_scales)."""

    def __init__(
        self,
        config,
        fmt: KVFormat | str | FormatChoice,
        k_scales: Sequence[KVScale] | None = None,  # noqa: ANN001
        v_scales: Sequence[KVScale] | None = None,
        *,
        record_positions: bool = False,
        track_clipping: bool = True,
        keep_layers: Sequence[int] = (),
        keep_format: KVFormat | str = "bf16",
        layer_windows: Sequence[int | None] | None = None,
        keep_decoded: bool = False,
    ):
        """`keep_layers`: layers stored in `keep_format` (the model dtype) instead of `fmt`, as
        vLLM's --kv-cache-dtype-skip-layers keeps them (per-layer KV precision); the packed formats
        (turboquant_*, ultraquant_4bit) add vLLM's boundary layers, which vLLM keeps whatever the
        flags say. `layer_windows`: per layer the sliding window it keeps (None: every token);
        default config_layer_windows(config), i.e. the model's own sliding layers keep their window
        as the engines do. Passing [None] * layers keeps every token everywhere (the model's masks
        still restrict what is attended). `keep_decoded`: keep each layer's dequantized rows beside
        its store (QuantizedKVLayer._dequantized), so a decode step decodes only its new token: for
        a runtime decoding many steps; the probe's single long passes gain nothing from it and would
        hold the float copy too."""
        self.format = parse_format(fmt)
        text = config.get_text_config(decoder=True)
        n = text.num_hidden_layers
        windows = config_layer_windows(config) if layer_windows is None else list(layer_windows)
        if len(windows) != n:
            raise TrtkvError(
                f"layer_windows has {len(windows)} entries for a model with {n} layers. Next: one "
                "per layer (None for full attention)."
            )
        self.layer_windows = windows
        ks, vs = self._scales(self.format, n, k_scales, v_scales)
        self.k_scales, self.v_scales = ks, vs
        keep = set(keep_layers)
        if keep - set(range(n)):
            raise TrtkvError(
                f"keep_layers {sorted(keep - set(range(n)))} do not exist (the model has {n} "
                "layers)."
            )
        # vLLM always keeps these for turboquant_*/ultraquant_4bit
        keep |= set(boundary_layers(self.format.base, n))
        self.keep_layers = sorted(keep)
        self.qlayers = [
            QuantizedKVLayer(
                layer_codecs(keep_format) if i in keep else layer_codecs(self.format, ks[i], vs[i]),
                record_positions,
                track_clipping,
                sliding_window=windows[i],
                keep_decoded=keep_decoded,
            )
            for i in range(n)
        ]
        super().__init__(layers=list(self.qlayers))

    @staticmethod
    def _scales(
        choice: FormatChoice,
        n: int,
        k_scales: Sequence[KVScale] | None,
        v_scales: Sequence[KVScale] | None,
    ) -> tuple[list[KVScale | None], list[KVScale | None]]:
        if not choice.needs_scales:
            return [None] * n, [None] * n
        if k_scales is None or v_scales is None:
            raise TrtkvError(
                f"KV format {choice.name} needs static per-layer k_scales and v_scales. Next: pass "
                "the calibrate stage's kv_scales.json (trtkv.kvcache.scales.load_kv_scales) or "
                "calibrate them with trtkv.kvcache.scales.calibrate_scales(model, tokenizer)."
            )
        if len(k_scales) != n or len(v_scales) != n:
            raise TrtkvError(
                f"KV format {choice.name}: got {len(k_scales)} k_scales and {len(v_scales)} "
                f"v_scales for a model with {n} layers. Next: pass one scale per layer."
            )
        if choice.affine:  # fp8_affine: each layer's amax and bias as they are
            if not all(isinstance(s, AffineScale) for s in (*k_scales, *v_scales)):
                raise TrtkvError(
                    f"KV format {choice.name} needs an AffineScale (amax and bias) per layer for K "
                    f"and V. Next: pass KVScales.for_format('{choice.name}') from a calibration "
                    "pass (trtkv.kvcache.scales.calibrate_scales)."
                )
            return list(k_scales), list(v_scales)
        if choice.variant == "fp8_attn_head":  # per-KV-head scales as they are
            if not all(isinstance(s, HeadScale) for s in (*k_scales, *v_scales)):
                raise TrtkvError(
                    "KV format fp8_attn_head needs a HeadScale (one scale per KV head) per layer "
                    "for K and V. Next: pass KVScales.for_format('fp8_attn_head') from a "
                    "calibration pass (trtkv.kvcache.scales.calibrate_scales)."
                )
            return list(k_scales), list(v_scales)
        return [float(s) for s in k_scales], [float(s) for s in v_scales]

    def stored_bytes(self) -> int:
        """Bytes this cache holds: codes, scales/zero points, KIVI's window and the static
        scales."""
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

    def stored_tokens(self) -> list[int]:
        """Tokens each layer's quantized store holds now (a sliding layer: about its window)."""
        return [layer.stored_tokens for layer in self.qlayers]

    def bytes_per_token(self) -> float:
        """Stored bytes per quantized token summed over layers, each layer over the tokens it holds,
        KIVI's full-precision window left out (the planner's formula)."""
        return sum(
            layer.quantized_bytes() / layer.stored_tokens
            for layer in self.qlayers
            if layer.stored_tokens
        )

    def clip_stats(self) -> dict:
        """Clipping of the static formats: totals and per layer."""
        layers = []
        for i, layer in enumerate(self.qlayers):
            layers.append(
                {
                    "layer": i,
                    "k_clip": layer.clip["key"],
                    "v_clip": layer.clip["value"],
                    "elements": layer.elements["key"] + layer.elements["value"],
                    "k_observed_amax": layer.observed_amax["key"],
                    "v_observed_amax": layer.observed_amax["value"],
                    "k_limit": layer.codecs.key.limit,
                    "v_limit": layer.codecs.value.limit,
                }
            )
        clipped = sum(x["k_clip"] + x["v_clip"] for x in layers)
        total = sum(x["elements"] for x in layers)
        return {
            "clipped": clipped,
            "elements": total,
            "clip_rate": clipped / total if total else 0.0,
            "layers": layers,
        }

    def clip_per_position(self) -> torch.Tensor | None:
        """Clipped K+V elements per stored token summed over layers (record_positions=True)."""
        per_layer = [
            torch.cat(layer.clip_positions) for layer in self.qlayers if layer.clip_positions
        ]
        return torch.stack(per_layer).sum(0) if per_layer else None
