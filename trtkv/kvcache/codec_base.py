"""The codec interface every stored K or V format implements (trtkv.kvcache.codecs,
trtkv.kvcache.variants) and the NVFP4 codec the NVFP4 variants share, in a module of their own so
the variants can subclass them without importing the codec table that dispatches to them."""

from __future__ import annotations

import torch

from trtkv.kvcache.formats import E2M1_MAX, FP8_MAX
from trtkv.kvcache.numerics import nvfp4_dequantize, nvfp4_quantize, pack, unpack


class Codec:
    """Turns [B, H, T, D] chunks into stored parts and back. `token_group`: T must be a multiple of
    it."""

    token_group = 1
    # decode(parts of rows a..b) equals rows a..b of decode(all parts), bit for bit: true for
    # elementwise decodes (and butterfly rotations, elementwise per token); a decode through a GEMM
    # is not (BLAS blocks by row count)
    row_separable = True
    # each element coded on its own from fixed parameters (a cast, a static scale): K and V of
    # one such codec can be coded as one tensor (trtkv.kvcache.rows)
    elementwise = False
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


class NVFP4Codec(Codec):
    """NVFP4 with a static per-layer global scale (amax / 448, as exported); block scales come from
    the data."""

    static = True

    def __init__(self, global_scale: float):
        self.scale = float(global_scale)
        self.limit = E2M1_MAX * FP8_MAX * self.scale

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, block_scale = nvfp4_quantize(x, self.scale)
        return {"data": pack(codes, 4), "scale": block_scale}

    def decode(self, parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return nvfp4_dequantize(unpack(parts["data"], 4), parts["scale"], self.scale, dtype)
