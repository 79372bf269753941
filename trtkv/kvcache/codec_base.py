"""The codec interface every stored K or V format implements (trtkv.kvcache.codecs, trtkv.kvcache.variants), in a
module of its own so the variants can subclass it without importing the codec table that dispatches to them."""

from __future__ import annotations

import torch


class Codec:
    """Turns [B, H, T, D] chunks into stored parts and back. `token_group`: T must be a multiple of it."""

    token_group = 1
    static = False
    limit: float = float("inf")  # |x| beyond this is clipped (static formats)

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x), x.dtype)

    def beyond(self, x: torch.Tensor) -> torch.Tensor:
        """Elements this codec clips (static formats)."""
        return x.abs() > self.limit

    def static_bytes(self) -> int:
        """Bytes stored once per layer, not per token: a float32 static scale."""
        return 4 if self.static else 0
