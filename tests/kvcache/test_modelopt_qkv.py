"""trtkv's FP8 Q/K/V of the engine attention modes against an independent implementation: ModelOpt's attention
quantizers (`*q_bmm_quantizer`, `*k_bmm_quantizer`, `*v_bmm_quantizer`, FP8 E4M3 per tensor, fake-quant mode on the
CPU) on the same model and text.

Tolerances follow from the formats: both sides put values on the same E4M3 grid (x / (amax/448), round to nearest even,
saturate), so the codes are equal and the dequantized Q/K/V differ only by float32 rounding of the scale and of the
cache's code x scale (2^-24 relative each), except where x / scale sits within float32 roundoff of the midpoint between
two codes (there the sides may round apart by one code); the logits of a shallow model by that roundoff after it.
ModelOpt's p_bmm_quantizer runs only in its CUDA Triton kernel: P is checked by benchmarks/gpu_probe_check.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.support.models import tiny_llama
from trtkv.kvcache.attention import quantize_q
from trtkv.kvcache.attention_hook import EngineRun, engine_attention
from trtkv.kvcache.attention_modes import load_attention
from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.codecs import StaticCodec

QKV = ("q_bmm_quantizer", "k_bmm_quantizer", "v_bmm_quantizer")
F32_ROUNDOFF = 2.0 ** -24


def _modelopt_fp8_qkv(model, ids: torch.Tensor) -> dict[str, float]:  # noqa: ANN001
    """Quantize `model` in place with ModelOpt's FP8 Q/K/V attention quantizers (max calibration on `ids`); their
    amaxes by module name."""
    import modelopt.torch.quantization as mtq

    cfg = {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                         {"quantizer_name": "*[qkv]_bmm_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}}],
           "algorithm": "max"}
    mtq.quantize(model, cfg, lambda m: m(ids))
    return {n: float(mod.amax) for n, mod in model.named_modules() if n.endswith(QKV)}


def _qkv_mode():  # noqa: ANN202
    """FP8 Q (q_scale) over an FP8 cache, P unquantized: the part of an engine mode ModelOpt's CPU quantizers check."""
    fa3 = load_attention().mode("vllm_fa3_fp8")
    kernel = dataclasses.replace(fa3.prefill, p="none")
    return dataclasses.replace(fa3, prefill=kernel, decode=kernel)


def _same_grid(name: str, got: torch.Tensor, out: torch.Tensor, x: torch.Tensor, scale: float) -> None:
    """got and ModelOpt's out hold the same E4M3 codes: equal to float32 roundoff (the scale's and code x scale's: up to
    4 roundings per side), except where x / scale lies within float32 roundoff (2^-22, relative) of the midpoint
    between two codes, which either side may round either way: there they are one code apart."""
    got = got.to(out.dtype)
    close = torch.isclose(got, out, rtol=8 * F32_ROUNDOFF, atol=0)
    if bool(close.all()):
        return
    a, b = (got[~close] / scale).abs(), (out[~close] / scale).abs()
    mid = (a + b) / 2
    at_midpoint = ((x[~close] / scale).abs() - mid).abs() <= 2.0 ** -22 * mid
    one_step = (a - b).abs() <= 2.0 ** -3 * torch.maximum(a, b)  # E4M3: 3 mantissa bits
    assert bool((at_midpoint & one_step).all()), (name, (got - out).abs().max())
    assert (~close).sum() <= 1e-4 * close.numel(), (name, int((~close).sum()))  # ~2^-22 / 2^-4 per element


def _compare(model, reference, ids: torch.Tensor, end_to_end: bool = True) -> None:  # noqa: ANN001
    """Per layer on ModelOpt's own inputs; then (a model shallow enough that no rounding midpoint is met on the way)
    the whole model's logits."""
    amax = _modelopt_fp8_qkv(model, ids)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [mod.register_forward_hook(lambda mod, inp, out, n=n: seen.__setitem__(n, (inp[0], out)))
             for n, mod in model.named_modules() if n.endswith(QKV)]
    with torch.no_grad():
        want = model(ids).logits
    for h in hooks:
        h.remove()
    kernel = _qkv_mode().prefill
    for name, (x, out) in seen.items():
        scale = amax[name] / 448.0
        got = quantize_q(x, kernel, scale) if name.endswith("q_bmm_quantizer") else StaticCodec(scale).roundtrip(x)
        _same_grid(name, got, out, x, scale)
    if not end_to_end:
        return
    layers = model.config.num_hidden_layers
    k = [amax[f"model.layers.{i}.self_attn.k_bmm_quantizer"] / 448.0 for i in range(layers)]
    v = [amax[f"model.layers.{i}.self_attn.v_bmm_quantizer"] / 448.0 for i in range(layers)]
    q = [amax[f"model.layers.{i}.self_attn.q_bmm_quantizer"] / 448.0 for i in range(layers)]
    cache = QuantizedKVCache(reference.config, "fp8", k, v)
    with torch.inference_mode(), engine_attention(reference, EngineRun(_qkv_mode(), cache, 0, q)):
        got = reference(ids, past_key_values=cache, use_cache=True).logits
    # float64 models: the only difference left is the cache's float32 dequantization (2^-24 relative per K/V value)
    assert (got - want).abs().max() < 1e-5 * want.abs().max(), (got - want).abs().max()


def test_fp8_qkv_equal_modelopts_quantizers_on_a_tiny_model() -> None:
    model = tiny_llama(2, 2, 64, 512, seed=3).double()
    reference = tiny_llama(2, 2, 64, 512, seed=3).double()
    for m in (model, reference):
        m.config._attn_implementation = "eager"
    ids = torch.randint(0, 96, (1, 120), generator=torch.Generator().manual_seed(1))
    _compare(model, reference, ids)


@pytest.mark.e2e  # loads SmolLM2: not in `make check`
@pytest.mark.slow
def test_fp8_qkv_equal_modelopts_quantizers_on_smollm2(smollm2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtkv.core.texts import eval_long_text

    def load():  # noqa: ANN202
        m = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float64).eval()
        m.config._attn_implementation = "eager"
        return m

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    ids = torch.tensor([tok(eval_long_text()[0], add_special_tokens=False).input_ids[:256]])
    _compare(load(), load(), ids, end_to_end=False)  # 30 layers: a midpoint met early changes all after it
