"""`trtkv probe` on the real model (tiny sweep), and the planner reading probe results."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.support.probe_records import probe_doc, probe_json, record, record_dict
from trtkv.cli import main
from trtkv.contracts.probe_doc import ProbeDoc
from trtkv.measures.probe_results import classify, find_probe, probe_advice
from trtkv.recipe import load_recipe

TINY = ["probe.needle_seeds=1", "probe.needle_depths=[0.5]", "calibration.num_samples=4", "calibration.seq_len=64"]


@pytest.mark.e2e  # runs the real model: not in `make check`
@pytest.mark.slow
def test_probe_tiny_sweep_on_real_model(tmp_path: Path, engines_tmp: Path, smollm2_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "probe"
    args = ["probe", "smollm2_fp8kv", *TINY, "--formats", "fp16,int8,int8_split,kivi2", "--lengths", "64,160",
            "--needle-lengths", "96", "--decode-steps", "2", "--threads", "1", "--no-progress", "--output", str(out),
            "--attention", "trtllm_fresh_context"]  # TensorRT-LLM's INT8 path: the prompt attends its own 16-bit K/V
    assert main(args) == 0
    doc = json.loads((out / "probe.json").read_text())
    keys = {"format", "context_len", "kl_mean", "kl_last_quarter", "ppl", "ppl_delta", "top1_agreement",
            "needle_accuracy", "clip_rate", "kv_bytes_per_token"}
    recs = {(r["format"], r["context_len"]): r for r in doc["records"]}
    assert set(recs) == {(f, n) for f in ("fp16", "int8", "int8_split", "kivi2") for n in (64, 160)}
    assert all(keys <= set(r) for r in recs.values())
    assert recs[("fp16", 160)]["kl_mean"] == 0.0 and recs[("fp16", 160)]["top1_agreement"] == 1.0
    assert recs[("int8", 160)]["kl_mean"] > 0 and recs[("int8", 160)]["clip_rate"] is not None
    assert recs[("kivi2", 64)]["kl_mean"] == 0.0  # all 64 tokens still in KIVI's fp16 window
    assert recs[("kivi2", 160)]["kl_mean"] > 0
    assert recs[("int8", 160)]["kv_bytes_per_token"] == pytest.approx(recs[("int8", 160)]["kv_bytes_per_token_formula"])
    assert recs[("fp16", 160)]["needle_accuracy"] is None and doc["needles"][0]["context_len"] == 96
    assert {p.name for p in out.glob("*.png")} >= {"error_vs_context.png", "needle.png"}
    md = (out / "probe.md").read_text()
    assert "## Verdicts" in md and "TensorRT-LLM int8_kv_cache" in md and "K/V statistics" in md
    assert "int8" in doc["scale_reuse"]["decode"]
    assert doc["scales"]["source"].startswith("trtkv short calibration pass")  # no kv_scales.json in engines_tmp
    manifest = json.loads((out / "manifest.json").read_text())  # the probe folder has its manifest too
    assert manifest["stage"] == "probe" and manifest["wall_seconds"] == doc["seconds"]
    assert len(doc["scales"]["layers"]) == 30 and all(x["k_amax"] > 0 for x in doc["scales"]["layers"])
    # the engine mode: int8 only (the format it reads), beside cache-only, with its prefill-vs-decode drift
    assert doc["attention"]["modes"] == ["cache_only", "trtllm_fresh_context"]
    assert all(r["attention"] == "cache_only" for r in doc["records"])
    engine = {(r["format"], r["context_len"]): r for r in doc["attention_records"]}
    assert set(engine) == {("int8", 64), ("int8", 160)} and engine[("int8", 160)]["attention"] == "trtllm_fresh_context"
    assert [(d["format"], d["attention"]) for d in doc["drift"]] == [("int8", "trtllm_fresh_context")]
    assert doc["drift"][0]["mean_abs_dlogp"] > 0  # the prompt saw 16-bit K/V, the decoded tokens the INT8 cache
    assert "## Cache-only vs the engine's attention" in md
    # resume: everything cached, same records
    first = (out / "probe.json").read_text()
    t0 = time.time()
    assert main(args) == 0
    again = json.loads((out / "probe.json").read_text())
    assert again["records"] == json.loads(first)["records"] and again["pass_seconds"] == {}
    assert again["attention_records"] == json.loads(first)["attention_records"] and again["drift"] == doc["drift"]
    assert time.time() - t0 < 120
    capsys.readouterr()


@pytest.mark.slow
def test_probe_records_the_deployed_scales_after_calibrate(smollm2_engine: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """After `trtkv calibrate` (the session's chain run), the probe measures with the recipe's kv_scales.json."""
    monkeypatch.setenv("TRTKV_ENGINES", str(smollm2_engine.parent))
    out = tmp_path / "probe"
    args = ["probe", "smollm2_fp8kv", *TINY, "--formats", "fp8,nvfp4", "--lengths", "64", "--no-needle",
            "--decode-steps", "1", "--threads", "1", "--no-progress", "--output", str(out)]
    assert main(args) == 0
    doc = json.loads((out / "probe.json").read_text())
    recs = {r["format"]: r for r in doc["records"]}
    # NVFP4: 0.5625 bytes/element (E2M1 + an E4M3 scale per 16) = 6480 bytes/token on SmolLM2, and a larger error
    assert recs["nvfp4"]["kv_bytes_per_token"] == recs["nvfp4"]["kv_bytes_per_token_formula"] == 6480
    assert recs["nvfp4"]["kl_mean"] > recs["fp8"]["kl_mean"] > 0
    deployed = json.loads((smollm2_engine / "checkpoint" / "kv_scales.json").read_text())
    assert doc["scales"]["source"] == str(smollm2_engine / "checkpoint" / "kv_scales.json")
    assert [(x["k_amax"], x["v_amax"]) for x in doc["scales"]["layers"]] == [
        (x["k_amax"], x["v_amax"]) for x in deployed["layers"]]


def test_probe_rejects_unknown_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["probe", "smollm2_fp8kv", "--formats", "fp16,int3"])
    assert exc.value.code == 2
    assert "int3" in capsys.readouterr().err


def _fake_probe(folder: Path, recipe: str, source: str = "packaged:smollm2") -> None:
    folder.mkdir(parents=True)
    recs = [
        record_dict("fp16", 4096, 0.0, bpt=23040, ppl=10.0, ppl_ref=10.0, ppl_delta=0.0),
        record_dict("fp8", 4096, 0.002, bpt=11520, top1_agreement=0.985, ppl=10.02, ppl_ref=10.0, ppl_delta=0.02),
        record_dict("int4_g64", 4096, 0.05, bpt=6480, top1_agreement=0.89, ppl=10.9, ppl_ref=10.0, ppl_delta=0.9),
    ]
    doc = probe_json(recs, recipe, reference="fp16", model={"source": source},
                     needles=[{"format": "fp16", "context_len": 512, "by_depth": {"0.5": 1.0}, "accuracy": 1.0},
                              {"format": "fp8", "context_len": 512, "by_depth": {"0.5": 1.0}, "accuracy": 1.0}])
    (folder / "probe.json").write_text(json.dumps(doc))


def test_plan_uses_probe_of_same_model_from_another_recipe(engines_tmp: Path) -> None:
    recipe = load_recipe("smollm2_int8kv")
    assert find_probe(recipe) is None
    _fake_probe(engines_tmp / "smollm2_fp8kv" / "probe", "smollm2_fp8kv")
    _fake_probe(engines_tmp / "llama8b_fp8kv" / "probe", "llama8b_fp8kv", source="meta-llama/Llama-3.1-8B-Instruct")
    folder, doc = find_probe(recipe)
    assert doc.recipe == "smollm2_fp8kv"
    lines, basis = probe_advice(recipe)
    assert "smollm2_fp8kv (same model)" in basis
    assert any(line.startswith("fp8 at 4096") and line.endswith("safe") for line in lines)
    assert any("Smallest KV format measured safe" in line and "fp8" in line for line in lines)
    assert any("recipe's KV format int8 was not probed" in line for line in lines)
    shutil.rmtree(engines_tmp / "smollm2_fp8kv")
    assert probe_advice(recipe) is None


def test_plan_cli_shows_probe_advice(engines_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_probe(engines_tmp / "smollm2_fp8kv" / "probe", "smollm2_fp8kv")
    assert main(["plan", "smollm2_fp8kv", "--full"]) == 0
    out = capsys.readouterr().out
    assert "measured by `trtkv probe`" in out and "int4_g64 at 4096" in out


def test_classify_thresholds() -> None:
    base = record("fp8", 512, 0.0, ppl_ref=10.0, ppl_delta=0.05, top1_agreement=0.98)
    assert classify(base) == "safe"
    assert classify(base.model_copy(update={"needle_accuracy": 0.4}), ref_needle=1.0) == "caution"
    assert classify(base.model_copy(update={"top1_agreement": 0.92})) == "caution"
    assert classify(base.model_copy(update={"ppl_delta": 1.0})) == "risky"


@pytest.mark.e2e  # runs the real model: not in `make check`
@pytest.mark.slow
def test_per_layer_sensitivity_search_and_front(tmp_path: Path, engines_tmp: Path, smollm2_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`trtkv probe --per-layer fp8` on the real model at short lengths: every layer measured both ways, the greedy
    sets verified (predicted vs measured), a front, a recommendation within the byte budget, and a cached rerun."""
    out = tmp_path / "pl"
    args = ["probe", "smollm2_fp8kv", *TINY, "--per-layer", "fp8", "--lengths", "32,48", "--max-keep", "2",
            "--needle-lengths", "64", "--threads", "1", "--output", str(out)]
    assert main(args) == 0
    doc = json.loads((out / "per_layer_fp8.json").read_text())
    assert (doc["sweep_length"], doc["longest_length"], doc["keep_format"]) == (48, 48, "bf16")
    assert [r["layer"] for r in doc["layers"]] == list(range(30))
    for r in doc["layers"]:
        assert r["kl_only"] >= 0 and r["kl_all_but"] >= 0
        assert r["gain"] == pytest.approx(doc["uniform"]["kl_sweep"] - r["kl_all_but"])
    assert doc["all_16bit"]["kl_longest"] < doc["uniform"]["kl_longest"]  # bf16 everywhere is closer to the reference
    assert [len(c["keep"]) for c in doc["candidates"]] == [1, 2]
    best_layer = max(doc["layers"], key=lambda r: r["gain"])["layer"]
    assert doc["candidates"][0]["keep"] == [best_layer]
    # a one-layer set's prediction is exactly its own "all but" measurement (the same configuration)
    assert doc["candidates"][0]["predicted_kl_sweep"] == pytest.approx(doc["candidates"][0]["kl_sweep"])
    assert doc["uniform"]["bytes_per_token"] == 11520 and doc["candidates"][1]["bytes_per_token"] == 12288
    assert set(doc["front_longest"]) >= {"bf16"}
    best = doc["recommended"]
    assert best is not None and best["bytes_per_token"] <= 1.15 * 11520
    assert best["kl_longest"] <= doc["uniform"]["kl_longest"] and best["serving"]["engines"]
    assert all(list(c["serving"]["engines"]) == ["vllm"] for c in doc["candidates"])  # skip layers: vLLM only
    assert sorted(doc["uniform"]["serving"]["engines"]) == ["llmapi", "sglang", "tensorrt", "vllm"]
    for point in [doc["uniform"], doc["all_16bit"], *doc["candidates"]]:  # passkey accuracy at 64 tokens, each
        assert 0.0 <= point["needle"]["64"] <= 1.0
    assert doc["needle_lengths"] == [64] and doc["front_needle"]
    md = (out / "per_layer_fp8.md").read_text()
    assert "needle@64" in md
    assert "KL all but this" in md and "predicted KL@48" in md and (out / "per_layer_fp8.png").is_file()
    assert main(args) == 0  # rerun: every pass from the cache
    assert json.loads((out / "per_layer_fp8.json").read_text())["passes"]["run"] == 0
    capsys.readouterr()
    if best["keep"]:  # the planner says so too
        assert main(["plan", "smollm2_fp8kv", "--probe-dir", str(out), "--full"]) == 0
        assert f"keeping layers {best['keep']} in bf16" in " ".join(capsys.readouterr().out.split())  # wrapped


def test_mixed_cache_stores_skipped_layers_in_16_bit() -> None:
    """QuantizedKVCache(keep_layers=...) stores those layers as bf16: SmolLM2 fp8 with layers 0 and 29 kept is
    12,288 bytes/token, the figure vLLM's allocator reported for --kv-cache-dtype-skip-layers 0 29."""
    import torch
    from transformers import LlamaConfig

    from trtkv.kvcache.cache import QuantizedKVCache

    cfg = LlamaConfig(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
                      head_dim=64)
    cache = QuantizedKVCache(cfg, "fp8", [1.0] * 30, [1.0] * 30, keep_layers=[0, 29])
    for layer in range(30):
        cache.update(torch.randn(1, 3, 5, 64), torch.randn(1, 3, 5, 64), layer)
    assert cache.bytes_per_token() == 12288
    with pytest.raises(Exception, match="do not exist"):
        QuantizedKVCache(cfg, "fp8", [1.0] * 30, [1.0] * 30, keep_layers=[30])


def test_serving_asks_the_recipe_rules_per_engine_and_gpu() -> None:
    """Which engines serve a probed configuration comes from the same rules `trtkv build` applies."""
    from trtkv.platform.gpu_capabilities import ONE_PER_SM
    from trtkv.platform.hardware import GPU, GPU_SPECS
    from trtkv.probe.serving import served_by, serving, usable_gpus

    recipe = load_recipe("smollm2_fp8kv")  # FP8 weights: no A100 (SM80) or A10 (SM86)
    fp8_gpus = [g.value for g in ONE_PER_SM if GPU_SPECS[g].has_fp8]  # one GPU per compute capability
    assert fp8_gpus == ["L40S", "H100-80GB", "B200", "B300", "RTX-PRO-6000", "GB10"]
    fp8 = serving(recipe, "fp8")
    assert fp8["engines"] == {b: fp8_gpus for b in ("tensorrt", "llmapi", "vllm", "sglang")}
    mixed = serving(recipe, "fp8", [0, 29])
    assert list(mixed["engines"]) == ["vllm"] and "kv_skip_layers" in mixed["why_not"]["tensorrt"]
    int8 = serving(recipe, "int8")
    below_sm100 = [g for g in fp8_gpus if GPU_SPECS[GPU(g)].sm < (10, 0)]
    assert int8["engines"] == {"tensorrt": below_sm100}  # trtllm-build refuses it on SM>=100
    nvfp4 = [g for g in fp8_gpus if GPU_SPECS[GPU(g)].nvfp4_kv]
    assert nvfp4 == ["B200", "B300"] and serving(recipe, "nvfp4")["engines"] == {"llmapi": nvfp4, "sglang": nvfp4}
    assert serving(recipe, "int8_token")["engines"] == {} and served_by(serving(recipe, "kivi4")) == "no engine"
    usable = usable_gpus([fp8, int8])
    assert usable == fp8_gpus
    assert served_by(int8, usable) == "tensorrt (L40S, H100-80GB)" and served_by(mixed, usable) == "vllm"
    on_h100 = load_recipe("smollm2_fp8kv", ["hardware.gpu=H100-80GB", "build.backend=tensorrt"])
    assert serving(on_h100, "fp8")["gpus"] == ["H100-80GB"]  # a GPU recipe is asked about its own GPU only


def test_plan_advice_names_another_served_format(tmp_path: Path) -> None:
    """When the per-layer analysis recommends another uniform format (int8 on the engine path), `trtkv plan` says
    which setting and which engine."""
    from trtkv.measures.probe_results import per_layer_advice

    uniform = {"label": "fp8", "keep": [], "bytes_per_token": 11520, "kl_longest": 0.034}
    best = {"label": "int8", "keep": None, "bytes_per_token": 11520, "kl_longest": 0.029}
    doc = {"format": "fp8", "keep_format": "bf16", "longest_length": 8192, "uniform": uniform, "recommended": best,
           "deploy": {"quantization.kv_cache": "int8", "served_by": "tensorrt (H100-80GB, H200-141GB, L40S)"}}
    (tmp_path / "per_layer_fp8.json").write_text(json.dumps(doc))
    advice = per_layer_advice(load_recipe("smollm2_fp8kv"), tmp_path) or ""
    assert "uniform int8 costs +0% bytes/token and leaves 85% of uniform fp8's KL" in advice
    assert "quantization.kv_cache=int8 (served by tensorrt (H100-80GB, H200-141GB, L40S))" in advice
    doc["recommended"] = uniform
    (tmp_path / "per_layer_fp8.json").write_text(json.dumps(doc))
    assert per_layer_advice(load_recipe("smollm2_fp8kv"), tmp_path) is None


def test_printed_probe_table_aligns_long_format_names() -> None:
    from trtkv.measures.probe_results import summary_lines

    lines = summary_lines([record("fp16", 512, 0.0), record("turboquant_k3v4_nc", 512, 0.2)])
    assert len({line.index(" @ ") for line in lines}) == 1  # 11 characters wide cut the 18-character name short


def test_engine_format_sentences_are_computed_from_both_measured_records() -> None:
    from trtkv.measures.probe_results import engine_format_notes

    recs = [record("int8", 256, 0.02, 0.0, 1000), record("int8", 1024, 0.09, 3e-5, 1000),
            record("int8_per_token_head", 256, 0.001, None, 1060), record("int8_per_token_head", 1024, 0.002, None, 1060),
            record("fp8", 1024, 0.004), record("fp8_cast", 1024, 0.012)]
    notes = engine_format_notes(recs)
    assert len(notes) == 2
    assert notes[0].startswith("On vLLM >= 0.32.0 (`--kv-cache-dtype int8_per_token_head`), `int8_per_token_head` is "
                               "the INT8 to use: KL 0.00200 vs 0.09000")
    assert "clips 3.00e-05 of K/V elements at 1024 tokens and beyond" in notes[0]
    assert "`fp8_cast`" in notes[1] and "KL 0.01200 vs 0.00400 for calibrated `fp8`" in notes[1] and "x3.0" in notes[1]
    # only one of a pair measured: no sentence; a dynamic INT8 that loses is said so
    assert engine_format_notes([record("int8", 1024, 0.01), record("fp8", 1024, 0.01)]) == []
    lost = engine_format_notes([record("int8", 512, 0.001, 0.0), record("int8_per_token_head", 512, 0.01)])
    assert "did not beat static INT8" in lost[0] and "clipped nothing up to 512 tokens" in lost[0]


def test_plan_advice_and_verdicts_carry_the_engine_sentences(tmp_path: Path) -> None:
    from trtkv.measures.probe_results import probe_advice
    from trtkv.probe.outputs import verdicts

    recs = [record("fp16", 512, 0.0), record("fp8", 512, 0.004), record("fp8_cast", 512, 0.012)]
    recipe = load_recipe("smollm2_fp8kv")
    doc = probe_doc(recs, recipe.name, settings={"formats": ["fp16", "fp8", "fp8_cast"]}, reference="fp16", needles=[])
    assert any("ModelOpt's default `fp8_cast`" in v for v in verdicts(doc))
    import trtkv.measures.probe_results as results

    hit = (tmp_path, doc)
    orig = results.find_probe
    results.find_probe = lambda *_a, **_k: hit  # type: ignore[assignment]
    try:
        advice = probe_advice(recipe, tmp_path)
    finally:
        results.find_probe = orig  # type: ignore[assignment]
    assert advice is not None and any("ModelOpt's default `fp8_cast`" in line for line in advice[0])


def test_per_layer_cache_key_follows_the_format_numerics(monkeypatch: pytest.MonkeyPatch) -> None:
    """trtkv/probe/layers.py keys its cached passes by numerics_key: a changed table row misses the old cache."""
    import copy

    from trtkv.kvcache import engines
    from trtkv.kvcache.formats import KVFormat
    from trtkv.kvcache.names import parse_format
    from trtkv.probe.layer_passes import per_layer_key

    class Scales:
        k_amax, v_amax = [1.0], [1.0]

    choice = parse_format("int8_per_token_head")
    before = per_layer_key("m", choice, Scales(), KVFormat.BF16)
    assert per_layer_key("m", choice, Scales(), KVFormat.BF16) == before
    doc = json.loads(engines.TABLE_PATH.read_text())
    changed = copy.deepcopy(doc)
    changed["formats"]["int8_per_token_head"]["numerics"]["rounding"] = "round half to even"
    monkeypatch.setattr(engines, "load_table", lambda *_a: engines.parse_table(changed))
    assert per_layer_key("m", choice, Scales(), KVFormat.BF16) != before


def test_probe_calibration_cache_keeps_fp8_affines_bias_and_amax(tmp_path: Path, engines_tmp: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's short calibration pass carries fp8_affine's per-layer bias and amax through calibration.json: a
    second probe reads them back bit for bit instead of calibrating again."""
    from types import SimpleNamespace

    import torch

    from trtkv.kvcache.affine import AffineCalibration, AffineCollector
    from trtkv.kvcache.numerics import AffineScale
    from trtkv.kvcache.scales import KVScales
    from trtkv.kvcache.stats import KVStats
    from trtkv.probe import measure
    from trtkv.probe.setup import Loaded, ProbeSettings

    calls: list[int] = []

    def short_pass(model, tokenizer, texts, **kw) -> KVScales:  # noqa: ANN001, ANN003
        calls.append(1)
        keys, values = AffineCollector(), AffineCollector()
        for seed in range(2):
            x = torch.randn(2, 3, 16, 64, generator=torch.Generator().manual_seed(seed)) + 0.3
            keys.collect(x)
            values.collect(x / 3)
        affine = AffineCalibration.from_collectors([keys], [values])
        return KVScales(k_amax=[5.0], v_amax=[2.0], source="short pass", affine=affine,
                        stats=KVStats(layers=[], tokens=64, head_dim=64, kv_heads=3))

    monkeypatch.setattr(measure, "calibrate_scales", short_pass)
    monkeypatch.setattr("trtkv.core.texts.load_texts", lambda name: [])
    recipe = load_recipe("smollm2_fp8kv")
    loaded = Loaded(model=SimpleNamespace(config=SimpleNamespace(num_hidden_layers=1)), tokenizer=None,
                    device=torch.device("cpu"), model_dir=tmp_path, text_ids=[], haystack_ids=[], key="m")
    settings = ProbeSettings(formats=["fp8_affine"], lengths=[64], needle_lengths=[], needle_depths=[], needle_seeds=1)
    first = measure.probe_scales(recipe, loaded, settings, tmp_path)
    again = measure.probe_scales(recipe, loaded, settings, tmp_path)
    assert len(calls) == 1 and first.affine is not None and again.affine is not None
    assert again.affine.k_amax == first.affine.k_amax and again.affine.v_amax == first.affine.v_amax
    assert torch.equal(again.affine.k_bias[0], first.affine.k_bias[0])
    ks, vs = again.for_format("fp8_affine")
    assert ks is not None and isinstance(ks[0], AffineScale) and float(ks[0]) == first.affine.k_amax[0] / 448


def test_static_scale_cache_key_covers_the_amaxes_each_format_reads() -> None:
    """fp8_attn_head's per-head and nvfp4_rotate's rotated-K amaxes are in their cache keys (a changed calibration
    misses); every other format's key is the old hash of [k_amax, v_amax, affine], so its cached results stay valid."""
    import hashlib

    from trtkv.kvcache.names import all_format_names, parse_format
    from trtkv.kvcache.scales import KVScales
    from trtkv.probe.sweep_cache import scales_key

    base = {"k_amax": [10.0, 3.5], "v_amax": [2.0, 1.25], "source": "short pass"}
    a = KVScales(**base, k_head_amax=[[9.0, 10.0], [3.5, 1.0]], v_head_amax=[[2.0, 1.5], [1.0, 1.25]],
                 k_rotated_amax=[4.0, 2.0])
    b = KVScales(**base, k_head_amax=[[10.0, 10.0], [3.5, 1.0]], v_head_amax=a.v_head_amax, k_rotated_amax=[4.0, 2.0])
    c = KVScales(**base, k_head_amax=a.k_head_amax, v_head_amax=a.v_head_amax, k_rotated_amax=[4.5, 2.0])
    old = hashlib.sha256(json.dumps([base["k_amax"], base["v_amax"], None]).encode()).hexdigest()[:12]
    for name in all_format_names():
        choice = parse_format(name)
        keys = {scales_key(s, choice) for s in (a, b, c)}
        if name == "fp8_attn_head":
            assert scales_key(a, choice) != scales_key(b, choice) and scales_key(a, choice) == scales_key(c, choice)
        elif name == "nvfp4_rotate":
            assert scales_key(a, choice) != scales_key(c, choice) and scales_key(a, choice) == scales_key(b, choice)
        else:
            assert keys == {old}, name
    fp8, head = parse_format("fp8"), parse_format("fp8_attn_head")
    assert scales_key(a, fp8) == scales_key(a) == old != scales_key(a, fp8, head)  # the decode key of several


def test_fp8_attn_head_is_probed_by_its_recipe_and_named_in_the_advice(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The deployable per-head recipe probes fp8_attn_head (the CPU SmolLM2 recipes do not: make test/demo stay as they
    were); its advice names it as vLLM's per-head format against per-layer fp8, and says when it was not probed."""
    import trtkv.measures.probe_results as results
    from trtkv.measures.probe_results import engine_format_notes, probe_advice, recipe_probe_format
    from trtkv.probe.setup import default_settings

    recipe = load_recipe("llama70b_fp8kv_attnhead_vllm")
    assert "fp8_attn_head" in recipe.probe.formats and "fp8_attn_head" in default_settings(recipe).formats
    assert recipe_probe_format(recipe) == "fp8_attn_head" and recipe_probe_format(load_recipe("smollm2_fp8kv")) == "fp8"
    for cpu in Path("recipes").glob("smollm2*.yaml"):
        assert "fp8_attn_head" not in load_recipe(cpu.stem).probe.formats, cpu
    (note,) = engine_format_notes([record("fp8", 1024, 0.004), record("fp8_attn_head", 1024, 0.002)])
    assert note.startswith("Per-head static FP8 scales `fp8_attn_head` on vLLM 0.32.0 (`--kv-cache-dtype fp8` with k/v "
                           "scales per KV head) beats per-layer `fp8` on this model: KL 0.00200 vs 0.00400 at 1024")
    assert "quantization.kv_cache: fp8_attn_head" in note
    assert "does not beat" in engine_format_notes([record("fp8", 64, 0.001), record("fp8_attn_head", 64, 0.002)])[0]
    for fmts, probed in ((["fp16", "fp8"], False), (["fp16", "fp8", "fp8_attn_head"], True)):
        doc = probe_doc([record(f, 512, 0.001 * i) for i, f in enumerate(fmts)], recipe.name, reference="fp16",
                        needles=[], settings={"formats": fmts})
        monkeypatch.setattr(results, "find_probe", lambda *_a, d=doc, **_k: (tmp_path, d))
        lines = probe_advice(recipe, tmp_path)[0]  # type: ignore[index]
        assert any("KV format fp8_attn_head was not probed" in line for line in lines) is not probed, lines
        assert any("`fp8_attn_head` on vLLM" in line for line in lines) is probed
    cast = load_recipe("smollm2_fp8kv", ["quantization.kv_cache=fp8_cast", "build.backend=vllm"])
    doc = probe_doc([record("fp16", 512, 0.0), record("fp8_scale1", 512, 0.01)], reference="fp16", needles=[])
    monkeypatch.setattr(results, "find_probe", lambda *_a, **_k: (tmp_path, doc))
    assert not any("not probed" in line for line in probe_advice(cast, tmp_path)[0])  # type: ignore[index]


def test_per_layer_cache_key_covers_the_amaxes_each_format_reads() -> None:
    """`trtkv probe --per-layer` keys its passes by the same extra amaxes as the sweep (other formats unchanged)."""
    from trtkv.kvcache.formats import KVFormat
    from trtkv.kvcache.names import parse_format
    from trtkv.kvcache.scales import KVScales
    from trtkv.probe.layer_passes import per_layer_key

    base = {"k_amax": [10.0, 3.5], "v_amax": [2.0, 1.25], "source": "short pass"}
    a = KVScales(**base, k_head_amax=[[9.0, 10.0], [3.5, 1.0]], v_head_amax=[[2.0, 1.5], [1.0, 1.25]])
    b = KVScales(**base, k_head_amax=[[10.0, 10.0], [3.5, 1.0]], v_head_amax=a.v_head_amax)
    head, fp8 = parse_format("fp8_attn_head"), parse_format("fp8")
    assert per_layer_key("m", head, a, KVFormat.BF16) != per_layer_key("m", head, b, KVFormat.BF16)
    assert per_layer_key("m", fp8, a, KVFormat.BF16) == per_layer_key("m", fp8, b, KVFormat.BF16)


def test_engine_attention_records_are_shown_beside_cache_only_and_quoted_by_the_plan(engines_tmp: Path) -> None:
    """probe.json's attention_records (same format and length, another attention) and drift: a side-by-side table and a
    drift table in probe.md, printed lines, and the planner's sentence; a probe.json from before (no attention fields)
    still reads: its records are cache-only."""
    from trtkv.measures.probe_attention import advice_lines, markdown_section, summary_lines

    folder = engines_tmp / "smollm2_fp8kv" / "probe"
    _fake_probe(folder, "smollm2_fp8kv")
    raw = json.loads((folder / "probe.json").read_text())
    for r in raw["records"]:  # as written before the engine modes: no attention key
        del r["attention"]
    (folder / "probe.json").write_text(json.dumps(raw))
    old = ProbeDoc.load(folder)
    assert old is not None and old.attention is None and {r.attention for r in old.records} == {"cache_only"}
    assert markdown_section(old)[2] == "Measured cache-only only." and advice_lines(old) == []
    fp8 = next(r for r in raw["records"] if r["format"] == "fp8")
    engine = {**fp8, "kl_mean": 0.005, "top1_agreement": 0.97, "attention": "vllm_fa3_fp8"}
    doc = {**raw, "attention_records": [engine],
           "attention": {"modes": ["cache_only", "vllm_fa3_fp8"], "reasons": {"vllm_fa3_fp8": "auto: FA3 on SM90"}},
           "drift": [{"format": "fp8", "attention": "vllm_fa3_fp8", "prompt_tokens": 1024, "decode_steps": 32,
                      "mean_abs_dlogp": 0.01, "max_abs_dlogp": 0.2, "kl_mean": 1e-4, "top1_agreement": 0.97,
                      "exact_zero": False}]}
    (folder / "probe.json").write_text(json.dumps(doc))
    new = ProbeDoc.model_validate(doc)
    text = "\n".join(markdown_section(new))
    assert "| fp8 | 4096 | vllm_fa3_fp8 | 0.00200 | 0.00500 | x2.50 |" in text and "### Prefill vs decode" in text
    assert any("vllm_fa3_fp8 0.00500 (x2.50)" in line for line in summary_lines(new))
    lines, _ = probe_advice(load_recipe("smollm2_fp8kv"))
    assert any(line.startswith("fp8 with vllm_fa3_fp8 attention") and "x2.50" in line for line in lines)
