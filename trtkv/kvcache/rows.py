"""Row storage for the quantized KV cache (trtkv.kvcache.cache): RowStore, the growing per-part
tensors a layer keeps (trtkv.kvcache.quantized_layer), and encode_rows, one layer's new tokens
encoded once for many sequences' caches (update_rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trtkv.kvcache.codec_base import Codec

# storage grows by this many rows (tokens) at a time: little slack, amortized copies
BLOCK_ROWS = 256


class RowStore:
    """Named tensors growing along dim -2 in blocks; each part counts its own used rows (KIVI's K
    scales have one row per 32 tokens)."""

    def __init__(self, block: int = BLOCK_ROWS):
        self.block = block
        self.used: dict[str, int] = {}  # end of the live rows
        # first live row (rows before it were dropped: sliding-window layers)
        self.start: dict[str, int] = {}
        self.buffers: dict[str, torch.Tensor] = {}

    def append(self, parts: dict[str, torch.Tensor]) -> None:
        most = max(v.shape[-2] for v in parts.values())
        for name, value in parts.items():
            n = value.shape[-2]
            first, end = self.start.get(name, 0), self.used.get(name, 0)
            rows = end - first
            buf = self.buffers.get(name)
            if buf is None or end + n > buf.shape[-2]:
                # parts with fewer rows per token
                block = max(1, -(-self.block * n // most)) if most else self.block
                new = self._alloc(value, -(-(rows + n) // block) * block)
                if buf is not None:
                    new[..., :rows, :] = buf[..., first:end, :]  # dropped rows are not carried over
                self.buffers[name] = buf = new
                first, end = 0, rows
                self.start[name] = 0
            buf[..., end : end + n, :] = value
            self.used[name] = end + n

    def drop_front(self, tokens: int, stored_tokens: int) -> None:
        """Forget the oldest `tokens` of `stored_tokens` in every part (a part with one row per G
        tokens drops tokens / G rows; `tokens` must be a multiple of every part's G)."""
        if tokens <= 0:
            return
        for name, end in self.used.items():
            first = self.start.get(name, 0)
            self.start[name] = first + tokens * (end - first) // stored_tokens

    @staticmethod
    def _alloc(like: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.empty(
            (*like.shape[:-2], rows, like.shape[-1]), dtype=like.dtype, device=like.device
        )

    @property
    def rows(self) -> int:
        return max((end - self.start.get(k, 0) for k, end in self.used.items()), default=0)

    def view(self) -> dict[str, torch.Tensor]:
        return {k: v[..., self.start.get(k, 0) : self.used[k], :] for k, v in self.buffers.items()}

    def used_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.view().values())

    def allocated_bytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.buffers.values())

    def map(self, fn) -> None:  # noqa: ANN001 - fn: Tensor -> Tensor over the batch dim
        self.buffers = {k: fn(v) for k, v in self.buffers.items()}

    def truncate(self, rows: int) -> None:
        """Keep the first `rows` live rows of every part (per-token formats only)."""
        self.used = {k: min(v, self.start.get(k, 0) + rows) for k, v in self.used.items()}


@dataclass
class Encoded:
    """One layer's new tokens as the store keeps them: codes (parts), their decode where the layer
    keeps it (keep_decoded), and the clip counts and |x| maxima of K and V where the layer counts
    them."""

    k_parts: dict[str, torch.Tensor]
    v_parts: dict[str, torch.Tensor]
    k_decoded: torch.Tensor | None = None
    v_decoded: torch.Tensor | None = None
    clip: tuple[int, int] | None = None
    amax: tuple[float, float] = (0.0, 0.0)


def encode_rows(
    layer: Any, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, split: bool = True
) -> list[Encoded] | None:
    """k/v (B, H, T, d) encoded by `layer`'s codecs in one call, split into one Encoded per batch
    row (None when a stored part has no batch dimension to split; split=False: one Encoded of all B
    rows, for one cache's store). Equal to encoding each row on its own, bit for bit: the codecs
    quantize elementwise or per token (row_separable); so one call serves the same layer of B
    sequences that quantize alike (update_rows)."""
    codecs = layer.codecs
    rows = k.shape[0] if split else 1
    # one elementwise codec for K and V (TensorRT-LLM's one scale): K and V coded as one tensor
    heads = k.shape[1] if _joint(codecs) and k.shape == v.shape and k.shape[0] == rows else 0
    if heads:
        kv = torch.cat((k, v), 1)
        joint = codecs.key.encode(kv)
        k_parts = {name: t[:, :heads] for name, t in joint.items()}
        v_parts = {name: t[:, heads:] for name, t in joint.items()}
    else:
        k_parts, v_parts = codecs.key.encode(k), codecs.value.encode(v)
    if rows > 1 and any(t.shape[0] != rows for t in (*k_parts.values(), *v_parts.values())):
        return None
    keep = layer.keep_decoded and layer.decoded_dtype in (None, dtype)
    k_dec = v_dec = None
    if keep and heads:
        both = codecs.key.decode(joint, dtype)
        k_dec, v_dec = both[:, :heads], both[:, heads:]
    elif keep:
        k_dec, v_dec = codecs.key.decode(k_parts, dtype), codecs.value.decode(v_parts, dtype)
    clips: list[tuple[int, int]] | None = None
    amax: list[tuple[float, float]] = [(0.0, 0.0)] * rows
    if layer.tracks():
        if k.numel() and heads:
            amax = [(float(a), float(b)) for a, b in kv.abs().reshape(rows, 2, -1).amax(2).tolist()]
        elif k.numel():
            ka, va = (
                k.abs().reshape(rows, -1).amax(1).tolist(),
                v.abs().reshape(rows, -1).amax(1).tolist(),
            )
            amax = [(float(a), float(b)) for a, b in zip(ka, va, strict=True)]
        counts = [_clipped(codecs.key, k, rows, [a for a, _ in amax])]
        counts.append(_clipped(codecs.value, v, rows, [b for _, b in amax]))
        clips = list(zip(*counts, strict=True))
    if rows == 1:
        return [Encoded(k_parts, v_parts, k_dec, v_dec, clips[0] if clips else None, amax[0])]

    def row(parts: dict[str, torch.Tensor], b: int) -> dict[str, torch.Tensor]:
        return {name: t[b : b + 1] for name, t in parts.items()}

    return [
        Encoded(
            row(k_parts, b),
            row(v_parts, b),
            None if k_dec is None else k_dec[b : b + 1],
            None if v_dec is None else v_dec[b : b + 1],
            clips[b] if clips else None,
            amax[b],
        )
        for b in range(rows)
    ]


def _clipped(codec: Any, x: torch.Tensor, rows: int, amax: list[float]) -> list[int]:
    """Per row, the elements of x the codec clips. A codec that clips |x| beyond its limit clips
    nothing in a row whose |x| maximum lies within it: the count is then 0 without a pass over x
    (most decode steps of a calibrated static scale)."""
    if type(codec).beyond is Codec.beyond and all(a <= codec.limit for a in amax):
        return [0] * rows
    return [int(n) for n in codec.beyond(x).reshape(rows, -1).sum(1).tolist()]


def _joint(codecs: Any) -> bool:
    """Whether K and V are coded alike, element by element (Codec.elementwise, the same parameters),
    so that one call codes both."""
    key, value = codecs.key, codecs.value
    return bool(key.elementwise) and type(key) is type(value) and vars(key) == vars(value)
