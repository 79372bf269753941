"""The fidelity task without a model server: the verdict rule, the OpenAI and Triton log-prob clients against a fake
server, and the whole task on a tiny random Llama whose 'served' answers are the prediction's own or corrupted."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trtkv.bench.outputs import results, slo
from trtkv.bench.tasks import fidelity, fidelity_verdict
from trtkv.bench.tasks.fidelity_score import CachedScorer, Served
from trtkv.bench.tasks.fidelity_served import openai_prompt_logprobs, openai_request, triton_request
from trtkv.bench.transport.client import Endpoint
from trtkv.contracts.bench_doc import BenchResults, TaskScore
from trtkv.core.errors import TrtkvError
from trtkv.recipe import load_recipe


def _rows(values: list[list[float]]) -> list[tuple[dict[str, list[float]], dict[str, list[float]]]]:
    return [({"top1_agreement": [1.0] * len(v), "mean_abs_dlogp": v}, {"top1_agreement": [1.0] * len(v),
             "mean_abs_dlogp": [0.05] * len(v)}) for v in values]


def test_served_equal_to_the_prediction_is_as_predicted_and_clearly_worse_is_not() -> None:
    same = fidelity_verdict.length_summary(256, _rows([[0.05] * 8] * 4), {})
    assert same["verdict"] == fidelity_verdict.AS_PREDICTED and same["mean_abs_dlogp"]["gap"]["value"] == pytest.approx(0)
    worse = fidelity_verdict.length_summary(256, _rows([[0.5, 0.7] * 4] * 4), {})
    assert worse["verdict"] == fidelity_verdict.WORSE and worse["worse_metrics"] == ["mean_abs_dlogp"]
    assert worse["mean_abs_dlogp"]["gap"]["ci"][0] > worse["mean_abs_dlogp"]["margin"]


def test_one_bad_document_of_four_is_within_the_spread() -> None:
    """The margin is the measurements' own spread: a single outlier document does not make the length worse."""
    out = fidelity_verdict.length_summary(256, _rows([[0.05] * 8, [0.05] * 8, [0.05] * 8, [0.9] * 8]), {})
    assert out["verdict"] == fidelity_verdict.AS_PREDICTED, out["mean_abs_dlogp"]


@pytest.mark.parametrize("name", ["smollm2_fp8kv", "smollm2_int8kv", "smollm2_fp8kv_vllm", "llama70b_fp8kv",
                                  "llama70b_fp8kv_sglang", "gemma3_fp8kv", "smollm2_fp16kv", "smollm2_fp8kv_llmapi"])
def test_fidelity_is_a_default_task_of_every_quantized_kv_recipe(name: str) -> None:
    recipe = load_recipe(name)
    able = recipe.quantization.kv_cache.value != "none" and recipe.build.backend.value != "llmapi"  # llmapi: no log-probs
    assert ("fidelity" in [t.value for t in recipe.bench.tasks]) == able
    assert [t.value for t in load_recipe(name, ["bench.tasks=[quiz]"]).bench.tasks] == ["quiz"]  # named tasks stay


def test_fidelity_slo_is_added_and_fails_on_a_worse_length() -> None:
    slos = slo.with_fidelity(slo.parse_all([], []), ["quiz", "fidelity"])
    assert any(s.text == "fidelity.worse_lengths<=0" for s in slos)
    bad = slo.check(slos, {}, {"fidelity": TaskScore(worse_lengths=1, failed=0, total=2)})
    assert not all(r.passed for r in bad)
    good = slo.check(slos, {}, {"fidelity": TaskScore(worse_lengths=0, failed=0, total=2)})
    assert all(r.passed for r in good)
    assert slo.parse_slo("fidelity.worse_lengths<=0").metric == "fidelity"


def test_each_fidelity_row_shape_is_typed_and_written_in_its_order() -> None:
    """A length measured without the served top-k (kl_topk null), one with no documents, one refused (its note)."""
    pair = ({"top1_agreement": [1.0, 0.0], "mean_abs_dlogp": [0.1, 0.2]},) * 2
    rows = [fidelity_verdict.length_summary(64, [pair, pair], {"failed": 1, "not_aligned": 0}),
            fidelity_verdict.length_summary(128, [], {"failed": 2, "not_aligned": 0}),
            {"length": 4096, "documents": 0, "verdict": fidelity_verdict.NOT_MEASURED, "worse_metrics": [],
             "note": "4096 > build.max_input_len 2048"}]
    score = TaskScore(table=rows)
    assert json.dumps(BenchResults(accuracy={"fidelity": score}).document()["accuracy"]["fidelity"]["table"]) == \
        json.dumps(rows)
    typed = score.table
    assert typed is not None and typed[0].kl_topk is None and typed[0].top1_agreement is not None
    assert typed[0].top1_agreement.served.value == 0.5 and not typed[0].top1_agreement.worse
    assert [r.verdict for r in typed[1:]] == [fidelity_verdict.NOT_MEASURED] * 2 and typed[2].note


def test_a_fidelity_entry_of_another_shape_is_refused_naming_where() -> None:
    row = {"length": 64, "documents": 0, "verdict": fidelity_verdict.NOT_MEASURED, "worse_metrics": []}
    with pytest.raises(ValueError, match=r"accuracy\.fidelity\.table\.0\.top1_agreement\.served"):
        BenchResults.model_validate({"accuracy": {"fidelity": {"table": [{**row, "top1_agreement": {"gap": 1}}]}}})
    with pytest.raises(ValueError, match=r"accuracy\.fidelity\.settings\.lengths"):
        BenchResults.model_validate({"accuracy": {"fidelity": {"settings": {"lengths": "64"}}}})


@pytest.mark.parametrize("name", ["smollm2_fp16kv", "gemma3_fp8kv"])
def test_the_task_refuses_a_16_bit_cache_before_any_request(name: str) -> None:
    """kv_cache none deploys the model dtype (fp16 or bf16: Recipe.kv_format); the task has no format to compare."""
    recipe = load_recipe(name, ["quantization.kv_cache=none"] if name == "gemma3_fp8kv" else [])
    assert recipe.kv_format.value in ("fp16", "bf16")
    ep = Endpoint("127.0.0.1:9", "http", "m")  # nothing listens: a request would fail differently
    with pytest.raises(TrtkvError, match=f"recipe {name} has an unquantized KV cache"):
        fidelity.fidelity_task(recipe, ep, None, print, "")
    entry = fidelity.fidelity_entry(recipe, ep, None, print)  # what `trtkv bench` records instead of stopping
    assert list(entry) == ["error"] and f"recipe {name} has an unquantized KV cache" in entry["error"]


def test_default_lengths_are_the_probe_lengths_up_to_max_input_len() -> None:
    recipe = load_recipe("llama8b_fp8kv")
    assert fidelity.default_lengths(recipe) == [n for n in recipe.probe.lengths if n <= recipe.build.max_input_len]
    assert fidelity.default_lengths(load_recipe("smollm2_fp8kv")) == [512]  # the CPU base: one length (make demo)
    small = load_recipe("smollm2_fp8kv", ["bench.fidelity_lengths=[1024,256]"])
    assert fidelity.default_lengths(small) == [256, 1024]


# ----------------------------------------------------------------------------- clients against a fake server


class _Fake(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Fake.seen.append(body)
        if self.path == "/v1/completions" and body.get("echo") and body["max_tokens"] == 0:  # prompt log-probs
            ids = body["prompt"]
            out = {"choices": [{"text": "", "logprobs": {"tokens": [f"token_id:{t}" for t in ids],
                                                          "token_logprobs": [None] + [-0.125] * (len(ids) - 1),
                                                          "top_logprobs": [None] + [{}] * (len(ids) - 1)}}]}
        elif self.path == "/v1/completions":
            n = body["max_tokens"]
            ids = [7 + i for i in range(n)]
            tokens = [f"token_id:{t}" for t in ids] if body.get("return_tokens_as_token_ids") else [" x"] * n
            top = [{f"token_id:{t}": -0.1, f"token_id:{t + 50}": -2.5} for t in ids]
            out = {"choices": [{"text": "x" * n, "logprobs": {"tokens": tokens, "token_logprobs": [-0.1] * n,
                                                              "top_logprobs": top, "text_offset": list(range(n))}}]}
        else:
            out = {"text_output": " and the", "output_log_probs": [[-0.5, -0.25]], "cum_log_probs": -0.75}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def fake() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_openai_logprobs_are_read_as_token_ids_with_top_k(fake: str) -> None:
    served = openai_request(fake, "m", [1, 2, 3], 4, 10.0, k=2)
    assert served.error is None and served.ids == [7, 8, 9, 10] and served.logprobs == [-0.1] * 4
    assert served.top == [{t: -0.1, t + 50: -2.5} for t in (7, 8, 9, 10)]
    sent = _Fake.seen[-1]
    assert sent["prompt"] == [1, 2, 3] and sent["logprobs"] == 2 and sent["return_tokens_as_token_ids"] is True
    assert sent["temperature"] == 0.0 and sent["stream"] is False


class _Tok:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([0] if add_special_tokens else []) + [len(w) for w in text.split(" ") if w]


def test_triton_output_log_probs_align_with_the_retokenized_text(fake: str) -> None:
    served = triton_request(fake, "ensemble", _Tok(), "a prompt", 2, 10.0)
    assert served.error is None and served.ids == [3, 3] and served.logprobs == [-0.5, -0.25]
    assert served.prefix_ids == [0, 1, 6]
    sent = _Fake.seen[-1]
    assert sent["return_log_probs"] is True and sent["max_tokens"] == 2 and sent["top_k"] == 1
    misaligned = triton_request(fake, "ensemble", _Tok(), "a prompt", 3, 10.0)  # same answer: 2 log-probs, 2 tokens
    assert misaligned.error is None


# ----------------------------------------------------------------------------- the task on a tiny model


class _Recipe:
    class build:  # noqa: N801 - attribute access as on a Recipe
        max_seq_len, max_input_len = 512, 256


def _noisy(seed_noise: float) -> Any:
    import torch

    from tests.support.models import tiny_llama

    model = tiny_llama(2, 2, 64, 512, seed=0)
    if seed_noise:
        torch.manual_seed(1)
        with torch.no_grad():
            for p in model.model.layers[0].self_attn.v_proj.parameters():
                p.add_(seed_noise * torch.randn_like(p))
    return model


def _scorer(name: str, model: Any, tmp: Path) -> CachedScorer:
    from transformers import DynamicCache

    return CachedScorer(name, name, tmp / f"{name}.json", lambda: (model, lambda: DynamicCache(config=model.config)),
                        {"producer": name})


def _greedy_server(model: Any) -> Any:
    """A fake served engine: greedy decoding of `model`, token by token, with the chosen tokens' log-probs."""
    import torch

    def request(prompt: str, ids: list[int]) -> Served:
        rng = torch.Generator().manual_seed(7 * int(prompt[1:]))
        prefix = [int(x) for x in torch.randint(0, 96, (64,), generator=rng)]
        seq, out, lps = list(prefix), [], []
        with torch.inference_mode():
            for _ in range(6):
                lp = torch.log_softmax(model(torch.tensor([seq])).logits[0, -1].float(), -1)
                t = int(lp.argmax())
                out.append(t)
                lps.append(float(lp[t]))
                seq.append(t)
        return Served(prefix, out, lps)
    return request


@pytest.mark.slow
def test_the_task_passes_the_predicted_engine_and_fails_a_corrupted_one(tmp_path: Path, one_torch_thread: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fidelity, "nested_documents", lambda tok, lengths, count: {n: [f"d{i}" for i in range(count)]
                                                                                    for n in lengths})
    reference, predicted = _noisy(0.0), _noisy(0.002)  # the prediction: a small, known error (as FP8 weights + KV)
    kwargs: dict[str, Any] = dict(tokenizer=_Tok(), lengths=[64], docs=6, tokens=6, reproduce="trtkv bench r",
                                  log=lambda s: None)
    healthy = fidelity.run_fidelity(_Recipe, _greedy_server(predicted), reference=_scorer("ref", reference, tmp_path),
                                    prediction=_scorer("pred", predicted, tmp_path), **kwargs)
    assert healthy["verdict"] == fidelity_verdict.AS_PREDICTED and healthy["worse_lengths"] == 0, healthy["notes"]
    assert "reproduce" not in healthy
    typed = BenchResults(accuracy={"fidelity": healthy}).accuracy["fidelity"]  # as results.json holds it
    assert typed.table is not None and typed.table[0].top1_agreement is not None
    row = typed.table[0].top1_agreement.served  # one length: the pooled figure is that length's own
    assert (healthy["accuracy"], healthy["accuracy_ci"]) == (pytest.approx(row.value), row.ci)
    assert healthy["accuracy_ci"][0] <= healthy["accuracy"] <= healthy["accuracy_ci"][1]
    assert results.accuracy_rows(BenchResults(accuracy={"fidelity": healthy}))[0][3] == results.interval_text(row.ci)
    assert typed.settings is not None and typed.settings.lengths == [64] and typed.settings.documents_per_length == 6
    assert typed.seconds is not None and typed.seconds["reference_computed"] == typed.table[0].documents == 6
    assert typed.reference == {"producer": "ref"} and typed.prediction == {"producer": "pred"}
    faulty = fidelity.run_fidelity(_Recipe, _greedy_server(_noisy(1.0)), reference=_scorer("ref", reference, tmp_path),
                                   prediction=_scorer("pred", predicted, tmp_path), **kwargs)
    assert faulty["verdict"] == fidelity_verdict.WORSE and faulty["lengths_judged_worse"] == [64], faulty["notes"]
    assert faulty["reproduce"] == "trtkv bench r" and faulty["likely_causes"]
    judged = BenchResults(accuracy={"fidelity": faulty}).accuracy["fidelity"].table
    assert judged is not None and judged[0].verdict == fidelity_verdict.WORSE and judged[0].worse_metrics
    assert all((fig := getattr(judged[0], m)) is None or fig.worse == (m in judged[0].worse_metrics)
               for m in fidelity_verdict.METRICS)
    for entry in (healthy, faulty):  # results.json's accuracy.fidelity: typed, written key for key in its order
        assert json.dumps(BenchResults(accuracy={"fidelity": entry}).document()["accuracy"]["fidelity"]) == \
            json.dumps(entry)
    assert json.loads((tmp_path / "ref.json").read_text())["docs"]  # the reference is cached per document


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "kivi4"])
def test_nested_scoring_equals_a_fresh_pass_per_length(fmt: str, one_torch_thread: None) -> None:
    """One document cut to three lengths, scored longest first re-using the shared prefix's cache, gives what a fresh
    pass per length gives (a per-token FP8 cache as well; KIVI, which cannot be cropped, falls back to fresh passes)."""
    import torch
    from transformers import DynamicCache

    from tests.support.models import tiny_llama
    from trtkv.bench.tasks.fidelity_score import teacher_forced, teacher_forced_nested
    from trtkv.kvcache.cache import QuantizedKVCache

    model = tiny_llama(2, 2, 64, 512, seed=0)
    torch.manual_seed(3)
    doc = [int(x) for x in torch.randint(0, 96, (160,))]

    def new_cache() -> Any:
        if fmt == "bf16":
            return DynamicCache(config=model.config)
        return QuantizedKVCache(config=model.config, fmt=fmt, k_scales=[0.01, 0.01], v_scales=[0.01, 0.01])

    items = [(Served(doc[:n], [int(x) for x in torch.randint(0, 96, (6,))], [0.0] * 6), None) for n in (40, 160, 96)]
    nested = teacher_forced_nested(model, new_cache, items)
    for (served, _), got in zip(items, nested, strict=True):
        fresh = teacher_forced(model, new_cache, served)
        assert got.argmax == fresh.argmax
        assert got.chosen == pytest.approx(fresh.chosen, abs=1e-4)


def test_shorter_documents_are_prefixes_of_the_longest() -> None:
    from trtkv.bench.load.prompts import load_tokenizer, tokenizer_dir

    tok = load_tokenizer(tokenizer_dir(load_recipe("smollm2_fp8kv")))
    docs = fidelity.nested_documents(tok, [64, 256], 3)
    for short, long in zip(docs[64], docs[256], strict=True):
        a, b = tok.encode(short, add_special_tokens=True), tok.encode(long, add_special_tokens=True)
        assert len(a) == 64 + (len(b) - 256) and b[:len(a)] == a


def test_a_scorers_model_is_loaded_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trtkv.bench.tasks.fidelity_score as fs

    loads: list[int] = []

    def load() -> Any:
        loads.append(1)
        return object(), lambda: None

    scored = fs.Scored([0.0], [1], [{1: 0.0}], None)
    monkeypatch.setattr(fs, "teacher_forced_nested", lambda model, new_cache, items, attention=None: [scored for _ in items])
    monkeypatch.setattr(fs, "_LOADED", {})
    for i in range(3):  # three bench runs in one process, e.g. a test's served and in-process cases
        scorer = CachedScorer("reference", "k", tmp_path / f"r{i}.json", load, {}, model_id="/models/x")
        scorer.score(Served([1, 2], [3 + i], [0.0]))
    assert len(loads) == 1 and scorer.computed == 1


def test_the_engines_prefill_log_probs_give_its_prefill_vs_decode_drift(fake: str, tmp_path: Path) -> None:
    """vLLM's echo + max_tokens 0 returns the prompt's log-probs: the served continuation's tokens scored by one
    prefill, against the log-probs the decode returned. Cache-only attention predicts 0 (no verdict drawn)."""
    from trtkv.bench.tasks import fidelity_drift

    values, error = openai_prompt_logprobs(fake, "m", [1, 2, 3, 7, 8], 10.0)
    assert error is None and values == [-0.125] * 4
    assert _Fake.seen[-1]["echo"] is True and _Fake.seen[-1]["max_tokens"] == 0
    served = openai_request(fake, "m", [1, 2, 3], 4, 10.0, k=2)  # decode log-probs -0.1 each
    prefill = lambda ids: openai_prompt_logprobs(fake, "m", ids, 10.0)  # noqa: E731
    rows, error = fidelity_drift.served_rows(prefill, served)
    assert error is None and rows == pytest.approx([0.025] * 4)
    scorer = CachedScorer("pred", "k", tmp_path / "pred.json", lambda: (_ for _ in ()).throw(AssertionError), {})
    table = fidelity.drift_table(prefill, scorer, "cache_only", {16: [served, served]})
    row = table["table"][0]
    assert row["served"]["value"] == pytest.approx(0.025) and row["predicted"]["value"] == 0.0
    assert row["verdict"].startswith("not judged")
    assert not fidelity.drift_table(None, scorer, "cache_only", {})["measured"]


def test_predicted_drift_of_an_fp8_attention_mode_is_computed_on_the_prediction_model(tmp_path: Path,
                                                                                     one_torch_thread: None) -> None:
    import torch

    from tests.support.models import tiny_llama
    from trtkv.bench.tasks import fidelity_drift
    from trtkv.kvcache.cache import QuantizedKVCache

    model = tiny_llama(2, 2, 128, 512, seed=2).float()  # head_dim 128: FA3's FP8 prefill and decode tiles differ
    model.config._attn_implementation = "sdpa"
    scorer = CachedScorer("pred", "k", tmp_path / "p.json",
                          lambda: (model, lambda: QuantizedKVCache(model.config, "fp8_scale1", [1.0] * 2, [1.0] * 2)),
                          {})
    ids = torch.randint(0, 96, (260,), generator=torch.Generator().manual_seed(3)).tolist()
    served = Served(ids[:250], ids[250:], [0.0] * 10)
    fa3 = fidelity_drift.predicted_rows(scorer, "vllm_fa3_fp8", served)
    assert len(fa3) == 10 and max(fa3) > 0
    assert fidelity_drift.predicted_rows(scorer, "cache_only", served) == [0.0] * 10


def test_the_prediction_runs_the_engines_attention_mode_prompt_prefilled_continuation_decoded(
        tmp_path: Path, one_torch_thread: None) -> None:
    """For an FP8 attention deployment the prediction is what that engine computes: the prompt through its prefill
    kernel, the served continuation through its decode kernel (the drift the fidelity table judges comes from the
    same two kernels), not the stored cache alone."""
    import torch

    from tests.support.models import tiny_llama
    from trtkv.bench.tasks import fidelity_drift
    from trtkv.bench.tasks.fidelity_score import engine_attention_for
    from trtkv.kvcache.cache import QuantizedKVCache

    model = tiny_llama(2, 2, 128, 512, seed=2).float()
    model.config._attn_implementation = "sdpa"
    load = lambda: (model, lambda: QuantizedKVCache(model.config, "fp8_scale1", [1.0] * 2, [1.0] * 2))  # noqa: E731
    ids = torch.randint(0, 96, (260,), generator=torch.Generator().manual_seed(3)).tolist()
    served = Served(ids[:250], ids[250:], [0.0] * 10)
    cache_only = CachedScorer("a", "k1", tmp_path / "a.json", load, {}).score(served)
    engine = CachedScorer("b", "k2", tmp_path / "b.json", load, {}, attention=engine_attention_for("vllm_fa3_fp8"))
    scored = engine.score(served)
    assert scored.chosen != cache_only.chosen
    prefill_side = CachedScorer("c", "k3", tmp_path / "c.json", load, {},
                                attention=lambda m, c, s: fidelity_drift_prefill(m, c)).score(served)
    drift = fidelity_drift.predicted_rows(engine, "vllm_fa3_fp8", served)
    assert [abs(a - b) for a, b in zip(scored.chosen, prefill_side.chosen, strict=True)] == pytest.approx(drift, abs=1e-5)


def fidelity_drift_prefill(model, cache):  # noqa: ANN001, ANN201
    """Every row through vLLM FA3's prefill kernel (the drift's other side)."""
    from trtkv.kvcache.attention_hook import EngineRun, engine_attention, q_scales_for
    from trtkv.kvcache.attention_modes import load_attention

    mode = load_attention().mode("vllm_fa3_fp8")
    return engine_attention(model, EngineRun(mode, cache, None, q_scales_for(cache, mode)))
