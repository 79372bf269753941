"""Engine attention numerics (trtkv.kvcache.attention): the tiled FP8-P softmax equals the kernels' loop, the
cache-only kernel equals SDPA, and the drift between prefill and decode kernels is nonzero for FP8 attention whose
tiles differ and exactly zero for cache-only attention."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tests.support.models import tiny_llama
from trtkv.kvcache.attention import fp8_e4m3, kernel_attention
from trtkv.kvcache.attention_hook import EngineRun, engine_attention, q_scales_for
from trtkv.kvcache.attention_modes import CACHE_ONLY, load_attention
from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.probe.attention import attending, drift, drift_pass


def _loop_attention(q, k, v, allowed, scaling, tile, order, p_scale, first_pos):  # noqa: ANN001, ANN202
    """The kernels' loop, one query row and one head at a time (TensorRT-LLM's refFlashAttention / FA3's mainloop):
    tiles of `tile` absolute positions in `order`, running max, P x p_scale cast to E4M3, unquantized row sum."""
    hq, t, d = q.shape
    group = hq // k.shape[0]
    length = k.shape[1]
    out = torch.zeros(hq, t, d, dtype=torch.float64)
    n0 = first_pos // tile
    n1 = (first_pos + length - 1) // tile
    tiles = list(range(n0, n1 + 1))
    if order == "last_to_first":
        tiles.reverse()
    for h in range(hq):
        kh, vh = k[h // group].double(), v[h // group].double()
        for r in range(t):
            s = (kh @ q[h, r].double()) * scaling
            s[~allowed[r]] = -math.inf
            m, acc, total = -math.inf, torch.zeros(d, dtype=torch.float64), 0.0
            for j in tiles:
                lo, hi = max(j * tile - first_pos, 0), min((j + 1) * tile - first_pos, length)
                st = s[lo:hi]
                new = max(m, float(st.max()))
                if new == -math.inf:
                    continue
                corr = math.exp(m - new) if m != -math.inf else 0.0
                p = torch.exp(st - new)
                pq = fp8_e4m3((p * p_scale).float()).double() / p_scale
                acc = acc * corr + pq @ vh[lo:hi]
                total = total * corr + float(p.sum())
                m = new
            out[h, r] = acc / total
    return out


@pytest.mark.parametrize("order", ["first_to_last", "last_to_first"])
def test_tiled_fp8_softmax_equals_the_kernels_loop(order: str) -> None:
    torch.manual_seed(1)
    hq, hkv, t, length, d, tile, first = 4, 2, 5, 70, 16, 16, 37  # keys start mid-tile (a sliding layer's keys)
    q, k, v = torch.randn(1, hq, t, d) * 2, torch.randn(1, hkv, length, d), torch.randn(1, hkv, length, d)
    allowed = torch.ones(t, length, dtype=torch.bool).tril(length - t)
    allowed[:, :3] = False  # a window's left edge
    mode = load_attention().mode("vllm_fa3_fp8").prefill
    kernel = mode.__class__(**{**vars(mode), "tile_order": order, "q": "none"})
    got = kernel_attention(q, k, v, allowed[None, None], d ** -0.5, kernel, 1.0, first, tile)[0]
    want = _loop_attention(q[0], k[0], v[0], allowed, d ** -0.5, tile, order, kernel.p_scale, first)
    # float32 vs float64 of the same FP8 grid: a P element on a rounding boundary could flip one E4M3 step (2^-3
    # relative); none does here, so the float32 accumulation error (~1e-6) is all that is left
    assert torch.allclose(got.double(), want, atol=1e-5), (got.double() - want).abs().max()


def test_fp8_grid_is_torchs_saturating_cast() -> None:
    x = torch.tensor([0.0, 1e-4, 2.0 ** -9, 0.3, 15.5, 447.9, 448.0, 463.0, 465.0, 1e6, -1e6, -0.3])
    assert torch.equal(fp8_e4m3(x), x.clamp(-448, 448).to(torch.float8_e4m3fn).float())
    assert fp8_e4m3(torch.tensor([1e6])).item() == 448.0  # satfinite, not NaN


def _model(head_dim: int):  # noqa: ANN202
    model = tiny_llama(2, 2, head_dim, 1024, seed=3).float()
    model.config._attn_implementation = "sdpa"
    return model


def _fp8_cache(model):  # noqa: ANN001, ANN202
    return QuantizedKVCache(model.config, "fp8_scale1", [1.0, 1.0], [1.0, 1.0])


def test_cache_only_kernel_equals_sdpa_over_the_same_cache() -> None:
    model = _model(64)
    ids = torch.randint(0, 96, (1, 90), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        base = model(ids, past_key_values=_fp8_cache(model), use_cache=True).logits
        cache = _fp8_cache(model)
        run = EngineRun(load_attention().mode("trtllm_fp8_fmha"), cache, 0, q_scales_for(cache, load_attention().mode(
            "trtllm_fp8_fmha")))
        with engine_attention(model, run):  # its decode kernel: FP8 cache read into float attention, no Q/P quant
            got = model(ids, past_key_values=cache, use_cache=True).logits
    assert model.config._attn_implementation == "sdpa"  # restored
    assert torch.allclose(base, got, atol=1e-5)


def _loaded(model, n: int = 160):  # noqa: ANN001, ANN202
    ids = torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(5)).tolist()
    return SimpleNamespace(model=model, text_ids=ids, device=torch.device("cpu"), info={"head_dim": 128})


def test_drift_is_nonzero_for_fp8_attention_and_exactly_zero_cache_only() -> None:
    model = _model(128)  # FA3's FP8 tiles at head_dim 128: 192 keys in prefill, 96 in decode
    loaded = _loaded(model, 300)
    mode = load_attention().mode("vllm_fa3_fp8")
    assert mode.drifts(128) and not load_attention().mode(CACHE_ONLY).drifts(128)
    fa3 = drift(loaded, lambda: _fp8_cache(model), "vllm_fa3_fp8", 200, 40)
    only = drift(loaded, lambda: _fp8_cache(model), CACHE_ONLY, 200, 40)
    assert fa3["mean_abs_dlogp"] > 0 and not fa3["exact_zero"]
    assert only["exact_zero"] and only["mean_abs_dlogp"] == 0.0 and only["kl_mean"] == 0.0


def test_one_pass_with_decode_rows_equals_token_by_token_decoding() -> None:
    """The drift's construction: rows from `decode_from` on through the decode kernel in one causal pass compute what
    feeding those tokens one at a time through the decode kernel computes."""
    model = _model(128).double()  # float64: an FP8 rounding boundary is never crossed by summation order alone
    loaded = _loaded(model, 240)
    prompt, steps = 200, 12
    ids = torch.tensor([loaded.text_ids[: prompt + steps]])
    one_pass = drift_pass(loaded, lambda: _fp8_cache(model), "vllm_fa3_fp8", ids, prompt, None)
    cache = _fp8_cache(model)
    rows = []
    with torch.inference_mode():
        with attending(loaded, "vllm_fa3_fp8", cache, None):
            model.model(input_ids=ids[:, :prompt], past_key_values=cache, use_cache=True)
        for i in range(prompt, prompt + steps):
            with attending(loaded, "vllm_fa3_fp8", cache, 0):
                h = model.model(input_ids=ids[:, i: i + 1], past_key_values=cache, use_cache=True).last_hidden_state
            rows.append(torch.log_softmax(model.lm_head(h[0]).double(), -1))
    stepped = torch.cat(rows)
    # the same FP8 grids on the same values; float64 sums of one row vs many rows differ in the last bits only (in
    # float32 they reach an E4M3 rounding boundary now and then, and one E4M3 step is 2^-3 of a value)
    assert torch.allclose(one_pass, stepped, rtol=0, atol=1e-9), (one_pass - stepped).abs().max()
