"""The engine formats that share a trtkv storage (fp8_e5m2, fp8_attn_head, nvfp4_4over6, nvfp4_cast, nvfp4_rotate):
error bounds that follow from each format, the Hadamard's orthogonality, the per-head scales vLLM would load, ModelOpt's
own NVFP4 functions (Triton, interpreted), and a short probe-style run on a tiny random Llama."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.models import tiny_llama
from trtkv.cli.probe import _names
from trtkv.kvcache import engines, quant
from trtkv.kvcache.attn_head import attn_head_scales, head_amax_from_channels
from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.codecs import layer_codecs
from trtkv.kvcache.numerics import nvfp4_dequantize, nvfp4_quantize
from trtkv.kvcache.scales import KVScales
from trtkv.kvcache.stats import collect_kv_stats
from trtkv.kvcache.variants import E5M2_MAX, head_scale, modelopt_fake_quant, modelopt_hadamard, nvfp4_4over6_quantize

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NEW = ["fp8_e5m2", "fp8_attn_head", "nvfp4_4over6", "nvfp4_rotate", "nvfp4_cast"]


def _x(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def test_new_formats_are_probe_names_with_their_verified_rows() -> None:
    table = engines.load_table()
    assert _names(",".join(NEW)) == NEW  # `trtkv probe --formats ...` takes them
    for name in NEW:
        row = table.for_probe(name)
        assert row is not None and row.name == name and not row.why_not_in_probe
        assert row.verified["against"] and row.verified["at"] and row.verified["test"]
    keys = {quant.numerics_key(n) for n in NEW}
    assert len(keys) == len(NEW)  # nvfp4_cast and nvfp4_rotate share codec classes, not a key


def test_e5m2_round_trip_is_within_half_a_step_of_two_mantissa_bits() -> None:
    x = torch.cat([_x(1, 2, 64, 64), torch.tensor([1e-6, 6e-5, 1.125, 1.375, 7e4]).view(1, 1, 5, 1).expand(1, 2, 5, 64)],
                  dim=2)
    y = quant.fake_quantize(x, "fp8_e5m2")
    normal = x.abs() >= 2.0 ** -14
    assert ((y - x).abs()[normal & (x.abs() <= E5M2_MAX)] <= x.abs()[normal & (x.abs() <= E5M2_MAX)] / 8).all()
    assert ((y - x).abs()[~normal] <= 2.0 ** -17).all()  # subnormal step 2^-16
    assert y.abs().max() == E5M2_MAX  # 7e4 saturates
    assert y[0, 0, 64 + 2, 0] == 1.0 and y[0, 0, 64 + 3, 0] == 1.5  # ties 1.125 / 1.375 go to the even mantissa


def test_attn_head_scales_are_the_numbers_calibrate_writes_for_vllm() -> None:
    channel = [[float(v) for v in _x(3 * 16, seed=i).abs()] for i in range(2)]
    mine = [head_scale([max(layer[h * 16:(h + 1) * 16]) for h in range(3)]).scales for layer in channel]
    theirs = [attn_head_scales(head_amax_from_channels(layer, 3)) for layer in channel]
    assert [list(m) for m in mine] == [torch.tensor(t, dtype=torch.float32).tolist() for t in theirs]


def test_attn_head_quantizes_each_head_with_its_own_scale() -> None:
    x = _x(1, 3, 32, 64)
    x[:, 2] *= 2.0 ** 14  # one loud head: a per-tensor scale puts the others in E4M3 subnormals
    amax = x.abs().amax(dim=(0, 2, 3)).tolist()
    scale = head_scale(amax)
    codec = layer_codecs("fp8_attn_head", scale, scale).key
    y = codec.roundtrip(x)
    for h in range(3):
        assert ((y[:, h] - x[:, h]).abs() <= x[:, h].abs() / 16 + scale.scales[h] * 2.0 ** -9).all()
    shared = quant.fake_quantize(x, "fp8", max(amax) / 448)  # one per-tensor scale: the quiet heads lose their bits
    assert (y[:, 0] - x[:, 0]).abs().mean() < (shared[:, 0] - x[:, 0]).abs().mean()


def test_four_over_six_never_reconstructs_a_block_worse_than_plain_amax_over_6() -> None:
    x = _x(2, 2, 64, 64, seed=3)
    gs = float(x.abs().max()) / 448
    codes, scale = nvfp4_4over6_quantize(x, gs)
    six_codes, six_scale = nvfp4_quantize(x, gs)
    err = ((nvfp4_dequantize(codes, scale, gs, torch.float32) - x) ** 2).reshape(2, 2, 64, 4, 16).sum(-1)
    err6 = ((nvfp4_dequantize(six_codes, six_scale, gs, torch.float32) - x) ** 2).reshape(2, 2, 64, 4, 16).sum(-1)
    assert (err <= err6).all() and (err < err6).any()
    four = scale.float() != six_scale.float()
    assert 0 < four.float().mean() < 1  # some blocks pick amax/4, some keep amax/6
    blocks = x.reshape(2, 2, 64, 4, 16)
    assert (blocks.abs().amax(-1)[four] / (scale.float()[four] * gs) <= 4 * 1.07).all()  # amax/4: top code 4, E4M3 error


def test_modelopt_hadamard_is_orthonormal_and_keeps_q_dot_k() -> None:
    for d in (64, 96):  # 96: blocks of 32 (its largest power-of-two divisor)
        eye = modelopt_hadamard(torch.eye(d))
        assert torch.allclose(eye @ eye.T, torch.eye(d), atol=1e-6)
        assert torch.allclose(modelopt_hadamard(modelopt_hadamard(_x(5, d))), _x(5, d), atol=1e-5)
        q, k = _x(7, d, seed=1), _x(9, d, seed=2)
        assert torch.allclose(modelopt_hadamard(q) @ modelopt_hadamard(k).T, q @ k.T, atol=1e-4)


def test_nvfp4_rotate_attends_as_modelopt_rotating_q_and_k() -> None:
    """trtkv rotates the dequantized K back; ModelOpt rotates Q instead: the same logits within float rounding."""
    q, k = _x(1, 2, 8, 64, seed=4), _x(1, 2, 40, 64, seed=5, scale=3.0)
    amax = float(modelopt_hadamard(k).abs().max())
    mine = q @ layer_codecs("nvfp4_rotate", amax, 1.0).key.roundtrip(k).transpose(-1, -2)
    theirs = modelopt_hadamard(q) @ modelopt_fake_quant(modelopt_hadamard(k), amax).transpose(-1, -2)
    assert torch.allclose(mine, theirs, atol=1e-4)


def test_modelopt_nvfp4_round_trip_bounds() -> None:
    x = _x(1, 2, 32, 64, seed=6)
    amax = float(x.abs().max())
    y = modelopt_fake_quant(x, amax)
    blocks, yb = x.reshape(-1, 16), y.reshape(-1, 16)
    step = (yb.abs().amax(-1, keepdim=True) / 6).clamp(min=1e-12)
    assert ((yb - blocks).abs() <= blocks.abs().amax(-1, keepdim=True) * (1 / 6 + 1 / 16) + 1e-7).all()  # E2M1 + E4M3
    assert (yb.abs() <= 6 * step * (1 + 1e-6)).all()
    cast = quant.fake_quantize(_x(1, 1, 4, 16) * 1000, "nvfp4_cast")
    assert cast.abs().max() <= 448 * (1 + 1e-6)  # the constant amax 448: block scales saturate at E4M3's 448


@pytest.fixture(scope="module")
def tiny_run() -> dict[str, float]:
    """A short probe-style pass on a tiny random Llama: calibrate on random ids, then each format's KL to fp32."""
    torch.manual_seed(0)
    model = tiny_llama(2, 2, 64, max_positions=512)
    gen = torch.Generator().manual_seed(1)
    stats = collect_kv_stats(model, [torch.randint(0, 96, (2, 128), generator=gen) for _ in range(2)])
    scales = KVScales(k_amax=stats.k_amax, v_amax=stats.v_amax, source="test", stats=stats, affine=stats.affine,
                      k_head_amax=stats.k_head_amax, v_head_amax=stats.v_head_amax, k_rotated_amax=stats.k_rotated_amax)
    ids = torch.randint(0, 96, (1, 256), generator=gen)
    with torch.inference_mode():
        ref = model(ids).logits.log_softmax(-1)
        out = {}
        for name in ["fp8", "nvfp4", *NEW]:
            ks, vs = scales.for_format(name)
            cache = QuantizedKVCache(model.config, name, ks, vs)
            logp = model(ids, past_key_values=cache, use_cache=True).logits.log_softmax(-1)
            out[name] = float((ref.exp() * (ref - logp)).sum(-1).mean())
    print("tiny-model KL:", {k: f"{v:.3g}" for k, v in out.items()})
    return out


def test_new_formats_run_in_the_probe_cache_on_a_tiny_model(tiny_run: dict[str, float]) -> None:
    assert all(math.isfinite(v) and v >= 0 for v in tiny_run.values())
    assert tiny_run["fp8_attn_head"] <= tiny_run["fp8"] * 1.5  # per-head scales: no worse than one per tensor
    assert tiny_run["nvfp4_4over6"] <= tiny_run["nvfp4"] * 1.05
    assert max(tiny_run[n] for n in ("fp8", "fp8_e5m2", "fp8_attn_head")) < min(
        tiny_run[n] for n in ("nvfp4", "nvfp4_4over6", "nvfp4_rotate", "nvfp4_cast"))  # 8 bits beat 4


@pytest.mark.e2e
def test_modelopt_nvfp4_matches_modelopts_own_triton_functions(tmp_path: Path) -> None:
    """nvfp4_cast (amax 448) and nvfp4_rotate's quantizer (a calibrated amax) bit for bit against ModelOpt's
    fp8_quantize_scale / fp4_round_magnitude under TRITON_INTERPRET=1 (tiny blocks hit the 1e-5 step floor)."""
    import modelopt

    side = ROOT / ".venv-vllm" / "bin" / "python"
    if not side.is_file():
        pytest.fail(f"{side} is missing: `make install-vllm` installs triton there")
    x = torch.cat([_x(30, 64, seed=7), _x(2, 64, seed=8) * 1e-6, torch.full((1, 64), 0.0)]).contiguous()
    x[3, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) / 6 * 3.0  # E2M1 ties
    amaxes = np.array([448.0, float(x.abs().max()), float(x.abs().max()) / 3], np.float32)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "amax.npy", amaxes)
    kernels = Path(modelopt.__file__).parent / "torch" / "kernels" / "quantization"
    proc = subprocess.run([str(side), str(HERE / "modelopt_fp4_reference.py"), str(kernels), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for i, amax in enumerate(amaxes):
        ref = torch.from_numpy(np.load(tmp_path / f"out_{i}.npy"))
        mine = modelopt_fake_quant(x, float(amax))
        assert torch.equal(mine, ref), (i, (mine - ref).abs().max())
    cast = layer_codecs("nvfp4_cast").key.roundtrip(x.view(1, 1, *x.shape))[0, 0]
    assert torch.equal(cast, torch.from_numpy(np.load(tmp_path / "out_0.npy")))


def test_nvfp4_global_is_trtllms_amax_over_448_and_nvfp4_cast_modelopts_fake_quant_one_sixth() -> None:
    """On a known amax (448): nvfp4's global is the checkpoint k_scale TensorRT-LLM reads as is (ModelOpt 0.47 exports
    amax / 448 = 1.0); nvfp4_cast's is ModelOpt's fake-quant global amax / (6 x 448) = 1/6 for its constant amax 448.
    The same block (amax 6) thus stores block scale 1.0 under nvfp4 and 6.0 under nvfp4_cast, decoding alike."""
    from trtkv.kvcache.codecs import layer_codecs
    from trtkv.kvcache.variants import ModelOptNVFP4Codec, modelopt_global_scale

    scales = KVScales(k_amax=[448.0], v_amax=[26.88], source="known amax")
    ks, vs = scales.for_format("nvfp4")
    assert ks is not None and vs is not None
    trt = layer_codecs("nvfp4", ks[0], vs[0])
    assert trt.key.scale == 1.0 and trt.value.scale == pytest.approx(26.88 / 448)  # type: ignore[attr-defined]
    assert scales.for_format("nvfp4_cast") == (None, None)  # nothing calibrated: the constant amax
    cast = layer_codecs("nvfp4_cast")
    assert isinstance(cast.key, ModelOptNVFP4Codec) and cast.key.amax == 448.0
    assert modelopt_global_scale(448.0) == pytest.approx(1 / 6) and modelopt_global_scale(26.88) == pytest.approx(0.01)
    x = torch.linspace(-6.0, 6.0, 16).reshape(1, 1, 1, 16)
    trt_parts, cast_parts = trt.key.encode(x), cast.key.encode(x)
    assert float(trt_parts["scale"].float().max()) == 1.0 and float(cast_parts["scale"].float().max()) == 6.0
    assert torch.equal(trt.key.decode(trt_parts, torch.float32), cast.key.decode(cast_parts, torch.float32))
