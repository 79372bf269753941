"""A checkpoint's quantization recognised from its own files (config.json's quantization_config, ModelOpt's
hf_quant_config.json): the weight format per tensor group and the KV scheme it declares, for each format in the
shapes their writers produce (ModelOpt 0.47 export/convert_hf_config.py, compressed-tensors' QuantizationConfig,
the published DeepSeek-V3 and gpt-oss configs in tests/data/configs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtkv.checkpoints import declared_kv_algo, read_model_facts
from trtkv.checkpoints.checkpoint_quant import read_checkpoint_quant
from trtkv.checkpoints.hf_config_fields import ModelConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
# ModelOpt 0.47's convert_hf_quant_config_format for FP8 with FP8 KV (config.json's quantization_config)
MODELOPT_FP8 = {"config_groups": {"group_0": {"input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                                              "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
                                              "targets": ["Linear"]}},
                "ignore": ["lm_head"], "quant_algo": "FP8",
                "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
                "producer": {"name": "modelopt", "version": "0.47.0"}, "quant_method": "modelopt"}
# compressed-tensors FP8 dynamic (llm-compressor's FP8_DYNAMIC preset: per-channel weights, per-token activations)
CT_FP8_DYNAMIC = {"quant_method": "compressed-tensors", "format": "float-quantized",
                  "config_groups": {"group_0": {"targets": ["Linear"],
                                                "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                            "symmetric": True, "dynamic": False},
                                                "input_activations": {"num_bits": 8, "type": "float",
                                                                      "strategy": "token", "dynamic": True}}},
                  "ignore": ["lm_head", "re:.*mlp.gate$"],
                  "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "attn_head", "dynamic": False,
                                      "symmetric": True}}
CT_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                      "group_size": 128, "symmetric": True}}},
            "ignore": ["lm_head", "re:.*self_attn.*"]}
CT_NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                      "group_size": 16}}},
            "ignore": ["lm_head"], "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
LINEAR = {"experts": "x", "attention": "x", "embeddings": "unquantized", "other": "x"}


def _formats(fmt: str, **unquantized: str) -> dict[str, str]:
    return {g: unquantized.get(g, fmt if v == "x" else v) for g, v in LINEAR.items()}


@pytest.mark.parametrize(("quant", "method", "formats", "kv"), [
    (MODELOPT_FP8, "modelopt", _formats("fp8"), "fp8 per tensor"),
    ({**MODELOPT_FP8, "quant_algo": "NVFP4", "kv_cache_scheme": "NVFP4"}, "modelopt", _formats("nvfp4"), "nvfp4"),
    ({"quant_method": "modelopt", "quant_algo": "W4A16_AWQ", "ignore": ["lm_head", "*self_attn*"]}, "modelopt",
     _formats("int4_awq", attention="unquantized"), None),
    (CT_FP8_DYNAMIC, "compressed-tensors", _formats("fp8"), "fp8 per head"),
    (CT_W4A16, "compressed-tensors", _formats("int4", attention="unquantized"), None),
    (CT_NVFP4, "compressed-tensors", _formats("nvfp4"), "fp8 per tensor"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}, "fp8",
     _formats("fp8_block"), None),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, "awq", _formats("int4_awq"), None),
    ({"quant_method": "gptq", "bits": 4, "group_size": 32}, "gptq", _formats("int4_gptq"), None),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}, "mxfp4",
     {"experts": "mxfp4", "attention": "unquantized", "embeddings": "unquantized", "other": "unquantized"}, None),
])
def test_each_format_is_recognised_per_group_with_its_kv_scheme(quant: dict, method: str, formats: dict,
                                                                kv: str | None) -> None:
    notes: list[str] = []
    q = read_checkpoint_quant(quant, None, notes)
    assert q is not None and not notes
    assert (q.method, q.formats, q.kv_cache) == (method, formats, kv)
    quantized = next(f for f in formats.values() if f != "unquantized")
    assert q.stored_format == (method if method in ("fp8", "mxfp4", "awq", "gptq") else quantized)


def test_bytes_per_weight_follow_the_format() -> None:
    def per(quant: dict) -> float:
        q = read_checkpoint_quant(quant, None, [])
        assert q is not None
        return q.weight_bytes
    assert per(MODELOPT_FP8) == 1.0
    assert per({**MODELOPT_FP8, "quant_algo": "NVFP4"}) == 0.5 + 1 / 16  # E2M1 + an E4M3 scale per 16
    assert per({"quant_method": "modelopt", "quant_algo": "W4A16_AWQ", "group_size": 64}) == 0.5 + 4 / 64
    assert per(CT_W4A16) == 0.5 + 2 / 128
    assert per({"quant_method": "fp8", "weight_block_size": [128, 128]}) == 1 + 4 / 128**2


def test_modelopt_hf_quant_config_alone_is_read(tmp_path: Path) -> None:
    """Older ModelOpt exports carry hf_quant_config.json and no quantization_config in config.json."""
    (tmp_path / "config.json").write_text((CONFIGS / "llama3_1_8b" / "config.json").read_text())
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt", "version": "0.19.0"},
         "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                          "exclude_modules": ["lm_head"]}}))
    facts = read_model_facts(tmp_path)
    assert facts.quant is not None and facts.quant.method == "modelopt"
    assert facts.quant.formats["attention"] == "nvfp4" and facts.quant.kv_cache == "fp8 per tensor"
    assert "hf_quant_config.json" in facts.quant.source
    (tmp_path / "hf_quant_config.json").write_text("[1]")
    with pytest.raises(ModelConfigError, match="hf_quant_config.json: the top level is list, not an object"):
        read_model_facts(tmp_path)


def test_kv_only_exports_leave_the_weights_unquantized() -> None:
    for quant in ({"quant_method": "compressed-tensors", "config_groups": {}, "ignore": [],
                   "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "attn_head"}},
                  {"quant_method": "modelopt", "quant_algo": None,
                   "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False}}):
        q = read_checkpoint_quant(quant, None, [])
        assert q is not None and q.quantized == "none" and set(q.formats.values()) == {"unquantized"}
        assert q.kv_cache in ("fp8 per head", "fp8 per tensor")
        assert q.stored_format is None  # 16-bit weights: nothing for model.checkpoint_quant to record


def test_unknown_methods_are_a_note_not_a_price() -> None:
    notes: list[str] = []
    assert read_checkpoint_quant({"quant_method": "bitsandbytes"}, None, notes) is None
    assert "quant_method bitsandbytes: not priced as stored" in notes[0]
    notes = []
    assert read_checkpoint_quant({"quant_method": "modelopt", "quant_algo": "INT8_SQ"}, None, notes) is None
    assert "quant_algo 'INT8_SQ' is not priced as stored" in notes[0]


def test_published_configs_keep_their_stored_price() -> None:
    """DeepSeek-V3 (fp8 128x128 blocks) and gpt-oss (mxfp4 experts) as published."""
    ds = read_model_facts(CONFIGS / "deepseek_v3").quant
    assert ds is not None and ds.formats["experts"] == "fp8_block" and ds.formats["embeddings"] == "unquantized"
    oss = read_model_facts(CONFIGS / "gpt_oss_120b").quant
    assert oss is not None and oss.quantized == "experts" and oss.formats["attention"] == "unquantized"


def test_the_kv_declaration_is_read_as_tensorrt_llm_reads_it(tmp_path: Path) -> None:
    """Issue 51: hf_quant_config.json's kv_cache_quant_algo wins where present (its 'none'/'null' spellings: none), else what
    config.json's quantization_config declares."""
    folder = tmp_path
    (folder / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}))
    assert declared_kv_algo(folder, "fp8 per tensor") == "FP8"
    for spelling in ("none", "NULL", " ", None):
        (folder / "hf_quant_config.json").write_text(json.dumps(
            {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": spelling}}))
        assert declared_kv_algo(folder, "fp8 per tensor") is None, spelling
    (folder / "hf_quant_config.json").unlink()
    assert declared_kv_algo(folder, "fp8 per tensor") == "fp8 per tensor"
    assert declared_kv_algo(folder, None) is None
