"""Format numerics against independent references: E4M3 rounding and saturation, integer formats by exact arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.codecs import KiviKeyCodec, StaticCodec, layer_codecs
from trtkv.kvcache.formats import KVFormat
from trtkv.kvcache.names import parse_format
from trtkv.kvcache.numerics import (
    asym_dequantize,
    asym_quantize,
    e2m1_codes,
    e2m1_values,
    fp8_dequantize,
    fp8_quantize,
    int8_static_dequantize,
    int8_static_quantize,
    int8_token_dequantize,
    int8_token_quantize,
    nvfp4_dequantize,
    nvfp4_quantize,
    pack,
    unpack,
)


def _e4m3_table() -> tuple[np.ndarray, np.ndarray]:
    """All finite E4M3 values and their codes (built from the bit patterns, not from a float->fp8 cast)."""
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(torch.float8_e4m3fn).float().numpy().astype(np.float64)
    finite = np.isfinite(values)
    return values[finite], codes.numpy()[finite]


def _nearest_e4m3(y: np.ndarray) -> np.ndarray:
    """Round to the nearest E4M3 value, ties to the even code, saturating at +-448."""
    values, codes = _e4m3_table()
    y = np.clip(y, -448.0, 448.0)
    dist = np.abs(values[None, :] - y.reshape(-1, 1))
    best = dist == dist.min(axis=1, keepdims=True)
    pick = np.where(best.sum(1) > 1, np.argmax(best & (codes % 2 == 0)[None, :], axis=1), np.argmax(best, axis=1))
    return values[pick].reshape(y.shape)


def test_fp8_matches_e4m3_rounding_and_saturates() -> None:
    gen = torch.Generator().manual_seed(0)
    scale = 0.0123
    x = torch.randn(2, 3, 40, 16, generator=gen) * 3.0
    x[0, 0, 0, :4] = torch.tensor([1000.0, -1000.0, 448 * scale * 1.5, 1e-6])
    got = fp8_dequantize(fp8_quantize(x, scale), 1.0, torch.float32).numpy()
    want = _nearest_e4m3(x.double().numpy() / np.float32(scale))
    np.testing.assert_array_equal(got, want)
    assert got.max() == 448.0 and got.min() == -448.0  # saturated, not NaN
    # ties: 17 lies halfway between 16 and 18 (step 2 in [16, 32)): even mantissa wins
    ties = fp8_quantize(torch.tensor([17.0, 19.0, 0.5 + 1 / 32]), 1.0).float().tolist()
    assert ties == [16.0, 20.0, 0.5]


def test_fp8_dequantize_is_exact_for_every_code() -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    want = codes.float()
    finite = torch.isfinite(want)
    got = fp8_dequantize(codes, 1.0, torch.float32)
    assert torch.equal(got[finite], want[finite])
    assert torch.equal(fp8_dequantize(codes, 0.37, torch.float32)[finite], want[finite] * 0.37)


def test_fp8_codec_uses_division_by_scale() -> None:
    codec = StaticCodec(0.5)
    x = torch.tensor([[[[1.0, 2.0, 300.0, -300.0]]]])
    assert codec.roundtrip(x).flatten().tolist() == [1.0, 2.0, 224.0, -224.0]
    assert codec.limit == 224.0


def test_int8_static_exact_rounding_and_saturation() -> None:
    # scale 0.5 -> 1/scale = 2 exactly: x * 2 is exact, so the expected codes are plain arithmetic
    x = torch.tensor([0.0, 0.24, 0.25, 0.75, 1.25, -0.25, 63.5, 63.75, 64.0, -64.0, -64.25, -100.0, 1000.0])
    want = [0, 0, 0, 2, 2, 0, 127, 127, 127, -128, -128, -128, 127]  # half-even, saturate to [-128, 127]
    assert int8_static_quantize(x, 0.5).tolist() == want
    q = int8_static_quantize(x, 0.5)
    assert int8_static_dequantize(q, 0.5, torch.float32).tolist() == [v * 0.5 for v in want]


def test_int8_static_random_matches_float32_reference() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 33, 64, generator=gen) * 4
    scale = 10.0 / 127
    inv = np.float32(1.0 / scale)
    want = np.clip(np.rint(x.numpy().astype(np.float32) * inv), -128, 127)
    np.testing.assert_array_equal(int8_static_quantize(x, scale).numpy(), want)


def test_int8_shares_one_scale_for_k_and_v_like_tensorrt_llm() -> None:
    codecs = layer_codecs("int8", k_scale=0.1, v_scale=0.004)
    assert codecs.key.scale == codecs.value.scale == 0.1
    split = layer_codecs("int8_split", k_scale=0.1, v_scale=0.004)
    assert (split.key.scale, split.value.scale) == (0.1, 0.004)
    fp8 = layer_codecs("fp8", k_scale=0.1, v_scale=0.004)
    assert (fp8.key.scale, fp8.value.scale) == (0.1, 0.004)
    with pytest.raises(TrtkvError, match="needs positive static"):
        layer_codecs("int8")


def test_int8_token_exact() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 17, 64, generator=gen) * 5
    x[0, 0, 0] = 0.0  # an all-zero row must not divide by zero
    q, scale = int8_token_quantize(x)
    amax = np.abs(x.numpy().astype(np.float64)).max(-1, keepdims=True)
    s = (amax / 127).astype(np.float16)
    assert scale.dtype == torch.float16
    np.testing.assert_array_equal(scale.numpy(), s)
    s64 = np.where(s > 0, s.astype(np.float64), 1.0)
    want = np.clip(np.rint(x.numpy().astype(np.float64) / s64), -127, 127)
    np.testing.assert_array_equal(q.numpy(), want)
    assert q[0, 0, 0].abs().sum() == 0
    back = int8_token_dequantize(q, scale, torch.float32)
    assert torch.all((back - x).abs() <= scale.float() / 2 + 1e-6)


def _asym_reference(x: np.ndarray, bits: int, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xg = x.reshape(*x.shape[:-1], x.shape[-1] // group, group).astype(np.float64)
    lo, hi = xg.min(-1), xg.max(-1)
    qmax = 2**bits - 1
    scale = ((hi - lo) / qmax).astype(np.float16)
    zero = lo.astype(np.float16)
    s = np.where(scale > 0, scale.astype(np.float64), 1.0)
    q = np.clip(np.rint((xg - zero.astype(np.float64)[..., None]) / s[..., None]), 0, qmax)
    return q.reshape(x.shape), scale, zero


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (4, 64), (2, 32)])
def test_asym_groups_exact_with_clipping(bits: int, group: int) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 9, 64, generator=gen) * 3
    x[0, 0, 0, :group] = torch.linspace(-1.0001, 2.0001, group)  # fp16 rounding of min/scale pushes ends past range
    q, scale, zero = asym_quantize(x, bits, group)
    rq, rs, rz = _asym_reference(x.numpy(), bits, group)
    np.testing.assert_array_equal(scale.numpy(), rs)
    np.testing.assert_array_equal(zero.numpy(), rz)
    np.testing.assert_array_equal(q.numpy(), rq)
    assert int(q.max()) == 2**bits - 1 and int(q.min()) == 0
    back = asym_dequantize(q, scale, zero, torch.float32)
    tol = scale.float().repeat_interleave(group, dim=-1) * 0.5 + 2e-3 * x.abs()
    assert torch.all((back - x).abs() <= tol + 1e-3)


def test_pack_layout_and_roundtrip() -> None:
    codes = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    assert pack(codes, 4).tolist() == [[0x21, 0x43]]
    assert pack(torch.tensor([[1, 2, 3, 0]], dtype=torch.uint8), 2).tolist() == [[0b00111001]]
    gen = torch.Generator().manual_seed(4)
    for bits in (4, 2):
        q = torch.randint(0, 2**bits, (3, 5, 64), generator=gen, dtype=torch.uint8)
        packed = pack(q, bits)
        assert packed.shape[-1] == 64 * bits // 8 and packed.dtype == torch.uint8
        assert torch.equal(unpack(packed, bits), q)


def test_kivi_key_is_per_channel_over_token_groups() -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 64, 64, generator=gen)
    x[..., 7] *= 50  # an outlier channel: per-channel scales keep the other channels precise
    codec = KiviKeyCodec(bits=4, group=32)
    parts = codec.encode(x)
    assert parts["scale"].shape == (1, 2, 2, 64) and parts["data"].shape == (1, 2, 64, 32)
    xt = x.numpy().reshape(1, 2, 2, 32, 64).transpose(0, 1, 2, 4, 3)  # groups of 32 tokens per channel
    rq, rs, rz = _asym_reference(xt, 4, 32)
    np.testing.assert_array_equal(parts["scale"].numpy(), rs[..., 0])
    codes = unpack(parts["data"], 4).numpy().reshape(1, 2, 2, 32, 64).transpose(0, 1, 2, 4, 3)
    np.testing.assert_array_equal(codes, rq)
    err = (codec.decode(parts, torch.float32) - x).abs()
    assert err[..., 7].max() > 10 * err[..., :7].max()  # the outlier's error stays in its own channel
    with pytest.raises(TrtkvError, match="groups of 32 tokens"):
        codec.encode(x[:, :, :40])


def test_every_format_roundtrips_with_bounded_error() -> None:
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 3, 64, 64, generator=gen)
    errors = {}
    for fmt in KVFormat:
        scale = 4.5 / (448 if fmt in (KVFormat.FP8, KVFormat.NVFP4) else 127)
        codecs = layer_codecs(fmt, scale, scale)
        back = codecs.key.roundtrip(x)
        assert back.shape == x.shape and back.dtype == x.dtype
        errors[fmt.value] = float((back - x).pow(2).mean().sqrt())
    assert errors["fp16"] < 1e-3 and errors["bf16"] < 5e-3
    assert errors["int8_token"] < errors["int4_g32"] < errors["kivi2"]
    assert errors["int4_g32"] <= errors["int4_g64"] <= errors["int4_g128"]


def test_parse_format_names() -> None:
    assert parse_format("int8_split").split_scales
    assert parse_format(KVFormat.FP8).static
    with pytest.raises(TrtkvError, match="Allowed"):
        parse_format("int3")


# ----------------------------------------------------------------------------- NVFP4

# E2M1 from its definition (1 sign, 2 exponent bits with bias 1, 1 mantissa bit; exponent 0 is subnormal): code -> value
def _e2m1_value(code: int) -> float:
    sign = -1.0 if code & 8 else 1.0
    exp, man = (code >> 1) & 3, code & 1
    return sign * (man * 0.5 if exp == 0 else (1 + man / 2) * 2.0 ** (exp - 1))


E2M1_TABLE = np.array([_e2m1_value(c) for c in range(16)])


def _nearest_e2m1(y: np.ndarray) -> np.ndarray:
    """Round to the nearest E2M1 value, ties to the even code, saturating at +-6 (what cvt.rn.satfinite does)."""
    y = np.clip(y, -6.0, 6.0)
    codes = np.arange(16)
    dist = np.abs(E2M1_TABLE[None, :] - y.reshape(-1, 1))
    best = dist == dist.min(axis=1, keepdims=True)
    # ties (e.g. 0.25 between 0 and 0.5) go to the even mantissa; +0/-0 tie only for y == 0, both are zero
    pick = np.where(best.sum(1) > 1, np.argmax(best & (codes % 2 == 0)[None, :], axis=1), np.argmax(best, axis=1))
    return E2M1_TABLE[pick].reshape(y.shape)


def test_e2m1_table_and_rounding_match_the_definition() -> None:
    assert sorted({abs(v) for v in E2M1_TABLE}) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    grid = np.concatenate([np.linspace(-8, 8, 6401), (E2M1_TABLE[:8, None] + E2M1_TABLE[None, :8]).ravel() / 2,
                           -(E2M1_TABLE[:8, None] + E2M1_TABLE[None, :8]).ravel() / 2])  # every midpoint, both signs
    got = e2m1_values(e2m1_codes(torch.tensor(grid, dtype=torch.float32))).numpy()
    np.testing.assert_array_equal(got, _nearest_e2m1(grid.astype(np.float32)))
    for tie, expected in [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)]:
        assert e2m1_values(e2m1_codes(torch.tensor([tie, -tie]))).tolist() == [expected, -expected]


def test_nvfp4_blocks_of_16_with_e4m3_block_scales_and_a_global_scale() -> None:
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(1, 2, 5, 64, generator=gen) * 3
    amax = float(x.abs().max())
    g = amax / 448  # the static global scale as ModelOpt exports it (k_scale = amax / 448)
    codes, block_scale = nvfp4_quantize(x, g)
    assert codes.shape == x.shape and block_scale.shape == (1, 2, 5, 4) and block_scale.dtype == torch.float8_e4m3fn
    # independent reference in float64: block scale = E4M3(block amax / 6 / g), value = E2M1(x / (scale * g))
    blocks = x.double().numpy().reshape(1, 2, 5, 4, 16)
    ref_scale = _nearest_e4m3(np.abs(blocks).max(-1) / 6 / g)
    np.testing.assert_array_equal(block_scale.float().numpy(), ref_scale)
    ref = _nearest_e2m1(blocks / (ref_scale * g)[..., None]) * (ref_scale * g)[..., None]
    back = nvfp4_dequantize(codes, block_scale, g, torch.float32).numpy().reshape(ref.shape)
    np.testing.assert_allclose(back, ref, rtol=1e-6, atol=0)
    assert float(block_scale.float().max()) == 72.0  # 448 / 6 = 74.67 rounds to E4M3's 72 (spacing 8 in [64, 128))
    # the format's own resolution: a block's error is at most half its largest step (2 between 4 and 6) x its scale
    err = np.abs(back - blocks)
    assert (err <= (ref_scale * g)[..., None] * 1.0 + 1e-9).all()


def test_nvfp4_static_global_scale_clips_only_beyond_six_times_the_calibrated_amax() -> None:
    codec = layer_codecs("nvfp4", 1.0 / 448, 1.0 / 448).key  # calibrated amax 1.0
    x = torch.zeros(1, 1, 1, 32)
    x[..., 0], x[..., 1] = 5.0, 0.5  # 5x beyond calibration: block scale 5 * 448 / 6 = 373.3 -> E4M3 384, no clip
    x[..., 16] = 10.0  # 10x: the block scale saturates at 448, the value at 6 x 448 x (1/448) = 6
    back = codec.roundtrip(x)
    assert codec.limit == pytest.approx(6.0)
    step = 384 / 448  # block scale x global scale
    assert float(back[..., 0]) == pytest.approx(6 * step)  # 5 / step = 5.83 -> E2M1 6
    assert float(back[..., 1]) == pytest.approx(0.5 * step)  # 0.5 / step = 0.58 -> E2M1 0.5
    assert float(back[..., 16]) == pytest.approx(6.0)


def test_nvfp4_keeps_separate_k_and_v_global_scales() -> None:
    codecs = layer_codecs("nvfp4", 0.01, 0.002)
    assert (codecs.key.scale, codecs.value.scale) == (0.01, 0.002)
    with pytest.raises(TrtkvError, match="global scales"):
        layer_codecs("nvfp4", None, None)
    with pytest.raises(TrtkvError, match="multiple of it"):
        nvfp4_quantize(torch.ones(1, 1, 1, 24), 0.01)
