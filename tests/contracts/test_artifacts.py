"""The typed stage outputs (trtkv.contracts.artifacts): round trips, clear errors, and the documents the stages write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.probe_records import probe_json, record_dict
from trtkv.contracts.artifacts import KVScalesFile, Manifest, ServerRecord
from trtkv.contracts.bench_doc import BenchResults
from trtkv.contracts.probe_doc import ProbeDoc
from trtkv.core.errors import StageError
from trtkv.kvcache.scales import kv_scales_document


def test_server_record_round_trip_and_errors(tmp_path: Path) -> None:
    record = ServerRecord(pid=12, host="0.0.0.0", http_port=1, grpc_port=2, metrics_port=3, command=["tritonserver"],
                          log="x.log", model_repository="repo", started_at="now")
    record.save(tmp_path)
    loaded = ServerRecord.load(tmp_path)
    assert loaded == record and loaded.client_host == "127.0.0.1" and loaded.http_url == "http://0.0.0.0:1"
    assert ServerRecord.load(tmp_path / "nothing") is None
    (tmp_path / "server.json").write_text(json.dumps({"pid": "twelve"}))
    with pytest.raises(StageError, match=r"server.json is not a valid server.json.*Next: rerun `trtkv serve`"):
        ServerRecord.load(tmp_path)


def test_server_record_names_its_frontend_and_reads_older_records(tmp_path: Path) -> None:
    """The frontend and the model an OpenAI frontend serves are fields; a server.json written before they were
    (under "extra") reads the same, and one without them is a tritonserver's."""
    base = {"pid": 12, "host": "127.0.0.1", "http_port": 1, "grpc_port": 2, "metrics_port": 3, "command": ["vllm"],
            "log": "x.log", "model_repository": "", "started_at": "now"}
    (tmp_path / "server.json").write_text(json.dumps({**base, "extra": {"frontend": "vllm", "served_model_name": "m"}}))
    older = ServerRecord.load(tmp_path)
    assert older is not None and (older.frontend, older.served_model_name) == ("vllm", "m")
    assert "extra" not in older.document()
    older.save(tmp_path)
    assert ServerRecord.load(tmp_path) == older
    (tmp_path / "server.json").write_text(json.dumps({**base, "extra": {}}))
    triton = ServerRecord.load(tmp_path)
    assert triton is not None and (triton.frontend, triton.served_model_name) == ("tritonserver", None)


def test_kv_scales_file_reads_what_calibrate_writes(tmp_path: Path) -> None:
    kv_scales_document("INT8", [3.0, 1.0], [0.5, 2.0]).save(tmp_path)
    scales = KVScalesFile.load(tmp_path)
    assert scales is not None and scales.kv_cache_quant_algo == "INT8" and scales.num_layers == 2
    assert [x.k_amax for x in scales.layers] == [3.0, 1.0]
    kv_scales_document(None, [], [], num_layers=30).save(tmp_path)
    none = KVScalesFile.load(tmp_path)
    assert none is not None and none.layers == [] and none.kv_cache_quant_algo is None


def test_kv_scales_json_is_the_model_calibrate_builds(tmp_path: Path) -> None:
    """One model for the writer and the reader: the file is exactly the loaded model's document, keys in order."""
    doc = kv_scales_document("FP8", [3.0, 1.0], [0.5, 2.0])
    assert isinstance(doc, KVScalesFile)
    doc.save(tmp_path)
    text = (tmp_path / "kv_scales.json").read_text()
    loaded = KVScalesFile.load(tmp_path)
    assert loaded == doc and text == json.dumps(loaded.document(), indent=2) + "\n"
    assert list(json.loads(text)) == ["kv_cache_quant_algo", "num_layers", "convention", "layers"]  # no source
    sourced = kv_scales_document("FP8", [1.0], [1.0], source="probe pass").document()
    assert list(sourced) == ["kv_cache_quant_algo", "num_layers", "convention", "source", "layers"]


def test_a_stage_manifest_is_the_model_run_stage_builds(tmp_path: Path) -> None:
    from trtkv.contracts.stage import run_stage
    from trtkv.recipe import load_recipe

    out = tmp_path / "stage"
    result = run_stage("repo", load_recipe("smollm2_fp8kv"), out, lambda tmp: {"models": ["a"]}, log=lambda _m: None)
    text = (out / "manifest.json").read_text()
    loaded = Manifest.load(out)
    assert loaded is not None and text == json.dumps(loaded.document(), indent=2) + "\n"
    assert list(json.loads(text)) == ["stage", "recipe", "recipe_path", "key", "recipe_hash", "input_dir",
                                      "input_manifest_hash", "resolved_recipe", "tool_versions", "wall_seconds",
                                      "finished_at", "files", "models"]
    assert result.manifest == loaded.document() and loaded.model_extra == {"models": ["a"]}
    again = run_stage("repo", load_recipe("smollm2_fp8kv"), out, lambda tmp: {}, log=lambda _m: None)
    assert again.skipped and again.manifest == result.manifest  # the key read back through the model matches
    # a stage that writes its own manifest writes what it sets (serve, probe, report: no up-to-date key)
    Manifest(stage="report", recipe="r", key=None, wall_seconds=0.5, inputs=["bench"]).save(tmp_path)
    assert list(json.loads((tmp_path / "manifest.json").read_text())) == ["stage", "recipe", "key", "wall_seconds",
                                                                          "inputs"]


def test_a_manifest_types_its_file_list_and_writes_it_back_byte_for_byte(tmp_path: Path) -> None:
    """files: name -> ListedFile (bytes, sha256, mtime_ns; a symbolic link: its target only); key and
    resolved_recipe: JSON objects. What run_stage writes loads and is written back byte for byte (the next stage keys
    on the manifest's hash), and a listing entry of another shape is refused where it is read, naming it."""
    import hashlib

    from trtkv.contracts.stage import run_stage
    from trtkv.recipe import load_recipe

    def work(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        (tmp / "weights").symlink_to("config.json")

    out = tmp_path / "stage"
    run_stage("repo", load_recipe("smollm2_fp8kv"), out, work, log=lambda _m: None)
    text = (out / "manifest.json").read_text()
    loaded = Manifest.load(out)
    assert loaded is not None and loaded.files is not None and text == json.dumps(loaded.document(), indent=2) + "\n"
    listed = loaded.files["config.json"]
    assert (listed.bytes, listed.sha256, listed.link) == (2, hashlib.sha256(b"{}").hexdigest(), None)
    assert json.loads(text)["files"]["weights"] == {"link": "config.json"} and loaded.files["weights"].bytes is None
    assert loaded.key is not None and loaded.key["stage"] == "repo" and loaded.resolved_recipe is not None
    doc = json.loads(text)
    doc["files"]["config.json"]["bytes"] = "two"
    (out / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(StageError, match=r"files\.config\.json\.bytes: .*Next: rerun the stage"):
        Manifest.load(out)
    with pytest.raises(ValueError, match="not a valid JSON value"):
        Manifest(stage="x", key={"input": tmp_path})


def test_big_documents_keep_what_they_do_not_type(tmp_path: Path) -> None:
    Manifest(stage="probe", recipe="r", wall_seconds=1.5, settings={"lengths": [64]}).save(tmp_path)
    manifest = Manifest.load(tmp_path)
    assert manifest is not None and manifest.wall_seconds == 1.5 and manifest.model_extra == {"settings": {"lengths": [64]}}
    ProbeDoc.model_validate(probe_json([record_dict("fp8", 64, 0.01)], scales={"source": "s"}, kv_stats=None,
                                       future={"a": 1})).save(tmp_path)
    probe = ProbeDoc.load(tmp_path)
    assert probe is not None and probe.scales is not None and probe.scales.source == "s"
    assert probe.model_dump()["kv_stats"] is None and probe.model_extra == {"future": {"a": 1}}
    BenchResults.model_validate({"levels": {"concurrency=1": {}}, "records": []}).save(tmp_path)
    results = BenchResults.load(tmp_path)
    assert results is not None and list(results.levels) == ["concurrency=1"] and results.partial is False


def test_a_level_metric_of_another_shape_is_refused_with_the_rerun(tmp_path: Path) -> None:
    """levels are typed (BenchLevel): a metric whose stat is not a number is one error naming where, and how to rerun."""
    (tmp_path / "results.json").write_text(json.dumps({"levels": {"concurrency=1": {
        "time_to_first_token": {"unit": "ms", "p50": "fast"}}}}))
    with pytest.raises(StageError, match=r"levels\.concurrency=1\.time_to_first_token\.p50: .*rerun `trtkv bench`"):
        BenchResults.load(tmp_path)


def test_results_typed_parts_load_older_files_and_write_them_back_unchanged(tmp_path: Path) -> None:
    """results.json's kv_pool, slo.results and each level's client.per_worker are models now (they were
    dict[str, Any]); a file written before, with a read-back that failed (kv_pool without served_* keys) and an SLO
    entry without "source", loads, reads by field, and is written back key for key, in its order."""
    older = {
        "schema": "trtkv.bench/1", "recipe": "smollm2_fp8kv",
        "levels": {"concurrency=1": {"client": {"workers": 1, "per_worker": [
            {"worker": 0, "pid": 41, "streams": 1, "requests": 4, "output_tokens": 64, "cpu_seconds": 0.5,
             "cpu_cores": 0.1, "cpu_us_per_token": 7812.5, "lag_ms": {"unit": "ms", "p50": 0.1, "p99": 0.4,
                                                                       "max": 0.5, "count": 60}}]}}},
        "slo": {"passed": False, "results": [{"slo": "time_to_first_token.p99<=500", "where": "concurrency=1",
                                             "measured": 612.0, "passed": False}]},
        "kv_pool": {"planned_bytes_per_gpu": None, "source": "not read: connection refused", "warning": None},
    }
    (tmp_path / "results.json").write_text(json.dumps(older))
    loaded = BenchResults.load(tmp_path)
    assert loaded is not None and loaded.kv_pool is not None and loaded.slo is not None
    assert loaded.kv_pool.served_bytes_per_gpu is None and loaded.kv_pool.source == "not read: connection refused"
    assert (loaded.slo.results[0].slo, loaded.slo.results[0].measured, loaded.slo.results[0].source) == \
        ("time_to_first_token.p99<=500", 612.0, "")
    client = loaded.levels["concurrency=1"].client
    assert client is not None and client.per_worker[0].lag_ms is not None and client.per_worker[0].lag_ms.p99 == 0.4
    assert json.dumps(loaded.document()) == json.dumps(older)
