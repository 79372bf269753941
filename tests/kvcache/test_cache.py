"""QuantizedKVCache on a tiny random Llama: bytes vs the planner's formula, decode semantics, generate()."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM

from tests.support.models import tiny_llama
from trtkv.core.errors import TrtkvError
from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.formats import KVFormat, kv_bytes_per_token

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 64
SCALES = [0.05] * LAYERS


@pytest.fixture(scope="module")
def tiny() -> LlamaForCausalLM:
    return tiny_llama(LAYERS, KV_HEADS, HEAD_DIM, max_positions=2048)


def _cache(model: LlamaForCausalLM, fmt: str, **kw) -> QuantizedKVCache:
    static = fmt in ("fp8", "int8", "int8_split", "nvfp4")
    return QuantizedKVCache(model.config, fmt, SCALES if static else None, SCALES if static else None, **kw)


def _ids(n: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 96, (batch, n), generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("fmt", [f.value for f in KVFormat])
def test_stored_bytes_per_token_match_formula(tiny: LlamaForCausalLM, fmt: str) -> None:
    cache = _cache(tiny, fmt)
    with torch.inference_mode():
        tiny(input_ids=_ids(500), past_key_values=cache, use_cache=True)
        for _ in range(12):  # decode steps append to the same store
            tiny(input_ids=_ids(1), past_key_values=cache, use_cache=True)
    formula = kv_bytes_per_token(LAYERS, KV_HEADS, HEAD_DIM, fmt)
    assert cache.get_seq_length() == 512
    if fmt.startswith("kivi"):
        # KIVI: the fp16 window (tokens since the last 128-token flush) is a fixed cost outside the formula
        assert cache.quantized_tokens() == 512 and cache.residual_bytes() == 0
    else:
        assert cache.quantized_tokens() == 512
    assert cache.bytes_per_token() == pytest.approx(formula, rel=0.01)
    per_token_all = cache.stored_bytes() / cache.get_seq_length()
    assert per_token_all == pytest.approx(formula, rel=0.01)
    assert cache.allocated_bytes() <= cache.stored_bytes() * 1.3  # storage grows in 256-token blocks


def test_storage_dtypes_are_really_quantized(tiny: LlamaForCausalLM) -> None:
    want = {"fp8": torch.float8_e4m3fn, "int8": torch.int8, "int8_token": torch.int8, "int4_g64": torch.uint8,
            "kivi2": torch.uint8, "fp16": torch.float16, "bf16": torch.bfloat16}
    for fmt, dtype in want.items():
        cache = _cache(tiny, fmt)
        with torch.inference_mode():
            tiny(input_ids=_ids(256), past_key_values=cache, use_cache=True)
        parts = cache.layers[0].k_store.view()
        assert parts["data"].dtype == dtype, fmt
        assert all(p.dtype == torch.float16 for k, p in parts.items() if k != "data"), fmt
    packed = _cache(tiny, "kivi2")
    with torch.inference_mode():
        tiny(input_ids=_ids(256), past_key_values=packed, use_cache=True)
    assert packed.layers[0].k_store.view()["data"].shape[-1] == HEAD_DIM // 4  # four 2-bit codes per byte


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int8_token", "int4_g32", "kivi4"])
def test_prefill_matches_token_by_token_decode(tiny: LlamaForCausalLM, fmt: str) -> None:
    """The probe's claim: one pass (per-token formats) or window-aligned chunks (KIVI) == decoding token by token."""
    from trtkv.kvcache.names import parse_format
    from trtkv.probe.measure import chunk_for
    from trtkv.probe.passes import feed

    ids = _ids(200)
    one = _cache(tiny, fmt)
    hidden = feed(tiny, ids, one, chunk_for(parse_format(fmt)))
    step = _cache(tiny, fmt)
    outs = []
    with torch.inference_mode():
        for t in range(ids.shape[1]):
            outs.append(tiny.model(input_ids=ids[:, t: t + 1], past_key_values=step, use_cache=True).last_hidden_state)
        exact = tiny.model(input_ids=ids, past_key_values=DynamicCache(config=tiny.config), use_cache=True)
    decoded = torch.cat(outs, dim=1)
    # The two paths project K/V with different matmul shapes, so float32 rounding differs (by CPU: AVX2 vs AVX-512)
    # and a value next to a quantization boundary can land on the neighbouring code: one step of the format. The
    # tolerance follows the format: the paths may differ by a small fraction of the format's own error against an
    # unquantized cache, never by float32 noise alone being required to match. (The cache itself is path-exact:
    # test_cache_stores_the_same_codes_at_once_or_token_by_token.)
    format_error = (hidden - exact.last_hidden_state).abs().max().item()
    path_error = (hidden - decoded).abs().max().item()
    assert format_error > 0
    assert path_error <= 0.1 * format_error + 1e-5, (path_error, format_error)


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int8_token", "int4_g32"])
def test_cache_stores_the_same_codes_at_once_or_token_by_token(tiny: LlamaForCausalLM, fmt: str) -> None:
    """Given the same K/V, storing them in one update or one token at a time (KIVI: window-aligned chunks) gives
    bit-identical dequantized K/V: the per-token quantization does not depend on how tokens arrive. (KIVI's view
    depends on its window by design; the model-level test above covers its window-aligned chunks.)"""
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(1, KV_HEADS, 256, HEAD_DIM, generator=gen)
    v = torch.randn(1, KV_HEADS, 256, HEAD_DIM, generator=gen) * 0.1
    want = _cache(tiny, fmt).update(k, v, 0)
    piecewise = _cache(tiny, fmt)
    for t in range(256):
        got = piecewise.update(k[:, :, t: t + 1], v[:, :, t: t + 1], 0)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_fp16_cache_is_exact_on_fp16_model(tiny: LlamaForCausalLM) -> None:
    model = LlamaForCausalLM(tiny.config).to(torch.float16).eval()
    model.load_state_dict({k: v.half() for k, v in tiny.state_dict().items()})
    ids = _ids(40)
    with torch.inference_mode():
        want = model(input_ids=ids, past_key_values=DynamicCache(config=model.config), use_cache=True).logits
        got = model(input_ids=ids, past_key_values=QuantizedKVCache(model.config, "fp16"), use_cache=True).logits
    assert torch.equal(want, got)


@pytest.mark.parametrize("fmt", ["int8", "int4_g64", "kivi2"])
def test_generate_accepts_the_cache(tiny: LlamaForCausalLM, fmt: str) -> None:
    cache = _cache(tiny, fmt)
    ids = _ids(20, batch=2)
    out = tiny.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=150,
                        min_new_tokens=150, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 170)
    assert cache.get_seq_length() == 169


def test_static_scales_clip_and_are_counted(tiny: LlamaForCausalLM) -> None:
    cache = QuantizedKVCache(tiny.config, "int8", [1e-4] * LAYERS, [1e-4] * LAYERS, record_positions=True)
    with torch.inference_mode():
        tiny(input_ids=_ids(64), past_key_values=cache, use_cache=True)
    stats = cache.clip_stats()
    assert stats["clip_rate"] > 0.5 and stats["elements"] == 2 * LAYERS * KV_HEADS * HEAD_DIM * 64
    per_pos = cache.clip_per_position()
    assert per_pos.shape == (64,) and int(per_pos.sum()) == stats["clipped"]


def test_batch_ops_and_crop(tiny: LlamaForCausalLM) -> None:
    cache = _cache(tiny, "int8_token")
    with torch.inference_mode():
        tiny(input_ids=_ids(10), past_key_values=cache, use_cache=True)
    before = cache.stored_bytes()
    cache.batch_repeat_interleave(3)
    assert cache.stored_bytes() == 3 * before
    cache.reorder_cache(torch.tensor([2, 0, 1]))
    cache.crop(6)
    assert cache.get_seq_length() == 6
    with pytest.raises(TrtkvError, match="KIVI"):
        kivi = _cache(tiny, "kivi4")
        with torch.inference_mode():
            tiny(input_ids=_ids(10), past_key_values=kivi, use_cache=True)
        kivi.crop(4)


def test_static_formats_need_scales(tiny: LlamaForCausalLM) -> None:
    with pytest.raises(TrtkvError, match="needs static per-layer"):
        QuantizedKVCache(tiny.config, "fp8")
    with pytest.raises(TrtkvError, match="one scale per layer"):
        QuantizedKVCache(tiny.config, "int8", [0.1], [0.1])
    QuantizedKVCache(tiny.config, "fp8_scale1")  # scale 1.0, no calibration needed


# ----------------------------------------------------------------------------- sliding-window layers (Gemma 3)


def _run_chunks(model, cache, ids: torch.Tensor, chunks: list[int]) -> torch.Tensor:  # noqa: ANN001
    """Logits of `ids` fed through `cache` in prompt chunks of the given sizes, then one token at a time."""
    out, pos = [], 0
    with torch.inference_mode():
        for n in chunks:
            out.append(model(input_ids=ids[:, pos: pos + n], past_key_values=cache, use_cache=True).logits)
            pos += n
        for t in range(pos, ids.shape[1]):
            out.append(model(input_ids=ids[:, t: t + 1], past_key_values=cache, use_cache=True).logits)
    return torch.cat(out, dim=1)


def test_config_layer_windows_follow_layer_types() -> None:
    from tests.support.tiny_gemma3 import tiny_gemma3
    from trtkv.kvcache.cache import config_layer_windows

    assert config_layer_windows(tiny_gemma3(window=6).config) == [6, 6, None, 6]
    assert config_layer_windows(tiny_llama(2, 2, 64, 64).config) == [None, None]


@pytest.mark.parametrize("fmt", ["fp16", "int8_token", "fp8"])
def test_sliding_layers_keep_only_their_window(fmt: str) -> None:
    """A sliding layer holds window - 1 tokens after each step (the engines' sliding KV), a full layer all of them;
    the old cache refused any model with sliding layers."""
    from tests.support.tiny_gemma3 import tiny_gemma3

    model = tiny_gemma3(window=6)
    scales = [0.05] * 4 if fmt == "fp8" else None
    cache = QuantizedKVCache(model.config, fmt, scales, scales)
    assert cache.is_sliding == [True, True, False, True] and cache.layer_windows == [6, 6, None, 6]
    _run_chunks(model, cache, _ids(40), [9, 7])
    assert cache.get_seq_length() == 40 and cache.stored_tokens() == [5, 5, 40, 5]
    full = QuantizedKVCache(model.config, fmt, scales, scales, layer_windows=[None] * 4)
    _run_chunks(model, full, _ids(40), [9, 7])
    assert full.stored_tokens() == [40] * 4 and cache.stored_bytes() < full.stored_bytes()
    assert cache.bytes_per_token() == pytest.approx(full.bytes_per_token())  # per token held, every layer


@pytest.mark.parametrize(("fmt", "window", "tokens"), [("fp16", 6, 30), ("kivi4", 40, 300)])
def test_window_trimming_changes_no_logit(fmt: str, window: int, tokens: int) -> None:
    """Keeping only the window gives the logits of keeping everything under the model's sliding mask (chunked
    prefill and decode alike); KIVI drops whole 32-token key groups and keeps its 128-token fp16 window."""
    from tests.support.tiny_gemma3 import tiny_gemma3

    model = tiny_gemma3(window=window)
    ids = _ids(tokens)
    chunks = [10, 7] if tokens < 100 else [150, 100]
    trimmed = QuantizedKVCache(model.config, fmt)
    kept = QuantizedKVCache(model.config, fmt, layer_windows=[None] * 4)
    a, b = _run_chunks(model, trimmed, ids, chunks), _run_chunks(model, kept, ids, chunks)
    # float32 sums run in another order; KIVI's 4-bit codes may flip on such differences (a lost token would be ~1)
    torch.testing.assert_close(a, b, atol=2e-3 if fmt.startswith("kivi") else 2e-4, rtol=0)
    with torch.inference_mode():
        reference = model(input_ids=ids).logits  # no cache: transformers' own sliding mask, float32
    assert (a - reference).abs().max() < (0.5 if fmt.startswith("kivi") else 5e-3)
    sliding, full = trimmed.qlayers[0], trimmed.qlayers[2]
    assert window - 1 <= sliding.stored_tokens + sliding._window()[0].shape[-2] < window - 1 + 32 + 128
    assert full.stored_tokens + full._window()[0].shape[-2] == tokens


def test_mask_sizes_match_transformers_sliding_layer() -> None:
    from transformers.cache_utils import DynamicSlidingWindowLayer

    from trtkv.kvcache.codecs import layer_codecs
    from trtkv.kvcache.quantized_layer import QuantizedKVLayer

    ours, theirs = QuantizedKVLayer(layer_codecs("fp16"), sliding_window=5), DynamicSlidingWindowLayer(5)
    for n in (3, 1, 4, 1, 1, 7, 1):
        assert ours.get_mask_sizes(n) == theirs.get_mask_sizes(n)
        k = torch.randn(1, 1, n, 8)
        got, want = ours.update(k, k), theirs.update(k, k)
        assert got[0].shape == want[0].shape
        torch.testing.assert_close(got[0].float(), want[0], atol=2e-3, rtol=1e-3)
    with pytest.raises(TrtkvError, match="sliding layer"):
        ours.crop(4)


@pytest.mark.parametrize(("fmt", "window"), [("fp8", None), ("int8_token", 6), ("nvfp4", None), ("kivi4", 40),
                                             ("int4_g64", 6)])
def test_keep_decoded_gives_the_same_keys_and_decodes_each_token_once(fmt: str, window: int | None) -> None:
    """keep_decoded (the reference runtime's cache) returns exactly the keys/values of decoding the whole store at
    every step, and decodes each stored token once instead of the whole context per step."""
    from tests.support.tiny_gemma3 import tiny_gemma3

    model = tiny_gemma3(window=window or 6)
    static = fmt in ("fp8", "nvfp4")
    scales = [0.05] * 4 if static else None
    windows = None if window else [None] * 4
    plain = QuantizedKVCache(model.config, fmt, scales, scales, layer_windows=windows)
    kept = QuantizedKVCache(model.config, fmt, scales, scales, layer_windows=windows, keep_decoded=True)
    layer = kept.qlayers[2]  # a full layer: its store grows with the context
    decoded_rows = [0]
    decode = layer.codecs.key.decode

    def counting(parts: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        out = decode(parts, dtype)
        decoded_rows[0] += out.shape[-2]
        return out

    layer.codecs.key.decode = counting  # type: ignore[method-assign]
    gen = torch.Generator().manual_seed(3)
    steps = [150, *([1] * 140)]  # a prefill, then decode steps (KIVI flushes its 128-token window in between)
    for n in steps:
        for i, (a, b) in enumerate(zip(plain.qlayers, kept.qlayers, strict=True)):
            k, v = torch.randn(1, 1, n, 16, generator=gen), torch.randn(1, 1, n, 16, generator=gen)
            got, want = b.update(k, v, i), a.update(k, v, i)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (fmt, i, n)
    assert layer.keep_decoded and decoded_rows[0] == layer.stored_tokens  # the old cache: ~stored x steps rows
    assert kept.stored_bytes() == plain.stored_bytes()


def test_keep_decoded_stays_off_where_decode_is_a_gemm() -> None:
    """TurboQuant's 4-bit keys decode through a GEMM with the Hadamard matrix, whose rows BLAS may sum in another
    order for another row count: those layers keep decoding the whole store."""
    from trtkv.kvcache.codecs import layer_codecs
    from trtkv.kvcache.quantized_layer import QuantizedKVLayer

    assert not QuantizedKVLayer(layer_codecs("turboquant_4bit_nc"), keep_decoded=True).keep_decoded
    assert QuantizedKVLayer(layer_codecs("turboquant_k8v4"), keep_decoded=True).keep_decoded  # FP8 keys


@pytest.mark.parametrize("fmt", ["fp8", "int8", "nvfp4", "int8_token", "fp8_affine", "kivi4", "fp16"])
def test_update_rows_equals_each_cache_updating_alone(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """update_rows (a decode step's new tokens of several sequences, one encode call) leaves every cache as its own
    update() would, bit for bit: returned K/V, stored codes, clip counts and observed maxima (KIVI, with its
    window, updates each cache on its own)."""
    from tests.support.tiny_gemma3 import tiny_gemma3
    from trtkv.kvcache import cache as cache_module
    from trtkv.kvcache.cache import update_rows
    from trtkv.kvcache.numerics import AffineScale

    batched = [0]
    encode_rows = cache_module.encode_rows

    def counting(layer, k, v, dtype, split=True):  # noqa: ANN001, ANN202
        batched[0] += split and k.shape[0] > 1
        return encode_rows(layer, k, v, dtype, split)

    monkeypatch.setattr(cache_module, "encode_rows", counting)

    model = tiny_gemma3(window=6)
    scales: list | None = [0.004] * 4 if fmt in ("fp8", "int8", "nvfp4") else None  # small: some elements clip
    if fmt == "fp8_affine":
        scales = [AffineScale(2.0, torch.zeros(1, 16)) for _ in range(4)]

    def caches() -> list[QuantizedKVCache]:
        return [QuantizedKVCache(model.config, fmt, scales, scales, keep_decoded=True) for _ in range(3)]

    alone, together = caches(), caches()
    gen = torch.Generator().manual_seed(5)
    for step, n in enumerate([9, 1, 1, 1, 1, 1, 1, 1]):
        for i in range(4):
            k, v = torch.randn(3, 1, n, 16, generator=gen), torch.randn(3, 1, n, 16, generator=gen)
            if step == 0:  # the prefills: each sequence on its own
                got = [c.update(k[b: b + 1], v[b: b + 1], i) for b, c in enumerate(together)]
            else:
                got = update_rows(together, i, k, v)
            want = [c.update(k[b: b + 1], v[b: b + 1], i) for b, c in enumerate(alone)]
            for (gk, gv), (wk, wv) in zip(got, want, strict=True):
                assert torch.equal(gk, wk) and torch.equal(gv, wv), (fmt, step, i)
    for a, b in zip(alone, together, strict=True):
        assert a.clip_stats() == b.clip_stats()
        for la, lb in zip(a.qlayers, b.qlayers, strict=True):
            for name, part in la.k_store.view().items():
                assert torch.equal(part, lb.k_store.view()[name])
    if fmt in ("fp8", "int8"):
        assert alone[0].clip_stats()["clipped"] > 0  # the counts compared above are not all zero
    assert batched[0] == (0 if fmt == "kivi4" else 7 * 4)  # one call per layer and decode step
