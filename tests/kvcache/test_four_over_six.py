"""nvfp4_4over6 against a line-by-line scalar transcription of vLLM's store kernel (cvt_warp_fp16_to_fp4_4over6 in
csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu, vllm-project/vllm PR #45187): the CUDA kernel cannot run here, so this
pins trtkv's vectorized torch to the kernel's float32 operation order (rcp.approx modelled as the float32 reciprocal)."""

from __future__ import annotations

import numpy as np
import torch

from trtkv.kvcache.codecs import layer_codecs
from trtkv.kvcache.numerics import e2m1_values, nvfp4_dequantize, nvfp4_quantize, unpack
from trtkv.kvcache.variants import nvfp4_4over6_quantize

F = np.float32
E4M3 = sorted({float(v) for v in torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()})


def _e4m3_satfinite(v: np.float32) -> np.float32:
    """__nv_fp8_e4m3(float) of a non-negative value: nearest E4M3, ties to the even code, saturating at 448."""
    if v >= 448:
        return F(448)
    codes = np.array(E4M3)
    i = int(np.searchsorted(codes, v))
    lo, hi = i - 1, min(i, len(codes) - 1)
    if codes[hi] == v:
        return F(v)
    if v - codes[lo] == codes[hi] - v:
        return F(codes[lo] if lo % 2 == 0 else codes[hi])  # the code index is the byte: even byte = even mantissa
    return F(codes[lo] if v - codes[lo] < codes[hi] - v else codes[hi])


def _round_e2m1(x: np.float32) -> float:
    """round_to_nearest_e2m1 of the kernel (cvt.rn.satfinite.e2m1x2.f32's boundaries)."""
    ax = abs(float(x))
    q = 0.0 if ax <= 0.25 else 0.5 if ax < 0.75 else 1.0 if ax <= 1.25 else 1.5 if ax < 1.75 else 2.0 if ax <= 2.5 \
        else 3.0 if ax < 3.5 else 4.0 if ax <= 5.0 else 6.0
    return float(np.copysign(q, x))


def _candidate(vals: list[np.float32], sf_scale: np.float32, vec_max: np.float32, den: float):
    sf = _e4m3_satfinite(F(sf_scale * F(vec_max * F(F(1) / F(den)))))
    out = F(F(1) / F(sf * F(F(1) / sf_scale))) if sf != 0 else F(0)
    deq = F(F(1) / out) if out != 0 else F(0)
    err = F(0)
    for i in range(0, 16, 2):
        dx = F(F(F(_round_e2m1(F(vals[i] * out))) * deq) - vals[i])
        dy = F(F(F(_round_e2m1(F(vals[i + 1] * out))) * deq) - vals[i + 1])
        err = F(err + F(F(dx * dx) + F(dy * dy)))
    return sf, out, err


def kernel_block(vals: list[np.float32], k_scale: float) -> tuple[list[float], float]:
    """One 16-element block as the kernel stores it: (the E2M1 values, the E4M3 block scale)."""
    sf_scale = F(F(1) / F(k_scale))
    vec_max = F(max(abs(v) for v in vals))
    sf6, out6, err6 = _candidate(vals, sf_scale, vec_max, 6.0)
    sf4, out4, err4 = _candidate(vals, sf_scale, vec_max, 4.0)
    use4 = err4 < err6
    out = out4 if use4 else out6
    return [_round_e2m1(F(v * out)) for v in vals], float(sf4 if use4 else sf6)


# A block where -1.546875 x outputScale lands next to E2M1's 3 / 4 tie (3.5): the kernel's reciprocal gives 3, dividing
# by the step (block scale x k_scale) gives exactly 3.5 and the even code 4.
TIE = [-0.06005859375, 1.640625, 2.703125, 0.62109375, 0.177734375, 0.609375, -0.6953125, 1.1796875, -1.546875,
       0.006591796875, 0.66796875, -1.671875, -0.37890625, 0.1884765625, -1.7421875, 0.96875]


def _blocks(x: torch.Tensor) -> list[list[np.float32]]:
    return [[F(v) for v in row] for row in x.float().reshape(-1, 16).tolist()]


def test_trtkv_equals_the_kernel_transcription_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(1, 4, 64, 64, generator=g) * torch.rand(1, 4, 64, 1, generator=g) * 3).bfloat16()
    x[0, 0, 0, :16] = 0  # an all-zero block
    x[0, 0, 1, :16] = torch.tensor([1.0, -1.0] * 8)  # a flat block: amax/4 is exact
    x[0, 0, 2, :16] = torch.tensor(TIE)
    k_scale = 12.375 / 448
    codes, scale = nvfp4_4over6_quantize(x, k_scale)
    values = e2m1_values(codes).reshape(-1, 16)
    scales = scale.float().reshape(-1)
    picked4 = 0
    for i, block in enumerate(_blocks(x)):
        want_values, want_scale = kernel_block(block, k_scale)
        assert values[i].tolist() == want_values and float(scales[i]) == want_scale, (i, block)
        picked4 += want_scale != float(_e4m3_satfinite(F(F(F(1) / F(k_scale)) * F(max(abs(v) for v in block) / F(6)))))
    assert 0 < picked4 < len(scales)  # both candidates are exercised


def test_a_block_whose_amax_over_6_scale_underflows_keeps_the_amax_over_4_one() -> None:
    """The kernel zeroes a block whose E4M3 scale is 0 (outputScale 0): its error is the block's energy, so the amax/4
    candidate (one E4M3 step up) wins; the re-derived rule divided by a stand-in step 1 and stored zeros instead."""
    x = torch.full((1, 1, 1, 16), 0.5)
    k_scale = 100.0  # 0.5 / (6 x 100) is under half of E4M3's smallest subnormal 2^-9; 0.5 / 400 rounds up to it
    codes, scale = nvfp4_4over6_quantize(x, k_scale)
    assert float(scale.float()) == 2.0 ** -9
    y = nvfp4_dequantize(codes, scale, k_scale, torch.float32)
    assert torch.allclose(y, torch.full_like(x, 3 * 2.0 ** -9 * k_scale))  # 0.5 / 0.195 = 2.56 -> E2M1 3
    want_values, want_scale = kernel_block(_blocks(x)[0], k_scale)
    assert want_scale == 2.0 ** -9 and want_values == [3.0] * 16


def test_negative_zero_keeps_its_sign_bit_as_the_hardware_cvt() -> None:
    x = torch.tensor([-0.0, -0.01] + [1.0] * 14).view(1, 1, 1, 16)
    codes, _ = nvfp4_4over6_quantize(x, 1.0 / 448)
    assert codes[0, 0, 0, 0] == 8 and codes[0, 0, 0, 1] == 8  # sign bit, magnitude 0


def test_four_over_six_shares_nvfp4s_codec_and_differs_only_in_its_store() -> None:
    """FourOverSixCodec is NVFP4Codec (codec_base.py) with another encode: the same limit, bytes and reading."""
    from trtkv.kvcache.codec_base import NVFP4Codec
    from trtkv.kvcache.variants import FourOverSixCodec

    x = torch.randn(1, 2, 8, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    gs = float(x.float().abs().max()) / 448
    four, plain = layer_codecs("nvfp4_4over6", gs, gs).key, layer_codecs("nvfp4", gs, gs).key
    assert type(plain) is NVFP4Codec and isinstance(four, FourOverSixCodec) and isinstance(four, NVFP4Codec)
    assert (four.limit, four.static, four.static_bytes()) == (plain.limit, plain.static, plain.static_bytes())
    codes, scale = nvfp4_4over6_quantize(x, gs)
    parts = four.encode(x)
    assert torch.equal(unpack(parts["data"], 4), codes) and torch.equal(parts["scale"].view(torch.uint8),
                                                                             scale.view(torch.uint8))
    assert torch.equal(four.decode(parts, torch.float32), nvfp4_dequantize(codes, scale, gs, torch.float32))
    c6, s6 = nvfp4_quantize(x, gs)
    assert torch.equal(plain.roundtrip(x.float()), nvfp4_dequantize(c6, s6, gs, torch.float32))
