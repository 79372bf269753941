"""The calibrate stage on a tiny random Llama (built here, saved as an HF folder): same code path as SmolLM2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trtkv.calibrate import calibrate, describe_calibration
from trtkv.calibrate.report import find_warnings
from trtkv.core.errors import StageError
from trtkv.recipe import KVCacheQuant, load_recipe
from trtkv.recipe.layout import checkpoint_dir

LAYERS = 4


def tiny_tokenizer():  # noqa: ANN201 - a transformers PreTrainedTokenizerFast
    """A byte-level tokenizer with 256 tokens and no merges: no files, no hub."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=sorted(alphabet)[0])


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def tiny_model(seed: int = 0, **rope: object):  # noqa: ANN201 - a transformers LlamaForCausalLM
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, architectures=["LlamaForCausalLM"], **rope)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_model().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama-3-style model: rope_theta 500000 and llama3 scaling (transformers 5 keeps both in rope_parameters)."""
    folder = tmp_path_factory.mktemp("tiny_llama3")
    tiny_model(rope_parameters={**LLAMA3_ROPE, "rope_theta": 500000.0}).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def write_recipe(folder: Path, model_dir: Path, name: str, kv: str = "fp8", weights: str = "fp8", tp: int = 1,
                 pp: int = 1, samples: int = 8, dtype: str = "bfloat16", layers: int = LAYERS) -> Path:
    """A recipe file for the tiny model; tp/pp > 1 need a GPU target (the schema refuses tp > 1 on cpu)."""
    data = folder / "calib.jsonl"
    if not data.exists():
        lines = [json.dumps({"text": f"Record {i}: the quick brown fox jumps over the lazy dog {i * 7} times."})
                 for i in range(200)]
        data.write_text("\n".join(lines) + "\n")
    hardware = "hardware: {gpu: cpu, count: 1}" if tp * pp == 1 else f"hardware: {{gpu: H100-80GB, count: {tp * pp}}}"
    path = folder / f"{name}.yaml"
    path.write_text(f"""\
model: {{source: {model_dir}, architecture: llama, dtype: {dtype}, num_layers: {layers}, num_attention_heads: 4,
        num_kv_heads: 2, head_dim: 16, hidden_size: 64, vocab_size: 256, max_position_embeddings: 512}}
quantization: {{weights: {weights}, kv_cache: {kv}}}
calibration: {{dataset: {data}, num_samples: {samples}, seq_len: 32, batch_size: 4, seed: 7}}
build: {{backend: reference, tp_size: {tp}, pp_size: {pp}, max_input_len: 256, max_seq_len: 512}}
bench: {{needle_context_lengths: [192]}}
{hardware}
""")
    return path


def quiet(_msg: str) -> None:
    """Stage log sink for tests."""


def test_fp8_calibration_writes_the_contract(tiny_dir: Path, engines_tmp: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, tiny_dir, "tiny_fp8"))
    result = calibrate(recipe, log=quiet)
    out = checkpoint_dir(recipe)
    assert result.output == out and not result.skipped
    assert {p.name for p in out.iterdir()} >= {"config.json", "rank0.safetensors", "hf", "tokenizer",
                                               "kv_scales.json", "calibration_report.md", "manifest.json",
                                               "hf_config.json"}
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["kv_cache_quant_algo"] == "FP8" and config["quantization"]["quant_algo"] == "FP8"
    scales = json.loads((out / "kv_scales.json").read_text())
    assert scales["kv_cache_quant_algo"] == "FP8" and scales["num_layers"] == LAYERS
    for layer in scales["layers"]:
        assert layer["kv_cache_scaling_factor"] == max(1.0, max(layer["k_amax"], layer["v_amax"]) / 448)
        assert layer["k_scale"] == pytest.approx(layer["k_amax"] / 448, rel=1e-6)
    hf_quant = json.loads((out / "hf" / "hf_quant_config.json").read_text())
    assert hf_quant["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    report = (out / "calibration_report.md").read_text()
    assert "clamped to 1.0" in report and f"| {LAYERS - 1} |" in report
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["validation"]["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}
    assert manifest["calibration"]["tokens"] == 8 * 32
    assert {"nvidia-modelopt", "transformers", "torch", "tensorrt_llm"} == set(manifest["key"]["tool_versions"])
    assert calibrate(recipe, log=quiet).skipped  # up to date


def test_int8_scales_are_amax_over_127_and_deterministic(tiny_dir: Path, engines_tmp: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, tiny_dir, "tiny_int8", kv="int8", weights="none"))
    calibrate(recipe, log=quiet)
    out = checkpoint_dir(recipe)
    first = (out / "kv_scales.json").read_bytes()
    scales = json.loads(first)
    assert scales["kv_cache_quant_algo"] == "INT8"
    for layer in scales["layers"]:
        assert layer["kv_cache_scaling_factor"] == pytest.approx(max(layer["k_amax"], layer["v_amax"]) / 127, rel=1e-6)
    assert not (out / "hf").exists()
    assert "export_hf_checkpoint asserts" in (out / "calibration_report.md").read_text()
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["quant_algo"] is None and config["quantization"]["kv_cache_quant_algo"] == "INT8"
    assert not calibrate(recipe, force=True, log=quiet).skipped
    assert (out / "kv_scales.json").read_bytes() == first
    assert recipe.path is not None
    changed = load_recipe(recipe.path, ["calibration.seed=8"])
    assert not calibrate(changed, log=quiet).skipped  # a new seed is a new key


def test_llama3_rope_reaches_the_checkpoint_and_is_validated(llama3_dir: Path, engines_tmp: Path,
                                                            tmp_path: Path) -> None:
    """ModelOpt 0.47 under transformers 5 drops RoPE from the TensorRT-LLM config; calibrate writes it back."""
    from trtkv.checkpoints.trtllm_checkpoint import validate_trtllm_checkpoint

    saved = json.loads((llama3_dir / "config.json").read_text())
    assert "rope_theta" not in saved and saved["rope_parameters"]["rope_theta"] == 500000.0  # the transformers 5 form
    recipe = load_recipe(write_recipe(tmp_path, llama3_dir, "tiny_llama3"))
    calibrate(recipe, log=quiet)
    out = checkpoint_dir(recipe)
    config = json.loads((out / "config.json").read_text())
    assert config["rotary_base"] == 500000.0
    scaling = config["rotary_scaling"]
    assert scaling["type"] == "llama3" and scaling["factor"] == 8.0 and scaling["low_freq_factor"] == 1.0
    assert scaling["high_freq_factor"] == 4.0 and scaling["original_max_position_embeddings"] == 64
    hf = json.loads((out / "hf" / "config.json").read_text())
    assert hf["rope_theta"] == 500000.0 and hf["rope_scaling"]["rope_type"] == "llama3"
    assert hf["rope_parameters"]["rope_theta"] == 500000.0  # kept for transformers 5

    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(out, broken)
    del config["rotary_base"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(StageError, match=r"rotary_base absent.*10000.*theta 500000, llama3"):
        validate_trtllm_checkpoint(broken, recipe)


def rank_tensor_names(path: Path) -> dict[str, str]:
    """Name -> safetensors dtype of every tensor in a rank file."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return {name: fh.get_slice(name).get_dtype() for name in fh.keys()}  # noqa: SIM118


def test_kv_none_calibrates_fp8_weights_only(tiny_dir: Path, engines_tmp: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, tiny_dir, "tiny_fp16kv", kv="none"))
    manifest = calibrate(recipe, log=quiet).manifest
    out = checkpoint_dir(recipe)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == "FP8" and config["quantization"]["kv_cache_quant_algo"] is None
    names = rank_tensor_names(out / "rank0.safetensors")
    assert not [n for n in names if "kv_cache" in n]
    assert names["transformer.layers.0.attention.qkv.weight"] == "F8_E4M3"  # FP8 weights still calibrated
    assert "transformer.layers.0.attention.qkv.activation_scaling_factor" in names
    scales = json.loads((out / "kv_scales.json").read_text())
    assert scales["kv_cache_quant_algo"] is None and scales["num_layers"] == LAYERS and scales["layers"] == []
    assert scales["convention"]
    assert manifest["validation"]["kv_cache_quant_algo"] is None
    assert manifest["validation"]["kv_cache_scaling_factors"] == []
    entries = manifest["modelopt_quant_cfg"]["quant_cfg"]
    assert not [e for e in entries if "bmm" in e.get("quantizer_name", "") and e.get("enable", True)]
    hf_quant = json.loads((out / "hf" / "hf_quant_config.json").read_text())["quantization"]
    assert hf_quant["quant_algo"] == "FP8" and hf_quant["kv_cache_quant_algo"] is None
    assert not [n for n in rank_tensor_names(out / "hf" / "model.safetensors") if n.endswith(("k_scale", "v_scale"))]
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    report = (out / "calibration_report.md").read_text()
    assert "KV cache: unquantized" in report and "no K/V scales were calibrated" in report
    assert "## K/V statistics" in report and "collect_kv_stats" in report
    assert calibrate(recipe, log=quiet).skipped


def test_kv_none_with_weights_none_is_a_plain_export(tiny_dir: Path, engines_tmp: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, tiny_dir, "tiny_plain", kv="none", weights="none", samples=4))
    manifest = calibrate(recipe, log=quiet).manifest
    out = checkpoint_dir(recipe)
    assert manifest["modelopt_quant_cfg"] is None
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["quant_algo"] is None and config["quantization"]["kv_cache_quant_algo"] is None
    names = rank_tensor_names(out / "rank0.safetensors")
    assert not [n for n in names if "scaling_factor" in n]
    assert set(names.values()) == {"BF16"}  # the recipe dtype
    assert (out / "hf" / "config.json").is_file() and not (out / "hf" / "hf_quant_config.json").exists()
    assert json.loads((out / "kv_scales.json").read_text())["layers"] == []
    assert "mtq.quantize was not called" in (out / "calibration_report.md").read_text()


def test_tensor_and_pipeline_parallel_export(tiny_dir: Path, engines_tmp: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, tiny_dir, "tiny_tp2pp2", tp=2, pp=2))
    summary = calibrate(recipe, log=quiet).manifest["validation"]
    assert summary["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2}
    assert [r["file"] for r in summary["ranks"]] == [f"rank{r}.safetensors" for r in range(4)]
    assert len(summary["kv_cache_scaling_factors"]) == LAYERS


def test_interrupted_run_leaves_no_complete_looking_folder(tiny_dir: Path, engines_tmp: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, tiny_dir, "tiny_interrupt"))
    calls = {"n": 0}

    def interrupting_loader(_recipe):  # noqa: ANN001, ANN202
        model = tiny_model()
        original = model.forward

        def forward(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
            return original(*args, **kwargs)

        model.forward = forward
        return model, tiny_tokenizer()

    with pytest.raises(KeyboardInterrupt):
        calibrate(recipe, loader=interrupting_loader, log=quiet)
    parent = checkpoint_dir(recipe).parent
    assert calls["n"] == 2
    assert not checkpoint_dir(recipe).exists()
    assert not parent.exists() or not any(parent.iterdir())  # no temp folder left either
    # a failure after a good run keeps the good checkpoint intact
    calibrate(recipe, log=quiet)
    before = (checkpoint_dir(recipe) / "manifest.json").read_bytes()

    def failing_loader(_recipe):  # noqa: ANN001, ANN202
        raise StageError("boom")

    with pytest.raises(StageError, match="boom"):
        calibrate(recipe, force=True, loader=failing_loader, log=quiet)
    assert (checkpoint_dir(recipe) / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in parent.iterdir()) == ["checkpoint"]


def test_unresolvable_model_fails_fast(engines_tmp: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, tmp_path / "no_such_model", "tiny_missing"))
    with pytest.raises(StageError, match="cannot be resolved"):
        calibrate(recipe, log=quiet)
    parent = checkpoint_dir(recipe).parent
    assert not parent.exists() or not any(parent.iterdir())  # no checkpoint, no temporary folder


def test_up_to_date_checkpoint_never_resolves_the_model(tiny_dir: Path, engines_tmp: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The up-to-date key is checked first: a hub id offline or a missing package cannot fail a no-op rerun."""
    import trtkv.checkpoints.models

    recipe = load_recipe(write_recipe(tmp_path, tiny_dir, "tiny_skip", kv="int8", weights="none", samples=4))
    calibrate(recipe, log=quiet)
    saved = json.loads((checkpoint_dir(recipe) / "hf_config.json").read_text())
    assert saved == json.loads((tiny_dir / "config.json").read_text())  # the model's own config.json, for build

    def no_resolving(_recipe):  # noqa: ANN001, ANN202
        raise AssertionError("resolve_model_dir called for an up-to-date checkpoint")

    monkeypatch.setattr(trtkv.checkpoints.models, "resolve_model_dir", no_resolving)
    assert calibrate(recipe, log=quiet).skipped


def test_too_little_text_names_the_fields(tiny_dir: Path, engines_tmp: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, tiny_dir, "tiny_short"), ["calibration.num_samples=100000"])
    with pytest.raises(StageError, match="calibration.num_samples"):
        calibrate(recipe, log=quiet)


def test_describe_is_light_and_complete() -> None:
    lines = "\n".join(describe_calibration(load_recipe("llama70b_int8kv")))
    assert '"num_bits": 8' in lines and "inference_tensor_parallel=4" in lines and "rank3.safetensors" in lines
    assert "kv_cache_quant_algo = INT8" in lines and "hf/: not written" in lines
    fp8 = "\n".join(describe_calibration(load_recipe("smollm2_fp8kv")))
    assert "KV_QUANT_CFG_CHOICES['fp8']" in fp8 and "16 samples x 256 tokens" in fp8
    none = "\n".join(describe_calibration(load_recipe("smollm2_fp16kv")))
    assert "kv_cache_quant_algo = null" in none and "mtq.FP8_DEFAULT_CFG" in none and '"kv_entries": []' in none
    assert "cannot run" not in none and "hf_quant_config.json quant_algo FP8" in none and "KV_QUANT" not in none
    plain = "\n".join(describe_calibration(load_recipe("smollm2_fp16kv", ["quantization.weights=none"])))
    assert "plain export" in plain and "no hf_quant_config.json" in plain


def test_unsupported_weights_are_refused_before_work(engines_tmp: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv", ["quantization.weights=int4_awq"])
    with pytest.raises(StageError, match="int4_awq"):
        calibrate(recipe, log=quiet)


def test_warnings_name_clamping_dwarfing_and_outliers() -> None:
    from trtkv.calibrate.common import LayerScales

    layers = [LayerScales(layer=i, k_amax=1.0, v_amax=0.5, kv_cache_scaling_factor=1.0, k_scale=1 / 448,
                          v_scale=0.5 / 448, k_channel_amax=[1.0] * 8, v_channel_amax=[1.0] * 8, head_dim=4)
              for i in range(5)]
    layers[3].k_amax = 50.0
    layers[2].k_channel_amax[5] = 9.0
    text = "\n".join(find_warnings(layers, KVCacheQuant.FP8))
    assert "5/5 layers" in text and "layer(s) 3 (50)" in text and "layer 2 head 1 channel 1" in text


def test_cli_dry_run_writes_nothing(engines_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    assert main(["calibrate", "llama70b_fp8kv", "--dry-run"]) == 0
    assert "export_tensorrt_llm_checkpoint" in capsys.readouterr().out
    assert not engines_tmp.exists()
    assert main(["calibrate", "llama70b_fp8kv"]) == 2  # no weights here: a clear error, exit 2
    assert "cannot be resolved" in capsys.readouterr().err


@pytest.mark.e2e  # runs the real model: not in `make check`
@pytest.mark.slow
def test_real_smollm2_tiny_calibration(smollm2_dir: Path, engines_tmp: Path) -> None:
    """The real model, 2 x 64 tokens: 30 layers -> 30 INT8 factors."""
    recipe = load_recipe("smollm2_int8kv", ["calibration.num_samples=2", "calibration.seq_len=64",
                                            "calibration.batch_size=2"])
    summary = calibrate(recipe, log=quiet).manifest["validation"]
    assert summary["num_layers"] == 30 and len(summary["kv_cache_scaling_factors"]) == 30
    assert os.path.isfile(checkpoint_dir(recipe) / "tokenizer" / "tokenizer.json")


def test_modelopt_cannot_export_a_layer_with_16_bit_kv(tiny_dir: Path, tmp_path: Path) -> None:
    """Why per-layer KV precision is refused for TensorRT-LLM (#17): asked to leave layer 1's KV quantizers disabled,
    ModelOpt 0.47 still writes one global kv_cache_quant_algo FP8 and only drops that layer's scales, in both exports.
    TensorRT-LLM reads the algo globally: trtllm-build's PretrainedModel.load fails on the missing
    kv_cache_scaling_factor ("Required but not provided tensors", tensorrt_llm/models/modeling_utils.py), and the
    PyTorch backend allocates one KV pool dtype for all layers (KvCacheCreator._create_kv_cache_manager,
    tensorrt_llm/_torch/pyexecutor/_util.py), storing the "16-bit" layer in FP8 anyway. vLLM's
    --kv-cache-dtype-skip-layers is the deployable form."""
    import modelopt.torch.quantization as mtq
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from trtkv.calibrate.modelopt_export import build_quant_cfg, export_hf, export_trtllm

    recipe = load_recipe(write_recipe(tmp_path, tiny_dir, "tiny_skip"))
    cfg, _notes = build_quant_cfg(recipe)
    assert cfg is not None
    cfg["quant_cfg"].append({"quantizer_name": "*layers.1.*[kv]_bmm_quantizer", "enable": False})
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()

    def forward(m: torch.nn.Module) -> None:
        with torch.no_grad():
            m(input_ids=torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0)), use_cache=False)

    mtq.quantize(model, cfg, forward)
    assert not model.model.layers[1].self_attn.k_bmm_quantizer.is_enabled
    out = tmp_path / "ckpt"
    export_trtllm(model, out, recipe)
    export_hf(model, tiny_tokenizer(), out, recipe)
    quant = json.loads((out / "config.json").read_text())["quantization"]
    assert quant["kv_cache_quant_algo"] == "FP8" and not any("attn" in m or "attention" in m
                                                             for m in quant.get("exclude_modules") or [])
    with safe_open(str(out / "rank0.safetensors"), "pt") as f:
        layers = sorted(int(k.split(".")[2]) for k in f.keys() if k.endswith("attention.kv_cache_scaling_factor"))
    assert layers == [0, 2, 3]  # layer 1's scale is simply missing
    hf_quant = json.loads((out / "hf" / "hf_quant_config.json").read_text())["quantization"]
    assert hf_quant["kv_cache_quant_algo"] == "FP8"
    names: list[str] = []
    for shard in (out / "hf").glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            names += [k for k in f.keys() if k.endswith(("k_scale", "v_scale"))]
    assert sorted({int(k.split(".")[2]) for k in names}) == [0, 2, 3]
