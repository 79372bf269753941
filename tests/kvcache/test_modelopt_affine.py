"""ModelOpt's fp8_affine KV format: trtkv's calibration and codec against ModelOpt 0.47's own quantizers on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.support.models import tiny_llama
from trtkv.core.errors import StageError, TrtkvError
from trtkv.kvcache.affine import AffineCalibration, AffineCollector
from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.codecs import layer_codecs
from trtkv.kvcache.formats import affine_bias_bytes, kv_bytes_per_token
from trtkv.kvcache.names import parse_format
from trtkv.kvcache.numerics import AffineScale
from trtkv.kvcache.scales import KVScales
from trtkv.kvcache.stats import collect_kv_stats

mtq = pytest.importorskip("modelopt.torch.quantization")
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 64


def _affine_cfg() -> dict:
    """ModelOpt's fp8_affine KV entries (KV_QUANT_CFG_CHOICES) on a config that quantizes nothing else."""
    from modelopt.recipe.presets import KV_QUANT_CFG_CHOICES

    return {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                          *copy.deepcopy(KV_QUANT_CFG_CHOICES["fp8_affine"]["quant_cfg"])], "algorithm": "max"}


def _quantizer():  # noqa: ANN202 - a ModelOpt TensorQuantizer
    """A TensorQuantizer with the fp8_affine entry's own attributes (the last entry wins in ModelOpt too)."""
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    cfg = _affine_cfg()["quant_cfg"][-1]["cfg"]
    assert cfg["bias"] == {-2: None, -4: None, "type": "static"} and cfg["num_bits"] == (4, 3)
    return TensorQuantizer(QuantizerAttributeConfig(**cfg))


def _batches(n: int = 3) -> list[torch.Tensor]:
    """Random [batch, kv_heads, tokens, head_dim] batches with a per-channel offset that drifts from batch to batch."""
    g = torch.Generator().manual_seed(28)
    offset = torch.randn(1, 3, 1, 32, generator=g) * 4
    return [torch.randn(4, 3, 48, 32, generator=g) * (n - i) + offset * (1 + 0.5 * i) for i in range(n)]


def _steps(a: torch.Tensor, b: torch.Tensor, amax: float) -> float:
    """Largest |a - b| in E4M3 steps at the magnitude of a, in the scaled space of amax (448 / amax)."""
    scaled = (a.abs() * 448 / amax).clamp(min=2 ** -9)
    step = torch.exp2(torch.floor(torch.log2(scaled)) - 3).clamp(min=2 ** -9) * amax / 448
    return float(((a - b).abs() / step).max())


def test_bias_amax_and_values_equal_modelopts_tensor_quantizer() -> None:
    q = _quantizer()
    q.disable_quant()
    q.enable_calib()
    ours = AffineCollector()
    batches = _batches()
    for x in batches:
        q(x)
        ours.collect(x)
    q.load_calib_amax()
    q.load_calib_bias()
    q.disable_calib()
    q.enable_quant()
    amax, bias = ours.result()
    assert torch.equal(bias, q._bias_value.reshape(3, 32))
    assert amax == float(q.amax)
    final = max(float((x - q._bias_value).abs().max()) for x in batches)
    assert amax != final  # ModelOpt's amax is of x minus the running bias, not the final one
    codec = layer_codecs("fp8_affine", AffineScale(amax, bias), AffineScale(amax, bias)).key
    test = torch.cat([*batches, batches[-1] * 1.5])  # beyond the calibrated range too: both saturate at +-448
    theirs = q(test)
    mine = codec.roundtrip(test)
    assert torch.equal(mine, theirs), _steps(theirs, mine, amax)
    assert int(codec.beyond(test).sum()) > 0


def test_bias_keeps_the_model_dtype_as_modelopt_does() -> None:
    q = _quantizer()
    q.disable_quant()
    q.enable_calib()
    ours = AffineCollector()
    for x in _batches():
        x = x.to(torch.bfloat16)
        q(x)
        ours.collect(x)
    q.load_calib_amax()
    q.load_calib_bias()
    amax, bias = ours.result()
    assert bias.dtype == torch.bfloat16 and torch.equal(bias, q._bias_value.reshape(3, 32))
    assert amax == float(q.amax)


@pytest.fixture(scope="module")
def tiny() -> LlamaForCausalLM:
    model = tiny_llama(LAYERS, KV_HEADS, HEAD_DIM, max_positions=512)
    with torch.no_grad():  # K and V with a per-channel offset, as real models have: the bias then matters
        model.model.layers[0].self_attn.k_proj.bias = torch.nn.Parameter(torch.randn(KV_HEADS * HEAD_DIM) * 2)
        model.model.layers[1].self_attn.v_proj.bias = torch.nn.Parameter(torch.randn(KV_HEADS * HEAD_DIM))
    return model


def _ids(n: int, batch: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 96, (batch, n), generator=torch.Generator().manual_seed(seed))


def test_calibration_and_attention_equal_mtq_quantize_on_a_tiny_llama(tiny: LlamaForCausalLM) -> None:
    batches = [_ids(40, 2, s) for s in range(3)]
    ours = collect_kv_stats(tiny, batches).affine
    assert ours is not None and ours.batches == 3
    ref = copy.deepcopy(tiny)

    def forward(m: torch.nn.Module) -> None:
        with torch.no_grad():
            for ids in batches:
                m(input_ids=ids)

    mtq.quantize(ref, _affine_cfg(), forward)
    for i, layer in enumerate(ref.model.layers):
        attn = layer.self_attn
        for role, q in (("k", attn.k_bmm_quantizer), ("v", attn.v_bmm_quantizer)):
            bias = (ours.k_bias if role == "k" else ours.v_bias)[i]
            amax = (ours.k_amax if role == "k" else ours.v_amax)[i]
            assert q._bias_value.shape == (1, KV_HEADS, 1, HEAD_DIM)
            assert torch.allclose(bias, q._bias_value.reshape(KV_HEADS, HEAD_DIM), rtol=0, atol=1e-6), (i, role)
            assert amax == pytest.approx(float(q.amax), rel=1e-6), (i, role)
    ks, vs = ours.scales()
    ids = _ids(100, 1, 9)
    with torch.no_grad():
        expected = ref(input_ids=ids, use_cache=False).logits  # ModelOpt's fake-quantized K and V
        cache = QuantizedKVCache(tiny.config, "fp8_affine", ks, vs)
        got = tiny(input_ids=ids, past_key_values=cache, use_cache=True).logits
        plain = tiny(input_ids=ids, use_cache=False).logits
    assert float((got - expected).abs().max()) < 1e-4
    assert float((plain - expected).abs().max()) > 100 * float((got - expected).abs().max())


def test_fp8_affine_stores_one_byte_per_element_and_its_bias_once_per_layer(tiny: LlamaForCausalLM) -> None:
    cal = collect_kv_stats(tiny, [_ids(32, 2, 1)]).affine
    assert cal is not None
    ks, vs = cal.scales()
    cache = QuantizedKVCache(tiny.config, "fp8_affine", ks, vs)
    with torch.no_grad():
        tiny(input_ids=_ids(300, 1, 2), past_key_values=cache, use_cache=True)
    assert cache.bytes_per_token() == kv_bytes_per_token(LAYERS, KV_HEADS, HEAD_DIM, parse_format("fp8_affine").base)
    assert cache.bytes_per_token() == 2 * LAYERS * KV_HEADS * HEAD_DIM
    fixed = cache.stored_bytes() - cache.quantized_bytes()
    assert fixed == affine_bias_bytes(LAYERS, KV_HEADS, HEAD_DIM) + 2 * LAYERS * 4  # + one float32 amax each


def test_fp8_affine_needs_its_bias() -> None:
    scales = KVScales(k_amax=[1.0], v_amax=[1.0], source="kv_scales.json")
    with pytest.raises(StageError, match="bias"):
        scales.for_format("fp8_affine")
    with pytest.raises(TrtkvError, match="AffineScale"):
        layer_codecs("fp8_affine", 0.01, 0.01)


def test_the_calibration_round_trips_through_json_exactly() -> None:
    keys, values = AffineCollector(), AffineCollector()
    for x in _batches(2):
        keys.collect(x)
        values.collect(-x)
    cal = AffineCalibration.from_collectors([keys], [values])
    back = AffineCalibration.from_dict(cal.to_dict())
    assert back.k_amax == cal.k_amax and back.v_amax == cal.v_amax and back.batches == 2
    assert torch.equal(back.k_bias[0], cal.k_bias[0]) and torch.equal(back.v_bias[0], cal.v_bias[0])
