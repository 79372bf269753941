"""The probe's window-aware path on a tiny random Gemma 3 (sliding + full layers): a sliding layer's cache keeps only
its window, and the chunked, trimmed pass equals the naive single pass over an untrimmed cache, in float64 (where
fp32 summation noise cannot flip a 16-bit or int8 rounding), for the 16-bit cache and quantized formats."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from trtkv.kvcache.cache import QuantizedKVCache
from trtkv.kvcache.names import parse_format
from trtkv.probe.measure import feed
from trtkv.probe.metrics import kl_between, length_record, logprobs, position_metrics
from trtkv.probe.window import SlidingQuantizedLayer, WindowedKVCache

WINDOW = 16
KINDS = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
TOL = 1e-9  # float64 logprobs: ~1e-16 relative per op, far below any 16-bit/int8 rounding step


@pytest.fixture(scope="module")
def gemma(one_torch_thread: None) -> Gemma3ForCausalLM:
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=len(KINDS),
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=WINDOW,
                              layer_types=KINDS, max_position_embeddings=512, attn_implementation="sdpa")
    return Gemma3ForCausalLM(config).to(torch.float64).eval()


def _pass(model: Gemma3ForCausalLM, ids: torch.Tensor, fmt: str, trim: bool, chunk: int | None
          ) -> tuple[torch.Tensor, WindowedKVCache]:
    cache = WindowedKVCache(model.config, fmt, trim=trim)
    hidden = feed(model, ids, cache, chunk)
    with torch.inference_mode():
        return logprobs(model, hidden[0]), cache


def _held_tokens(cache: WindowedKVCache) -> dict[str, int]:
    """Tokens held now: the most any sliding layer keeps (its window) and any full layer (everything)."""
    sliding = [q.kept_tokens() for q in cache.qlayers if isinstance(q, SlidingQuantizedLayer)]
    full = [q.get_seq_length() for q in cache.qlayers if not isinstance(q, SlidingQuantizedLayer)]
    return {"sliding_max": max(sliding, default=0), "full_max": max(full, default=0)}


@pytest.mark.parametrize(("fmt", "naive_chunk", "fast_chunk"),
                         [("fp16", None, 7), ("int8_token", None, 24), ("int4_g32", None, 5), ("kivi4", 128, 128)])
def test_trimmed_chunked_pass_equals_naive_pass(gemma: Gemma3ForCausalLM, fmt: str, naive_chunk: int | None,
                                                fast_chunk: int) -> None:
    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(1))
    naive, full = _pass(gemma, ids, fmt, trim=False, chunk=naive_chunk or ids.shape[1])
    fast, windowed = _pass(gemma, ids, fmt, trim=True, chunk=fast_chunk)
    assert (naive - fast).abs().max() < TOL
    held = _held_tokens(windowed)
    assert held["full_max"] == 300 and held["sliding_max"] <= WINDOW - 1 + 128  # KIVI: + its fp16 window
    assert _held_tokens(full)["sliding_max"] == 300
    sliding = [q for q in windowed.qlayers if isinstance(q, SlidingQuantizedLayer)]
    assert len(sliding) == 3 and windowed.is_sliding == [True, True, False, True]
    assert windowed.stored_bytes() < full.stored_bytes()
    assert windowed.bytes_per_token() == pytest.approx(full.bytes_per_token())


def test_trimming_changes_the_result_when_the_mask_is_not_told(gemma: Gemma3ForCausalLM) -> None:
    """The test above can fail: a trimmed layer reporting the untrimmed mask offset attends to the wrong keys."""
    ids = torch.randint(0, 128, (1, 80), generator=torch.Generator().manual_seed(2))
    naive, _ = _pass(gemma, ids, "fp16", trim=False, chunk=80)
    orig = SlidingQuantizedLayer.get_mask_sizes
    try:
        SlidingQuantizedLayer.get_mask_sizes = lambda self, q: (self.kept_tokens() + q, 0)  # type: ignore[method-assign]
        broken, _ = _pass(gemma, ids, "fp16", trim=True, chunk=8)
    finally:
        SlidingQuantizedLayer.get_mask_sizes = orig  # type: ignore[method-assign]
    assert (naive - broken).abs().max() > 1e-3


def test_the_shared_cache_and_the_probes_windowed_cache_agree_on_which_layers_slide(gemma: Gemma3ForCausalLM) -> None:
    """trtkv.kvcache.cache keeps sliding windows itself now (the runtime's path); the probe's WindowedKVCache (chunked,
    mask-offset) must mark the same layers sliding with the same window."""
    shared = [layer.sliding_window for layer in QuantizedKVCache(gemma.config, "fp16").qlayers]
    probe = WindowedKVCache(gemma.config, "fp16")
    assert [q.sliding_window if isinstance(q, SlidingQuantizedLayer) else None for q in probe.qlayers] == shared
    assert any(w is not None for w in shared) and any(w is None for w in shared)


def test_sampled_positions_give_the_dense_record_of_those_positions(gemma: Gemma3ForCausalLM) -> None:
    ids = torch.randint(0, 128, (1, 200), generator=torch.Generator().manual_seed(3))
    ref_hidden = feed(gemma, ids, WindowedKVCache(gemma.config, "fp16"), None)[0]
    q_hidden = feed(gemma, ids, WindowedKVCache(gemma.config, "int4_g32"), None)[0]
    targets = ids[0, 1:]
    dense = position_metrics(gemma, ref_hidden[:199], q_hidden[:199], targets)
    pos = torch.arange(0, 199, 3)
    sampled = position_metrics(gemma, ref_hidden[:199], q_hidden[:199], targets, pos)
    assert torch.allclose(sampled["kl"], dense["kl"][pos]) and torch.equal(sampled["pos"], pos)
    assert torch.allclose(kl_between(sampled, 30, 90), dense["kl"][pos[(pos >= 30) & (pos < 90)]])

    class _Loaded:
        info = {"num_layers": 4, "num_kv_heads": 1, "head_dim": 32}

    run = {"metrics": sampled, "bytes_per_token": 1.0}
    rec = length_record(_Loaded(), parse_format("int4_g32"), run, 120, {})  # type: ignore[arg-type]
    keep = pos[pos < 119]
    assert rec["positions"] == keep.numel()
    assert rec["kl_mean"] == pytest.approx(float(dense["kl"][keep].double().mean()))
    assert rec["kl_last_quarter"] == pytest.approx(float(dense["kl"][keep[keep >= 90]].double().mean()))


class _CharTokenizer:
    """One id per character (ids < 128): enough for the passkey text on the tiny model."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> object:
        class _Out:
            input_ids = [ord(c) % 128 for c in text]
        return _Out()


def _needle_loaded(gemma: Gemma3ForCausalLM, lengths: list[int], depths: list[float], seeds: int, total: int):  # noqa: ANN202
    """A Loaded whose text carries every needle (trtkv.probe.needles), on the tiny model with one id per character."""
    from trtkv.probe.needles import place_needles, plan_needles
    from trtkv.probe.setup import Loaded

    text = torch.randint(0, 128, (total + 2000,), generator=torch.Generator().manual_seed(4)).tolist()
    ids, plan = place_needles(text, plan_needles(_CharTokenizer(), lengths, depths, seeds), total)
    return Loaded(gemma, _CharTokenizer(), torch.device("cpu"), None, ids, [], "k", {}, plan)  # type: ignore[arg-type]


def test_needles_are_distinct_and_inside_their_lengths_prompt(gemma: Gemma3ForCausalLM) -> None:
    """Every needle has its own key and value, sits in the pass text as planned, and ends before its length's
    questions start; a length asks its own needles only."""
    loaded = _needle_loaded(gemma, [800, 1600], [0.1, 0.9], 2, 1700)
    plan = loaded.needles
    assert len(plan.needles) == 8 and len(loaded.text_ids) == 1700
    assert len({n.name for n in plan.needles}) == 8 and len({n.value for n in plan.needles}) == 8
    for nd in plan.needles:
        assert loaded.text_ids[nd.position: nd.position + len(nd.ids)] == nd.ids
        assert nd.position + len(nd.ids) <= plan.prefix_end[nd.length]
        assert plan.prefix_end[nd.length] + len(nd.question) <= nd.length
    spans = sorted((n.position, n.position + len(n.ids)) for n in plan.needles)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # no needle overwrites another


@pytest.mark.parametrize(("fmt", "chunk"), [("int8_token", None), ("fp16", None), ("kivi4", 128)])
def test_shared_pass_needles_equal_separate_passes(gemma: Gemma3ForCausalLM, fmt: str, chunk: int | None) -> None:
    """One pass over the text with every needle, questions asked on copies of the cache where each length's prompt
    ends, gives each question's answer logits of a fresh pass over that prompt (float64); and the KL pass's hidden
    states are those of the same pass without the stops."""
    from trtkv.probe.needles import feed_text

    loaded = _needle_loaded(gemma, [500, 900], [0.2, 0.8], 1, 1000)
    seen: list[torch.Tensor] = []
    hook = gemma.lm_head.register_forward_hook(lambda m, a, o: seen.append(o.detach().clone()))
    ids = torch.tensor([loaded.text_ids])
    pos = torch.tensor([3, 200, 480, 700, 998])
    try:
        hidden, results = feed_text(loaded, ids, WindowedKVCache(gemma.config, fmt), chunk, pos)
        shared = list(seen)
        seen.clear()
        alone = []
        for length in (500, 900):
            for nd in (n for n in loaded.needles.needles if n.length == length):
                p, w = loaded.needles.prefix_end[length], len(nd.question)
                prompt = torch.tensor([loaded.text_ids[:p] + nd.question])
                h = feed(gemma, prompt, WindowedKVCache(gemma.config, fmt), chunk,
                         positions=torch.arange(p + w - len(nd.digits), p + w))
                with torch.inference_mode():
                    alone.append(gemma.lm_head(h))
    finally:
        hook.remove()
    assert len(shared) == len(alone) == 4 and results is not None and set(results) == {500, 900}
    assert all((a - b).abs().max() < TOL for a, b in zip(shared, alone, strict=True))
    assert all(r["method"] == "shared_haystack" and len(r["trials"]) == 2 for r in results.values())
    plain = feed(gemma, ids, WindowedKVCache(gemma.config, fmt), chunk, pos)
    assert hidden.shape == plain.shape and (hidden - plain).abs().max() < TOL


@pytest.mark.parametrize(("fmt", "chunk"), [("fp16", 7), ("int8_token", None), ("kivi4", 128)])
def test_last_layer_at_sampled_rows_equals_the_dense_pass(gemma: Gemma3ForCausalLM, fmt: str, chunk: int | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """feed(positions=...) on a windowed cache runs the last layer at those rows only: the same hidden states as the
    dense pass there (float64), and the shortcut did run (it is not the dense pass indexed afterwards)."""
    from trtkv.probe.window import LastLayerAt

    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(5))
    dense = feed(gemma, ids, WindowedKVCache(gemma.config, fmt), chunk)[0]
    pos = torch.tensor([0, 1, 2, 40, 41, 299])  # several per chunk, chunks with none, first and last
    calls = []
    forward = LastLayerAt.forward
    monkeypatch.setattr(LastLayerAt, "forward", lambda self, *a, **k: calls.append(self.rows.numel()) or
                        forward(self, *a, **k))
    sampled = feed(gemma, ids, WindowedKVCache(gemma.config, fmt), chunk, positions=pos)[0]
    assert sum(calls) == pos.numel() and (0 in calls or chunk is None)
    assert sampled.shape == (pos.numel(), dense.shape[-1])
    assert (sampled - dense[pos]).abs().max() < TOL
    assert gemma.model.layers[-1].__class__.__name__ == "Gemma3DecoderLayer"  # restored after the pass


def test_one_reference_head_shared_by_formats_gives_each_formats_metrics(gemma: Gemma3ForCausalLM) -> None:
    """head_metrics runs the reference's LM head once for several formats: each gets exactly position_metrics'."""
    from trtkv.probe.metrics import head_metrics

    ids = torch.randint(0, 128, (1, 120), generator=torch.Generator().manual_seed(6))
    ref = feed(gemma, ids, WindowedKVCache(gemma.config, "fp16"), None)[0][:119]
    qs = {f: feed(gemma, ids, WindowedKVCache(gemma.config, f), None)[0][:119] for f in ("int4_g32", "int8_token")}
    targets = ids[0, 1:]
    shared = head_metrics(gemma, ref, {**qs, "ref": ref}, targets)
    for f, h in qs.items():
        alone = position_metrics(gemma, ref, h, targets)
        assert all(torch.equal(shared[f][k], alone[k]) for k in alone)
    assert float(shared["ref"]["kl"].abs().max()) == 0.0 and float(shared["int4_g32"]["kl"].mean()) > 0.0


def test_sampled_reference_and_last_layer_give_the_dense_runs_metrics(gemma: Gemma3ForCausalLM, tmp_path) -> None:  # noqa: ANN001
    """run_format on a windowed model with the reference stored at the LM head's rows only (its last layer run at
    those rows) gives the metrics of the dense reference and pass at those rows (float64)."""
    from trtkv.kvcache.scales import KVScales
    from trtkv.probe.measure import reference_hidden, run_format
    from trtkv.probe.metrics import finish_runs, head_positions
    from trtkv.probe.setup import Loaded

    text = torch.randint(0, 128, (260,), generator=torch.Generator().manual_seed(7)).tolist()
    loaded = Loaded(gemma, None, torch.device("cpu"), tmp_path, text, [], "k", {"head_positions": 40})
    n = 260
    pos = head_positions(loaded, n - 1)
    assert pos is not None and pos.numel() <= 40
    dense_ref, _ = reference_hidden(loaded, n, tmp_path)
    sampled_ref, _ = reference_hidden(loaded, n, tmp_path, pos)
    assert sampled_ref.shape[0] == pos.numel() and (sampled_ref - dense_ref[pos]).abs().max() < TOL
    scales = KVScales(k_amax=[1.0] * 4, v_amax=[1.0] * 4, source="test")
    choice = parse_format("int4_g32")
    dense = run_format(loaded, choice, scales, n, dense_ref)["metrics"]
    runs = {f: run_format(loaded, parse_format(f), scales, n, sampled_ref, defer_head=True) for f in ("fp16", "int4_g32")}
    assert "metrics" not in runs["int4_g32"]
    finish_runs(loaded, runs, sampled_ref, n)
    fast = runs["int4_g32"]["metrics"]
    assert torch.equal(fast["pos"], dense["pos"]) and (fast["kl"] - dense["kl"]).abs().max() < TOL
    assert (fast["nll_q"] - dense["nll_q"]).abs().max() < TOL and torch.equal(fast["agree"], dense["agree"])
    assert float(runs["fp16"]["metrics"]["kl"].abs().max()) == 0.0


def test_the_sweep_asks_every_formats_needles_from_its_kl_pass(gemma: Gemma3ForCausalLM, tmp_path, engines_tmp,  # noqa: ANN001
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """run_probe on a windowed model: every format's needles come from its KL pass (no needle pass of their own),
    per needle length in probe.json as before; a second run reads them back, and a format whose needles are missing
    runs its pass again."""
    import json

    from trtkv.kvcache.scales import KVScales
    from trtkv.probe import sweep
    from trtkv.probe.setup import ProbeSettings
    from trtkv.recipe import load_recipe

    loaded = _needle_loaded(gemma, [500, 900], [0.2, 0.8], 1, 1000)
    loaded.model_dir, loaded.key = tmp_path, "tiny"
    loaded.info = {"num_layers": 4, "num_kv_heads": 1, "head_dim": 32, "sliding_window": WINDOW, "head_positions": 64}
    monkeypatch.setattr(sweep, "load_model", lambda recipe, settings: loaded)
    monkeypatch.setattr(sweep, "probe_scales", lambda *a: KVScales(k_amax=[1.0] * 4, v_amax=[1.0] * 4, source="test"))
    monkeypatch.setattr("trtkv.probe.outputs.write_outputs", lambda out, doc, *a: (out / "probe.json").write_text(
        json.dumps(doc)))
    formats = ["fp16", "int8_token", "int4_g32"]
    settings = ProbeSettings(formats=formats, lengths=[500, 1000], needle_lengths=[500, 900], needle_depths=[0.2, 0.8],
                             needle_seeds=1, progress=False)
    out = sweep.run_probe(load_recipe("smollm2_fp8kv"), tmp_path / "probe", settings)
    doc = json.loads((out / "probe.json").read_text())
    assert {(r["format"], r["context_len"]) for r in doc["needles"]} == {(f, n) for f in formats for n in (500, 900)}
    assert doc["settings"]["needle_method"] == "shared_haystack"
    recs = {(r["format"], r["context_len"]): r for r in doc["records"]}
    assert set(recs[("int4_g32", 500)]["needle_by_depth"]) == {"0.2", "0.8"}
    assert "int4_g32_needles_cpu" in doc["pass_seconds"] and "fp16_needles_cpu" in doc["pass_seconds"]
    sweep.run_probe(load_recipe("smollm2_fp8kv"), out, settings)
    again = json.loads((out / "probe.json").read_text())
    assert again["pass_seconds"] == {} and again["needles"] == doc["needles"]
    (out / "cache" / "int4_g32_needle_900.json").unlink()
    sweep.run_probe(load_recipe("smollm2_fp8kv"), out, settings)
    third = json.loads((out / "probe.json").read_text())
    assert set(third["pass_seconds"]) >= {"int4_g32", "int4_g32_needles_cpu"} and "int8_token" not in third["pass_seconds"]
    def untimed(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("seconds", "cpu_seconds")} for r in rows]

    assert untimed(third["needles"]) == untimed(doc["needles"]) and third["records"] == doc["records"]


def test_last_layer_at_sampled_rows_under_an_engine_mode_equals_its_dense_pass(gemma: Gemma3ForCausalLM) -> None:
    """The shortcut runs the engine kernel's numerics too (FP8 Q and P, absolute tiles): the same rows as the dense
    engine pass (float64: no FP8 rounding boundary crossed by summation order)."""
    from types import SimpleNamespace

    from trtkv.probe.attention import attending

    loaded = SimpleNamespace(model=gemma, info={"head_dim": 32})
    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(6))
    pos = torch.tensor([0, 5, 40, 41, 200, 299])
    runs = []
    for positions in (None, pos):
        cache = WindowedKVCache(gemma.config, "fp8_scale1", [1.0] * 4, [1.0] * 4)
        with attending(loaded, "vllm_fa3_fp8", cache):
            runs.append(feed(gemma, ids, cache, 7, positions)[0])
    dense, sampled = runs
    assert (sampled - dense[pos]).abs().max() < TOL
