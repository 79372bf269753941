"""Runs ModelOpt 0.47's own Triton NVFP4 functions (interpreted on the CPU) on saved inputs: the reference for trtkv's
nvfp4_cast and nvfp4_rotate.

Run by tests/kvcache/test_engine_variants.py with .venv-vllm's python (it has triton) and TRITON_INTERPRET=1:
    python modelopt_fp4_reference.py MODELOPT_KERNELS DIR
MODELOPT_KERNELS is modelopt/torch/kernels/quantization of the main venv; DIR holds x.npy ([rows, D] float32) and
amax.npy (one amax per case); this writes out_<i>.npy. fp8_quantize_scale and fp4_round_magnitude are ModelOpt's
(common/nvfp4_quant.py), composed as fp4_fake_quant_kernel (gemm/fp4_kernel_hopper.py) composes them: that kernel's
block pointers are gone from triton 3.9's interpreter, so its ten-line body is restated here around ModelOpt's
functions. The interpreter's float32 -> fp8e4nv conversion drops the mantissa carry; it is replaced by torch's
saturating round-to-nearest-even cast (what a GPU's cvt.rn.satfinite computes). Not part of the trtkv package.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import torch
import triton
import triton.language as tl
import triton_rne  # the script's own folder is on sys.path

triton_rne.install()  # tests/kvcache/triton_rne.py: the GPU's saturating round-to-nearest-even E4M3 cast


def _load(name: str, path: str) -> types.ModuleType:
    for pkg in ("modelopt_kernels", "modelopt_kernels.common"):
        mod = types.ModuleType(pkg)
        mod.__path__ = []
        sys.modules.setdefault(pkg, mod)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@triton.jit
def fake_quant(x_ptr, y_ptr, gs_ptr, NB: tl.constexpr, B: tl.constexpr):  # noqa: ANN001, ANN202, N803
    row = tl.program_id(0)
    offs = tl.arange(0, NB * B)
    x = tl.load(x_ptr + row * NB * B + offs).to(tl.float32)
    gs = tl.load(gs_ptr).to(tl.float32)
    gs = tl.where(gs > 0.0, gs, 1e-12)
    tile = tl.reshape(x, (NB, B))
    a = tl.abs(tile)
    step = _NVFP4.fp8_quantize_scale(tl.max(a, axis=1, keep_dims=True), gs)
    step = tl.where(step >= 1e-5, step, 1.0)
    v = _NVFP4.fp4_round_magnitude(a / step) * step
    v = tl.where(tile >= 0, v, -v)
    tl.store(y_ptr + row * NB * B + offs, tl.reshape(v, (NB * B,)))


_NVFP4: types.ModuleType | None = None  # ModelOpt's common/nvfp4_quant.py, loaded by main


def main(kernels: str, folder: str) -> None:
    global _NVFP4
    _NVFP4 = _load("modelopt_kernels.common.nvfp4_quant", f"{kernels}/common/nvfp4_quant.py")

    x = torch.from_numpy(np.load(f"{folder}/x.npy"))
    rows, d = x.shape
    for i, amax in enumerate(np.load(f"{folder}/amax.npy")):
        y = torch.empty_like(x)
        gs = torch.tensor([float(amax)], dtype=torch.float32) / (6.0 * 448.0)  # fp4_fake_quant_block's global scale
        fake_quant[(rows,)](x, y, gs, NB=d // 16, B=16)
        np.save(f"{folder}/out_{i}.npy", y.numpy())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
