"""The typed stage outputs (trtkv.contracts.artifacts): round trips, clear errors, and the documents the stages write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtkv.contracts.artifacts import BenchResults, KVScalesFile, Manifest, ProbeDoc, ServerRecord
from trtkv.core.errors import StageError
from trtkv.kvcache.scales import kv_scales_document, write_kv_scales


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


def test_kv_scales_file_reads_what_calibrate_writes(tmp_path: Path) -> None:
    write_kv_scales(tmp_path / "kv_scales.json", kv_scales_document("INT8", [3.0, 1.0], [0.5, 2.0]))
    scales = KVScalesFile.load(tmp_path)
    assert scales is not None and scales.kv_cache_quant_algo == "INT8" and scales.num_layers == 2
    assert [x.k_amax for x in scales.layers] == [3.0, 1.0]
    write_kv_scales(tmp_path / "kv_scales.json", kv_scales_document(None, [], [], num_layers=30))
    none = KVScalesFile.load(tmp_path)
    assert none is not None and none.layers == [] and none.kv_cache_quant_algo is None


def test_big_documents_keep_what_they_do_not_type(tmp_path: Path) -> None:
    Manifest(stage="probe", recipe="r", wall_seconds=1.5, settings={"lengths": [64]}).save(tmp_path)
    manifest = Manifest.load(tmp_path)
    assert manifest is not None and manifest.wall_seconds == 1.5 and manifest.model_extra == {"settings": {"lengths": [64]}}
    ProbeDoc.model_validate({"recipe": "r", "records": [{"format": "fp8"}], "scales": {"source": "s"},
                             "kv_stats": None}).save(tmp_path)
    probe = ProbeDoc.load(tmp_path)
    assert probe is not None and probe.scales is not None and probe.scales.source == "s"
    assert probe.model_dump()["kv_stats"] is None
    BenchResults.model_validate({"levels": {"concurrency=1": {}}, "records": []}).save(tmp_path)
    results = BenchResults.load(tmp_path)
    assert results is not None and list(results.levels) == ["concurrency=1"] and results.partial is False
