"""probe.json through its model (trtkv.contracts.probe_doc): every probe.json under tests/ loads, its readers (the
planner's advice, the printed tables, probe.md) read it by field, and it is written back with nothing lost.

tests/data/probe/<commit>/probe.json are real files, each written by `trtkv probe` at that commit on the packaged
SmolLM2 (formats fp16,int8,kivi2 (+ int8_split and --attention trtllm_fresh_context at 9fc1850), --lengths 64,160,
--needle-lengths 96, --decode-steps 2, probe.needle_seeds=1, probe.needle_depths=[0.5], calibration.num_samples=4,
calibration.seq_len=64): a69c3f5 (2026-11-30: scales as k_amax/v_amax lists, keys in the writer's order), 82d874b
(2026-12-02: before the engine attention modes), 9fc1850 (the writer before the records were typed), 1a66efc (the
writer before the rest was typed; with --ruler-tasks niah_single_1,niah_multikey_2 --ruler-lengths 512
--ruler-samples 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.support.probe_records import probe_doc, probe_json, record, record_dict
from trtkv.contracts.probe_doc import ProbeDoc
from trtkv.core.errors import StageError
from trtkv.measures.probe_attention import markdown_section, summary_lines
from trtkv.measures.probe_results import probe_advice
from trtkv.measures.probe_results import summary_lines as record_lines
from trtkv.probe.outputs import render_markdown
from trtkv.probe.ruler import summary_lines as ruler_lines
from trtkv.recipe import load_recipe

TESTS = Path(__file__).resolve().parents[1]
PROBES = sorted(TESTS.rglob("probe.json"))


def untyped(model: BaseModel, where: str = "") -> list[str]:
    """Every key the model leaves undeclared (kept as written), anywhere in it, as a dotted path."""
    out = [where + key for key in model.model_extra or {}]
    for name in type(model).model_fields:
        value = getattr(model, name)
        parts = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else [(None, value)]
        out += [key for i, v in parts if isinstance(v, BaseModel)
                for key in untyped(v, f"{where}{name}." + ("" if i is None else f"{i}."))]
    return out


def as_read_now(text: str) -> dict:
    """probe.json as this trtkv reads it: before 2026-12-08 `threads` was OMP_NUM_THREADS as set (a string) and each
    RULER format's overall interval was `interval` (now `accuracy_ci`, as every bench task writes it)."""
    doc = json.loads(text)
    if isinstance(doc.get("threads"), str):
        doc["threads"] = int(doc["threads"])
    for name, fmt in (doc.get("ruler") or {}).get("formats", {}).items():
        doc["ruler"]["formats"][name] = {("accuracy_ci" if k == "interval" else k): v for k, v in fmt.items()}
    return doc


def test_the_probe_files_under_tests_are_found() -> None:
    assert {p.parent.name for p in PROBES} >= {"a69c3f5", "82d874b", "9fc1850", "1a66efc"}


@pytest.mark.parametrize("path", PROBES, ids=lambda p: str(p.relative_to(TESTS)))
def test_every_probe_json_under_tests_loads_reads_and_is_written_back_whole(path: Path) -> None:
    doc = ProbeDoc.load(path.parent)
    assert doc is not None and doc.records and doc.scales is not None and doc.scales.source
    assert {r.attention for r in doc.records} == {"cache_only"}  # before the engine modes: cache-only too
    fp16 = next(r for r in doc.records if r.format == "fp16")
    assert fp16.kl_mean == 0.0 and fp16.top1_agreement == 1.0 and fp16.kv_bytes_per_token > 0
    assert doc.scales.layers or "k_amax" in (doc.scales.model_extra or {})  # the oldest: amax lists
    lines, basis = probe_advice(load_recipe("smollm2_fp8kv"), path.parent) or ([], "")
    assert any(line.startswith("int8 at 160 tokens: KL ") for line in lines) and str(path) in basis
    assert len(record_lines(doc.records)) == len(doc.records)
    assert set(untyped(doc)) <= {"scales.k_amax", "scales.v_amax"}  # every key typed but the oldest amax lists
    assert doc.model.source == "packaged:smollm2" and doc.model.num_layers == 30 and doc.model.head_dim == 64
    assert doc.settings.formats == list(dict.fromkeys(r.format for r in doc.records)) and doc.settings.lengths == [64, 160]
    assert {(n.context_len, *n.by_depth) for n in doc.needles} == {(96, "0.5")} and doc.reference == "fp16"
    assert doc.scale_reuse is not None and doc.scale_reuse.decode["int8"].decode_steps == 2
    assert [(b.from_, b.to) for b in doc.scale_reuse.formats["int8"].by_position] == [(0, 64), (64, 160)]
    assert doc.kl_by_position is not None and doc.kl_by_position.window == 256 and "needle.png" in doc.plots
    md = render_markdown(doc, None, [])
    assert "| int8 | 160 |" in md and "## Verdicts" in md and "## Needle retrieval" in md
    assert "| int8 | 0-64 | " in md and "Through decode steps" in md  # scale reuse by position and through decode
    if doc.ruler is not None:  # the bench's RULER items through each format's cache
        assert doc.settings.ruler_tasks == doc.ruler.tasks == ["niah_single_1", "niah_multikey_2"]
        cell = doc.ruler.formats["fp16"].by_length["512"].tasks["niah_single_1"]
        assert cell.n == 2 and cell.score in (0.0, 50.0, 100.0) and len(cell.interval) == 2
        overall = doc.ruler.formats["fp16"]  # written as `interval` there: read as accuracy_ci
        assert overall.accuracy_ci == json.loads(path.read_text())["ruler"]["formats"]["fp16"]["interval"]
        assert "## RULER" in md and "| kivi2 | 512 | " in md and len(ruler_lines(doc)) == 4
    if doc.attention is not None:  # the engine modes: int8 under TensorRT-LLM's kernels beside cache-only
        assert [(r.format, r.attention) for r in doc.attention_records][-1] == ("int8", "trtllm_fresh_context")
        assert "### Prefill vs decode" in "\n".join(markdown_section(doc)) and summary_lines(doc)
    text = path.read_text()
    again = json.dumps(doc.document(), indent=2) + "\n"
    assert json.loads(text)["threads"] == "1" and doc.threads == 1  # OMP_NUM_THREADS as set: read as torch's count
    assert json.loads(again) == as_read_now(text)  # every key kept, the untyped parts as written
    if doc.attention is not None:  # the writer of 1a66efc, byte for byte (key order, ints and floats) but those two
        assert again == json.dumps(as_read_now(text), indent=2) + "\n"


def test_a_record_keeps_its_optional_keys_where_the_probe_wrote_them(tmp_path: Path) -> None:
    """KIVI's window, the note of clip rates, an engine mode's fields, the needles attached last: in that order, and
    only in the records that have them (the model writes no defaults)."""
    kivi = record_dict("kivi2", 160, 0.05, fp16_window_tokens=128, fp16_window_bytes_max=2)
    kivi["attention"] = kivi.pop("attention")  # after the window, as length_record + record_fields write it
    kivi |= {"needle_by_depth": {"0.5": 1.0}, "needle_seeds": 1}
    engine = record_dict("int8", 160, 0.04, 1e-5, k_clip_rate_note="over all tokens")
    del engine["attention"]  # then the mode's three fields (trtkv.probe.attention.record_fields)
    engine |= {"attention": "trtllm_fresh_context", "attention_engine": "tensorrt_llm", "attention_numerics": "x"}
    doc = probe_json([kivi, record_dict("fp16", 160, 0.0)], attention_records=[engine])
    ProbeDoc.model_validate(doc).save(tmp_path)
    written = json.loads((tmp_path / "probe.json").read_text())
    assert [list(r) for r in written["records"]] == [list(kivi), list(record_dict("fp16", 160, 0.0))]
    assert list(written["attention_records"][0]) == list(engine)
    assert written["records"][0]["kv_bytes_per_token"] == 100.0


def test_a_record_of_another_shape_is_refused_naming_where(tmp_path: Path) -> None:
    bad = record_dict("fp8", 64, 0.01)
    del bad["kl_mean"]
    (tmp_path / "probe.json").write_text(json.dumps(probe_json([record_dict("fp16", 64, 0.0), bad])))
    with pytest.raises(StageError, match=r"records\.1\.kl_mean: Field required.*rerun `trtkv probe`"):
        ProbeDoc.load(tmp_path)


def test_probe_doc_helpers_build_what_the_readers_take() -> None:
    doc = probe_doc([record("fp16", 64, 0.0)], reference="bf16")
    assert doc.reference == "bf16" and doc.records[0].positions == 63 and doc.model.num_layers == 30
    assert doc.settings.formats == ["fp16"] and doc.settings.lengths == [64] and doc.model_extra == {}


def test_a_windowed_model_s_window_and_the_needles_of_its_kl_passes_are_typed(tmp_path: Path) -> None:
    """tests/data/probe/gemma3-1a66efc.json: `trtkv probe gemma3_fp8kv` at 1a66efc on the packaged Gemma 3 270M (formats
    fp16,int8,kivi2, --lengths 256,640, --needle-lengths 600, --decode-steps 2, the same overrides): the sliding
    window's fields and the needles each KL pass asked (method, timings), written back byte for byte (`threads` as an
    int)."""
    text = (TESTS / "data" / "probe" / "gemma3-1a66efc.json").read_text()
    (tmp_path / "probe.json").write_text(text)
    doc = ProbeDoc.load(tmp_path)
    assert doc is not None and untyped(doc) == []
    assert doc.model.sliding_window == 512 and doc.model.full_layers == [5, 11, 17]
    assert doc.settings.needle_method == "shared_haystack" == doc.needles[0].method
    assert all(n.context_len == 600 and n.cpu_seconds is not None for n in doc.needles)
    assert "## Needle retrieval" in render_markdown(doc, None, [])
    assert json.dumps(doc.document(), indent=2) + "\n" == json.dumps(as_read_now(text), indent=2) + "\n"
