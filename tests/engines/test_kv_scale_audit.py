"""`trtkv scales` on trtkv's own export of a tiny Llama (calibrated here: the TensorRT-LLM checkpoint
and ModelOpt's HF export), healthy and with the faults users meet injected into the HF export's
model.safetensors through safetensors itself: one layer's scales divided by 20, only v_scale, all
1.0, one NaN, and names another architecture's loader does not map. Each is caught with its layer
named and what vLLM 0.32.0, SGLang 0.5.23 and TensorRT-LLM 1.2 do with it."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.calibrate.test_calibrate import LAYERS, quiet, tiny_model, tiny_tokenizer, write_recipe
from trtkv.checkpoints.kv_scale_tensors import classify, read_checkpoint_scales
from trtkv.cli import main
from trtkv.engines.kv_scale_audit import audit_folder, audit_scales
from trtkv.engines.kv_scale_findings import Audit

VLLM, SGLANG, TRTLLM, ENGINE = "vllm", "sglang", "tensorrt_llm", "tensorrt_llm_engine"


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One FP8-weights + FP8-KV calibration of the tiny Llama: its checkpoint folder, model folder
    and the stored HF scales."""
    from trtkv.calibrate import calibrate
    from trtkv.recipe import load_recipe
    from trtkv.recipe.layout import checkpoint_dir

    folder = tmp_path_factory.mktemp("scales")
    model_dir = folder / "model"
    tiny_model().save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTKV_ENGINES", str(folder / "engines"))
        recipe = load_recipe(write_recipe(folder, model_dir, "tiny_scales"))
        calibrate(recipe, log=quiet)
        ckpt = checkpoint_dir(recipe)
    return {"ckpt": ckpt, "model": model_dir, "recipe": recipe}


def faulty(export: dict, tmp_path: Path, change: Callable[[dict], None],
           architecture: str | None = None) -> Path:
    """A copy of the HF export whose tensors `change` edits in place (name -> torch tensor)."""
    from safetensors.torch import load_file, save_file

    out = tmp_path / "hf"
    shutil.copytree(export["ckpt"] / "hf", out)
    tensors = load_file(str(out / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if architecture:
        config = json.loads((out / "config.json").read_text())
        config["architectures"] = [architecture]
        (out / "config.json").write_text(json.dumps(config))
    return out


def audit_of(folder: Path) -> Audit:
    (audit,) = audit_folder(folder)
    return audit


def on(audit: Audit, engine: str, layer: int) -> str:
    verdict = next(e for e in audit.engines if e.engine == engine)
    return next(el.uses for el in verdict.layers if el.layer == layer)


def codes(audit: Audit) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in audit.findings:
        out.setdefault(f.code, []).append(f)
    return out


def k_name(i: int) -> str:
    return f"model.layers.{i}.self_attn.k_proj.k_scale"


def v_name(i: int) -> str:
    return f"model.layers.{i}.self_attn.v_proj.v_scale"


def test_the_healthy_export_passes_and_each_engine_uses_what_it_reads(export: dict) -> None:
    audits = {a.format: a for a in audit_folder(export["ckpt"])}
    hf, trt = audits["hf"], audits["tensorrt_llm_checkpoint"]
    stored = json.loads((export["ckpt"] / "kv_scales.json").read_text())["layers"]
    assert hf.exit_code == 0 and trt.exit_code == 0, [f.message for a in audits.values() for f in a.findings]
    assert hf.conventions == ["modelopt"] and hf.architecture == "LlamaForCausalLM" and hf.kv_algo == "FP8"
    vllm = next(e for e in hf.engines if e.engine == VLLM)
    for el, row in zip(vllm.layers, stored, strict=True):
        assert el.uses == "separate"
        assert el.k == pytest.approx(row["k_scale"], rel=1e-6) and el.v == pytest.approx(row["v_scale"], rel=1e-6)
    assert {on(hf, SGLANG, i) for i in range(LAYERS)} == {"separate"}
    assert {on(hf, TRTLLM, i) for i in range(LAYERS)} == {"unused"}  # the PyTorch backend's FP8 KV: 1.0
    assert [f.code for f in hf.findings if f.severity != "info"] == ["ignored"]
    engine = next(e for e in trt.engines if e.engine == ENGINE)
    assert [el.uses for el in engine.layers] == ["shared"] * LAYERS
    assert [el.k for el in engine.layers] == pytest.approx([r["kv_cache_scaling_factor"] for r in stored])
    assert not next(e for e in trt.engines if e.engine == VLLM).applies


def test_one_layer_divided_by_20_is_an_outlier_named_by_layer(export: dict, tmp_path: Path) -> None:
    def divide(t: dict) -> None:
        t[k_name(2)] = t[k_name(2)] / 20
        t[v_name(2)] = t[v_name(2)] / 20

    audit = audit_of(faulty(export, tmp_path, divide))
    outliers = codes(audit)["outlier"]
    assert {f.layers for f in outliers} == {(2,)} and len(outliers) == 2
    assert all("below" in f.message for f in outliers)
    assert audit.exit_code == 0  # the stored scales are valid numbers: only --calibrate prices them


def test_only_v_scale_crashes_vllm_and_sglang(export: dict, tmp_path: Path) -> None:
    audit = audit_of(faulty(export, tmp_path, lambda t: t.pop(k_name(1))))
    (partial,) = codes(audit)["partial"]
    assert partial.layers == (1,) and "v_scale without k_scale" in partial.message
    for engine in ("vllm 0.32.0 uses a crash at load", "sglang 0.5.23 uses a crash at load",
                   "tensorrt_llm 1.2 (PyTorch backend / LLM API, FP8 KV) uses 1.0"):
        assert engine in partial.message
    crashes = {f.engine: f for f in codes(audit)["crash"]}
    assert set(crashes) == {VLLM, SGLANG} and "AssertionError" in crashes[VLLM].message
    assert crashes[VLLM].layers == (1,) and audit.exit_code == 1


def test_all_unity_scales_are_reported_not_failed(export: dict, tmp_path: Path) -> None:
    def unity(t: dict) -> None:
        for i in range(LAYERS):
            t[k_name(i)] = t[k_name(i)] * 0 + 1
            t[v_name(i)] = t[v_name(i)] * 0 + 1

    audit = audit_of(faulty(export, tmp_path, unity))
    (f,) = codes(audit)["unity"]
    assert f.severity == "info" and f.layers == tuple(range(LAYERS)) and audit.exit_code == 0
    assert {on(audit, VLLM, i) for i in range(LAYERS)} == {"separate"}


def test_one_nan_fails_and_says_the_engines_copy_k_over_v(export: dict, tmp_path: Path) -> None:
    def nan(t: dict) -> None:
        t[v_name(3)] = t[v_name(3)] * math.nan

    audit = audit_of(faulty(export, tmp_path, nan))
    (bad,) = codes(audit)["bad_value"]
    assert bad.layers == (3,) and "is NaN" in bad.message and audit.exit_code == 1
    # vLLM and SGLang test k > 0 first and keep max(k, NaN) = k: V runs with K's scale, silently
    assert on(audit, VLLM, 3) == on(audit, SGLANG, 3) == "k_for_both"
    assert "vllm 0.32.0 uses K's scale for K and V" in bad.message


@pytest.mark.parametrize(("architecture", "outcome", "finding"), [
    ("Qwen2ForCausalLM", "unity", "with the warning 'Parameter model.layers.N.self_attn.qkv_proj.k_scale"),
    ("Qwen3MoeForCausalLM", "unity", "without a word"),
    ("MixtralForCausalLM", "crash", "KeyError"),
])
def test_modelopt_names_sglangs_loader_does_not_map_for_the_architecture(
        export: dict, tmp_path: Path, architecture: str, outcome: str, finding: str) -> None:
    """SGLang issue 39942: its Qwen2, Qwen3-MoE and Mixtral loaders have no k/v scale remap."""
    audit = audit_of(faulty(export, tmp_path, lambda t: None, architecture))
    assert {on(audit, SGLANG, i) for i in range(LAYERS)} == {outcome}
    assert {on(audit, VLLM, i) for i in range(LAYERS)} == {"separate"}  # vLLM's mapper is generic
    found = [f for f in audit.findings if f.engine == SGLANG and f.severity == "fail"]
    assert found and finding in found[0].message and found[0].layers == tuple(range(LAYERS))
    assert audit.exit_code == 1


def test_a_name_only_another_architecture_uses_crashes_vllm(export: dict, tmp_path: Path) -> None:
    """NemotronH's `mixer.k_proj.k_scale` on a Llama: vLLM's AutoWeightsLoader finds no such module."""
    def rename(t: dict) -> None:
        t[k_name(0).replace("self_attn", "mixer")] = t.pop(k_name(0))

    audit = audit_of(faulty(export, tmp_path, rename))
    assert on(audit, VLLM, 0) == "crash" and "There is no module or parameter" in codes(audit)["crash"][0].message
    assert on(audit, SGLANG, 0) == "crash"  # dropped with a warning, then v_scale alone: its assert


def test_names_are_classified_as_the_writers_write_them() -> None:
    assert classify("model.layers.7.self_attn.k_proj.k_scale") == (7, "k", "modelopt")
    assert classify("model.language_model.layers.3.self_attn.v_scale") == (3, "v", "compressed-tensors")
    assert classify("model.layers.0.self_attn.attn.prob_scale") == (0, "prob", "vllm")
    assert classify("transformer.layers.2.attention.kv_cache_scaling_factor") == (2, "kv", "tensorrt_llm")
    assert classify("model.layers.1.self_attn.kv_scale") == (1, "kv", "kv_scale (deprecated)")
    for other in ("model.layers.1.self_attn.k_proj.weight_scale", "model.layers.1.self_attn.k_proj.input_scale",
                  "lm_head.weight", "model.layers.1.mlp.down_proj.weight"):
        assert classify(other) is None


def test_bf16_f16_and_subnormal_scales_are_read_and_judged(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {k_name(i): torch.tensor(0.02, dtype=torch.bfloat16) for i in range(4)}
    tensors |= {v_name(i): torch.tensor(0.01, dtype=torch.float16) for i in range(4)}
    tensors[v_name(1)] = torch.tensor(1e-6, dtype=torch.float16)  # below float16's smallest normal
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      "num_hidden_layers": 4}))
    ckpt = read_checkpoint_scales(tmp_path)
    assert {t.dtype for t in ckpt.tensors} == {"BF16", "F16"}
    assert next(t for t in ckpt.tensors if t.name == k_name(0)).values[0] == pytest.approx(0.02, rel=1e-2)
    (bad,) = codes(audit_scales(ckpt))["bad_value"]
    assert bad.layers == (1,) and "subnormal in F16" in bad.message


def test_the_cli_prints_a_table_json_and_the_exit_code(export: dict, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = faulty(export, tmp_path, lambda t: t.pop(k_name(1)))
    assert main(["scales", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "FAIL partial: layer 1: v_scale without k_scale" in out and "CRASH" in out
    assert main(["scales", str(export["ckpt"]), "--json", "--engine", "vllm"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [a["format"] for a in doc] == ["tensorrt_llm_checkpoint", "hf"] and doc[1]["exit_code"] == 0
    assert [e["engine"] for e in doc[1]["engines"]] == [VLLM]
    assert main(["scales", str(tmp_path / "nothing")]) == 2


def test_calibrate_prices_a_divided_layer_by_its_clipped_share(export: dict, tmp_path: Path) -> None:
    """One layer's scales divided by 20: --calibrate runs the model on the shipped text and that layer
    clips far more K and V values than the others under vLLM's scales (which read them), none under
    TensorRT-LLM's PyTorch backend (1.0 = 448: these activations are far below it)."""
    from trtkv.calibrate.scale_clip import add_clip_cost

    def divide(t: dict) -> None:
        t[k_name(2)] = t[k_name(2)] / 20
        t[v_name(2)] = t[v_name(2)] / 20

    audit = audit_of(faulty(export, tmp_path, divide))
    add_clip_cost([audit], export["model"], 1e-3)
    assert audit.clip is not None and "unknown" not in audit.clip
    vllm = {r["layer"]: r for r in audit.clip["engines"]["vllm 0.32.0"]}
    worst_other = max(max(r["k_clip"], r["v_clip"]) for i, r in vllm.items() if i != 2)
    assert vllm[2]["k_clip"] > 1e-2 and vllm[2]["v_clip"] > 1e-2 and vllm[2]["k_clip"] > 10 * worst_other
    clips = [f for f in audit.findings if f.code == "clips" and f.engine == VLLM]
    assert clips and 2 in clips[0].layers and audit.exit_code == 1
    trt = audit.clip["engines"]["tensorrt_llm 1.2 (PyTorch backend / LLM API, FP8 KV)"]
    assert all(r["k_clip"] == r["v_clip"] == 0 for r in trt)


def test_calibrate_without_a_model_says_the_cost_is_unknown(export: dict) -> None:
    from trtkv.calibrate.scale_clip import add_clip_cost

    audit = audit_of(export["ckpt"] / "hf")
    add_clip_cost([audit], None, 1e-3)
    assert audit.clip == {"unknown": "no unquantized model to run: pass --model DIR, or a recipe instead of a "
                                     "folder"}


def test_serve_says_what_the_engine_will_use(export: dict, tmp_path: Path) -> None:
    from trtkv.engines.kv_scale_text import serve_scale_lines

    lines = serve_scale_lines(export["ckpt"], "vllm", "tiny_scales")
    assert lines == [f"KV scales (vllm 0.32.0, {export['ckpt'] / 'hf'}): layers 0-{LAYERS - 1}: its K and V "
                     "scales"]
    (line,) = serve_scale_lines(export["ckpt"], "reference", "tiny_scales")
    assert "tensorrt_llm_engine" in line and "one shared K/V scale" in line
    bad = faulty(export, tmp_path, lambda t: t.pop(k_name(1)))
    lines = serve_scale_lines(bad, "sglang", "tiny_scales")
    assert "layer 1: a crash at load" in lines[0]
    assert lines[-1].startswith("warning: ") and "`trtkv scales tiny_scales`" in lines[-1]


def write_folder(folder: Path, tensors: dict[str, float], config: dict) -> Path:
    """A checkpoint folder of float32 scalars written by safetensors, with its config.json."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    name = "rank0.safetensors" if "architecture" in config else "model.safetensors"
    save_file({n: np.array(v, dtype=np.float32) for n, v in tensors.items()}, str(folder / name))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_tensorrt_llm_checkpoint_missing_a_factor_fails_the_build(tmp_path: Path) -> None:
    factors = {f"transformer.layers.{i}.attention.kv_cache_scaling_factor": 1.0 for i in (0, 1, 3)}
    config = {"architecture": "LlamaForCausalLM", "num_hidden_layers": 4,
              "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    audit = audit_of(write_folder(tmp_path / "ckpt", factors, config))
    assert audit.format == "tensorrt_llm_checkpoint" and on(audit, ENGINE, 2) == "crash"
    assert "Required but not provided tensors" in codes(audit)["crash"][0].message
    assert codes(audit)["missing_layers"][0].layers == (2,) and audit.exit_code == 1
    assert [f.severity for f in codes(audit)["unity"]] == ["info"]  # ModelOpt's >= 1.0 clamp, said as such
    assert "clamps" in codes(audit)["unity"][0].message


def test_linear_attention_layers_need_no_scales_and_an_unread_loader_is_said(tmp_path: Path) -> None:
    """Qwen3.5: Gated DeltaNet layers keep no K/V; a name its SGLang loader has no rule for is not modelled."""
    types = ["linear_attention"] * 3 + ["full_attention"]
    tensors = {"model.language_model.layers.3.self_attn.k_proj.k_scale": 0.02,
               "model.language_model.layers.3.self_attn.v_proj.v_scale": 0.01,
               "model.language_model.layers.3.self_attn.qkv_proj.k_scale": 0.02}
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"],
              "text_config": {"num_hidden_layers": 4, "layer_types": types}}
    audit = audit_of(write_folder(tmp_path / "q35", tensors, config))
    assert "missing_layers" not in codes(audit)
    assert on(audit, SGLANG, 3) == "unknown" and codes(audit)["not_modelled"][0].engine == SGLANG
    assert on(audit, VLLM, 3) == "separate"


def test_an_nvfp4_checkpoint_is_not_judged_by_fp8_rules(tmp_path: Path) -> None:
    tensors = {k_name(i): 0.02 for i in range(4)} | {v_name(i): 0.01 for i in range(4)}
    folder = write_folder(tmp_path / "nv", tensors, {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4})
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"kv_cache_quant_algo": "NVFP4"}}))
    audit = audit_of(folder)
    assert audit.kv_algo == "NVFP4" and audit.exit_code == 0
    assert {f.engine for f in codes(audit)["not_modelled"]} == {VLLM, SGLANG, TRTLLM}
