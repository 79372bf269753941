"""The Triton interpreter's float32 -> fp8e4nv conversion drops the mantissa carry (1.98 becomes 1.0, not 2.0); this
replaces it with torch's saturating round-to-nearest-even cast, what a GPU's cvt.rn.satfinite computes, for the
reference scripts that run engine kernels interpreted on the CPU (vllm_reference.py, modelopt_fp4_reference.py:
imported by them, run with .venv-vllm's python). Every other conversion is the interpreter's own."""

from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
import triton.runtime.interpreter as interpreter

_convert_float = interpreter._convert_float


def _convert_float_rne(data, input_dtype, output_dtype, rounding_mode):  # noqa: ANN001, ANN202
    """float32 -> fp8e4nv as the GPU converts (saturate, round to nearest even); every other conversion unchanged."""
    if output_dtype == tl.float8e4nv and input_dtype == tl.float32:
        t = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).clamp(-448.0, 448.0)
        return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(data.shape)
    return _convert_float(data, input_dtype, output_dtype, rounding_mode)


def install() -> None:
    """Route the interpreter's conversions through _convert_float_rne (idempotent)."""
    interpreter._convert_float = _convert_float_rne
