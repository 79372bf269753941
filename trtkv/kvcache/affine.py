"""fp8_affine's calibration exactly as ModelOpt 0.47 does it, so the same batches give the same bias
and amax.

ModelOpt's fp8_affine KV config (modelopt_recipes/configs/ptq/units/kv_fp8_affine.yaml) gives each
k/v_bmm_quantizer num_bits (4, 3), axis None and bias {-2, -4, type: static}. Per calibration batch
x ([batch, kv_heads, tokens, head_dim], post-RoPE K or V as the attention interface receives it, in
the model dtype), TensorQuantizer.collect
(modelopt/torch/quantization/nn/modules/tensor_quantizer.py) does:
- BiasCalibrator.collect (calib/bias.py, method "mean"): b = mean of x over the listed axes -4 and
  -2 (batch and tokens; one value per head and channel, keepdim); the first batch's b is the bias,
  later ones update the running average float32(bias) * n + float32(b) over n + 1, cast back to x's
  dtype;
- MaxCalibrator.collect (calib/max.py) on x minus the running bias as it stands after that batch
  (not the final bias): amax = max(|max|, |min|) of it, the running max over batches.
load_calib_amax / load_calib_bias keep the last values; the quantizer then uses them as
trtkv.kvcache.codecs' fp8_affine codec does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.numerics import AffineScale

BIAS_AXES = (-4, -2)  # the axes ModelOpt's bias {-2, -4} reduces: batch and tokens


class AffineCollector:
    """One quantizer's (one layer's K or V) running bias and amax, batch by batch, as ModelOpt
    collects them."""

    def __init__(self) -> None:
        self.bias: torch.Tensor | None = None  # [1, kv_heads, 1, head_dim] in the model dtype
        self.amax: torch.Tensor | None = None
        self.count = 0

    def collect(self, x: torch.Tensor) -> None:
        """One calibration batch [batch, kv_heads, tokens, head_dim]."""
        if x.dim() != 4:
            raise TrtkvError(
                f"fp8_affine calibration takes [batch, kv_heads, tokens, head_dim] tensors, got "
                f"shape {tuple(x.shape)}."
            )
        b = torch.mean(x, dim=tuple(d % 4 for d in sorted(BIAS_AXES)), keepdim=True)
        if self.bias is None:
            self.bias = b
        else:
            self.bias = ((self.bias.float() * self.count + b.float()) / (self.count + 1)).to(
                b.dtype
            )
        self.count += 1
        d = x - self.bias
        amax = torch.maximum(torch.abs(torch.max(d)), torch.abs(torch.min(d)))
        self.amax = amax if self.amax is None else torch.max(self.amax, amax)

    def result(self) -> tuple[float, torch.Tensor]:
        """(amax as a float, bias [kv_heads, head_dim] on the CPU)."""
        if self.bias is None or self.amax is None:
            raise TrtkvError(
                "fp8_affine calibration saw no batch. Next: pass at least one calibration batch."
            )
        return float(self.amax), self.bias.detach().reshape(
            self.bias.shape[1], self.bias.shape[3]
        ).cpu()


@dataclass
class AffineCalibration:
    """Per layer: fp8_affine's K and V amax (of x - bias) and bias [kv_heads, head_dim], and how
    many batches."""

    k_amax: list[float]
    v_amax: list[float]
    k_bias: list[torch.Tensor]
    v_bias: list[torch.Tensor]
    batches: int

    @classmethod
    def from_collectors(
        cls, keys: list[AffineCollector], values: list[AffineCollector]
    ) -> AffineCalibration:
        k = [c.result() for c in keys]
        v = [c.result() for c in values]
        return cls(
            k_amax=[a for a, _ in k],
            v_amax=[a for a, _ in v],
            k_bias=[b for _, b in k],
            v_bias=[b for _, b in v],
            batches=keys[0].count if keys else 0,
        )

    def scales(self) -> tuple[list[AffineScale], list[AffineScale]]:
        """Per-layer AffineScale of K and of V (what QuantizedKVCache takes for fp8_affine)."""
        return (
            [AffineScale(a, b) for a, b in zip(self.k_amax, self.k_bias, strict=True)],
            [AffineScale(a, b) for a, b in zip(self.v_amax, self.v_bias, strict=True)],
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the probe's calibration cache): floats round-trip exactly, the dtype is
        recorded."""
        dtype = str(self.k_bias[0].dtype).removeprefix("torch.") if self.k_bias else "float32"
        return {
            "k_amax": self.k_amax,
            "v_amax": self.v_amax,
            "batches": self.batches,
            "dtype": dtype,
            "k_bias": [b.double().tolist() for b in self.k_bias],
            "v_bias": [b.double().tolist() for b in self.v_bias],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> AffineCalibration:
        dtype = getattr(torch, str(doc.get("dtype", "float32")))
        return cls(
            k_amax=[float(a) for a in doc["k_amax"]],
            v_amax=[float(a) for a in doc["v_amax"]],
            k_bias=[torch.tensor(b, dtype=torch.float64).to(dtype) for b in doc["k_bias"]],
            v_bias=[torch.tensor(b, dtype=torch.float64).to(dtype) for b in doc["v_bias"]],
            batches=int(doc["batches"]),
        )
