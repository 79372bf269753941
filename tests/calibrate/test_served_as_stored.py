"""Issue 51 on the default GPU backend (llmapi, TensorRT-LLM's LLM API): a user's quantized checkpoint goes through
`trtkv init`, `plan`, `calibrate` and `deploy --target k8s` as stored. init moves the KV default to fp8_cast (the
engine runs FP8 KV at scale 1.0 and reads no scale beside stored weights), and calibrate passes the checkpoint on
(its safetensors shards hard-linked into checkpoint/hf, nothing quantized or calibrated) so deploy reads it where it
reads every calibrate output. On main calibrate refused that recipe ("nothing to calibrate") and the chain stopped;
calibrate also refused a checkpoint carrying KV scales the engine reads ("already carries KV-cache scales")."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.quantized_checkpoints import (
    compressed_tensors_checkpoint,
    gpt_oss_mxfp4,
    modelopt_checkpoint,
    qwen3_moe_fp8_block,
)
from trtkv.checkpoints import rope, validate_hf_checkpoint
from trtkv.cli import main
from trtkv.core.errors import StageError
from trtkv.recipe import load_recipe

pytestmark = pytest.mark.slow  # the fixtures' first build is ModelOpt's export (cached by its inputs' hash)
TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def fixtures(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every quantized fixture of tests/support/quantized_checkpoints.py; the two published layouts get SmolLM2's
    tokenizer files (a hub folder holds its own)."""
    root = tmp_path_factory.mktemp("users")
    out = {f"modelopt_{fmt}": modelopt_checkpoint(fmt, smollm2_dir) for fmt in ("fp8", "nvfp4", "int4_awq")}
    for preset in ("FP8_DYNAMIC", "W4A16"):
        ct = compressed_tensors_checkpoint(preset, smollm2_dir)
        if ct is not None:  # needs vLLM's side venv, which ships compressed-tensors
            out[f"ct_{preset.lower()}"] = ct
    for name, build in (("gpt_oss_mxfp4", gpt_oss_mxfp4), ("qwen3_fp8_block", qwen3_moe_fp8_block)):
        folder = build(root / name)
        for file in TOKENIZER:
            shutil.copyfile(smollm2_dir / file, folder / file)
        out[name] = folder
    return out


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, f"trtkv {' '.join(argv)} exited {code}:\n{out[-2000:]}\n{err[-3000:]}"
    return out + err


@pytest.mark.parametrize("name", ["modelopt_fp8", "modelopt_nvfp4", "modelopt_int4_awq", "ct_fp8_dynamic",
                                  "ct_w4a16", "gpt_oss_mxfp4", "qwen3_fp8_block"])
def test_init_plan_calibrate_deploy_on_llmapi_serve_the_weights_as_stored(
        fixtures: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], name: str) -> None:
    if name not in fixtures:
        pytest.skip("needs vLLM's side venv, which ships compressed-tensors (make install-vllm)")
    user = fixtures[name]
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    monkeypatch.setenv("TRTKV_TRITON_REPO", str(tmp_path / "triton_repo"))
    recipe = tmp_path / f"{name}.yaml"
    said = _run(capsys, "init", name, "--model", str(user), "--gpu", "H100-80GB", "--backend", "llmapi",
                "--output", str(recipe))
    text = recipe.read_text()
    assert "weights: none" in text and "checkpoint_quant:" in text
    assert "kv_cache: fp8_cast   # fp8_cast, not fp8" in text and "quantization.kv_cache: fp8_cast, not fp8" in said
    assert "fp8_scale1" in _run(capsys, "plan", str(recipe))
    before = {p.name: (p.stat().st_ino, p.stat().st_size) for p in user.glob("*.safetensors")}
    said = _run(capsys, "calibrate", str(recipe))
    assert "nothing to calibrate, the checkpoint served as stored (kv_cache fp8_cast" in said
    checkpoint = tmp_path / "engines" / name / "checkpoint"
    hf = checkpoint / "hf"
    # the weights as stored: the user's own files (hard links), nothing quantized, nothing added
    assert {p.name: (p.stat().st_ino, p.stat().st_size) for p in hf.glob("*.safetensors")} == before
    assert all(os.path.samefile(user / n, hf / n) for n in before)
    # config.json a copy (never the user's file) with the top-level RoPE fields transformers 4.x reads added
    theirs, served = json.loads((user / "config.json").read_text()), json.loads((hf / "config.json").read_text())
    assert not os.path.samefile(user / "config.json", hf / "config.json")
    assert {k: v for k, v in served.items() if k not in ("rope_theta", "rope_scaling")} == {
        k: v for k, v in theirs.items() if k not in ("rope_theta", "rope_scaling")}
    assert served["rope_theta"] == rope.from_hf(theirs).theta
    assert json.loads((checkpoint / "hf_config.json").read_text()) == theirs
    scales = json.loads((checkpoint / "kv_scales.json").read_text())
    assert scales["kv_cache_quant_algo"] is None and scales["layers"] == []
    assert (checkpoint / "tokenizer" / "tokenizer.json").is_file()
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest["validation"]["stored"]["weight_shards_unchanged"] == sorted(before)
    # a second run is up to date
    assert "up to date" in _run(capsys, "calibrate", str(recipe))
    # build validates the passed-on export as a stored checkpoint (its own quant_algo, the KV algo the engine runs,
    # carried scales allowed) and repo lays out Triton's model repository for it
    said = _run(capsys, "build", str(recipe))
    engine = tmp_path / "engines" / name / "engine"
    built = json.loads((engine / "manifest.json").read_text())
    assert built["preflight"]["hf_validation"]["stored"] == manifest["validation"]["stored"]["weights"]
    _run(capsys, "repo", str(recipe))
    assert any((tmp_path / "triton_repo").rglob("config.pbtxt"))
    deploy = tmp_path / "deploy"
    said = _run(capsys, "deploy", str(recipe), "--target", "k8s", "--output", str(deploy),
                "--model-source", f"s3://bucket/trtkv/{name}")
    assert "KV cache (fp8_scale1)" in said and (deploy / "server.yaml").is_file()


def test_build_validation_reads_the_passed_on_checkpoint_as_the_recipe_stores_it(
        fixtures: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The stored-checkpoint mode of build's HF validation: the checkpoint's own format (recognised from its files)
    against model.checkpoint_quant, its own KV algo and carried k/v scales reported, not refused; a recipe that names
    another stored format is refused, naming both."""
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    recipe = tmp_path / "fp8.yaml"
    _run(capsys, "init", "fp8", "--model", str(fixtures["modelopt_fp8"]), "--gpu", "H100-80GB", "--backend",
         "llmapi", "--output", str(recipe))
    _run(capsys, "calibrate", str(recipe))
    checkpoint = tmp_path / "engines" / "fp8" / "checkpoint"
    served = load_recipe(recipe)
    summary = validate_hf_checkpoint(checkpoint, served)
    assert summary["stored"] == "fp8" and summary["quant_algo"] == "fp8"
    assert summary["kv_cache_quant_algo"] == "FP8"  # declared by the export; llmapi runs it at 1.0 (fp8_cast)
    layers = served.model.num_layers
    assert len(summary["k_scales"]) == len(summary["v_scales"]) == layers and min(summary["k_scales"]) > 0
    with pytest.raises(StageError, match=r"stored as fp8, but recipe model.checkpoint_quant = 'nvfp4'"):
        validate_hf_checkpoint(checkpoint, load_recipe(recipe, ["model.checkpoint_quant=nvfp4"]))


def test_kv_cache_none_on_a_checkpoint_declaring_fp8_kv_is_refused_by_init_plan_and_build(
        fixtures: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """TensorRT-LLM's LLM API keeps a checkpoint's kv_cache_quant_algo FP8 under kv_cache_config.dtype auto (only fp8
    and nvfp4 override it), so kv_cache none there would run FP8 at 1.0 while plan priced 16 bits: init, plan and
    build's validation refuse it with fp8_cast, what it runs (on main init wrote it, plan priced bf16, build warned)."""
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    recipe = tmp_path / "none.yaml"
    args = ["init", "none", "--model", str(fixtures["modelopt_fp8"]), "--gpu", "H100-80GB", "--backend", "llmapi",
            "--output", str(recipe)]
    assert main([*args, "--kv-cache", "none"]) != 0
    said = capsys.readouterr().err
    assert "quantization.kv_cache (from --kv-cache none)" in said and "Use kv_cache fp8_cast" in said
    assert not recipe.exists()
    _run(capsys, *args)  # fp8_cast, the default init moves to here
    assert main(["plan", str(recipe), "quantization.kv_cache=none"]) != 0
    assert "declares a KV cache of FP8" in capsys.readouterr().err
    _run(capsys, "calibrate", str(recipe))
    checkpoint = tmp_path / "engines" / "none" / "checkpoint"
    with pytest.raises(StageError, match=r"quantization.kv_cache: none on build.backend llmapi, but the checkpoint"):
        validate_hf_checkpoint(checkpoint, load_recipe(recipe, ["quantization.kv_cache=none"]))
    assert validate_hf_checkpoint(checkpoint, load_recipe(recipe))["kv_cache_quant_algo"] == "FP8"
