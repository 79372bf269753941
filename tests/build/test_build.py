"""The build stage: golden trtllm-build / trtllm-serve commands per shipped recipe (every flag checked against
TensorRT-LLM's own argparse list), dry-run, preflight, a fake failing trtllm-build, and the pytorch and
reference backends end to end on tiny checkpoints."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from trtkv.backends import base as backend_base
from trtkv.backends import llmapi_serve, tensorrt, tensorrt_pitfalls
from trtkv.build import stage as build
from trtkv.cli import main
from trtkv.core.errors import StageError
from trtkv.recipe import Backend, list_recipes, load_recipe

DATA = Path(__file__).parents[1] / "data"
from tests.runtime.test_runtime import needs_cache, tiny_llama, write_checkpoint, write_hf_export  # noqa: E402


def accepted_flags(name: str) -> dict[str, str]:
    """`--flag -> value kind` from a flags file in tests/data (comments name the source)."""
    flags = {}
    for line in (DATA / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            flag, kind = line.split("\t")
            flags[flag] = kind
    return flags


BUILD_FLAGS = accepted_flags("trtllm_build_flags.txt")
SERVE_FLAGS = accepted_flags("trtllm_serve_flags.txt")


def check_flags(cmd: list[str], accepted: dict[str, str]) -> None:
    """Every `--flag` is accepted, and its value fits the kind TensorRT-LLM declares."""
    i = 1 if cmd[0] == "trtllm-build" else 2  # trtllm-serve takes the model first
    while i < len(cmd):
        flag = cmd[i]
        assert flag in accepted, f"{flag} is not a flag of {cmd[0]} (see tests/data)"
        kind = accepted[flag]
        if kind == "flag":
            i += 1
            continue
        value = cmd[i + 1]
        if kind == "int":
            assert value.isdigit(), f"{flag} {value}"
        elif kind == "float":
            float(value)
        elif kind not in ("str", "str+"):
            assert value in kind.split(","), f"{flag} {value}: allowed {kind}"
        i += 2


def relative(cmd: list[str], engines: Path) -> list[str]:
    return [c.replace(str(engines), "ENGINES") for c in cmd]


# Golden commands: what `trtkv build <recipe>` runs for each shipped GPU recipe (paths under ENGINES/).
GOLDEN_TRTLLM_BUILD = {
    "llama70b_fp8kv": [
        "trtllm-build", "--checkpoint_dir", "ENGINES/llama70b_fp8kv/checkpoint",
        "--output_dir", "ENGINES/llama70b_fp8kv/engine", "--max_batch_size", "64", "--max_input_len", "16384",
        "--max_seq_len", "32768", "--max_num_tokens", "16384", "--gemm_plugin", "disable", "--gpt_attention_plugin",
        "auto", "--kv_cache_type", "paged", "--use_paged_context_fmha", "enable", "--use_fp8_context_fmha", "enable",
        "--remove_input_padding", "enable", "--logits_dtype", "float32", "--multiple_profiles", "enable", "--workers", "4"],
    "llama70b_int8kv": [
        "trtllm-build", "--checkpoint_dir", "ENGINES/llama70b_int8kv/checkpoint",
        "--output_dir", "ENGINES/llama70b_int8kv/engine", "--max_batch_size", "64", "--max_input_len", "16384",
        "--max_seq_len", "32768", "--max_num_tokens", "16384", "--gemm_plugin", "disable", "--gpt_attention_plugin",
        "auto", "--kv_cache_type", "paged", "--use_paged_context_fmha", "disable", "--use_fp8_context_fmha",
        "disable", "--remove_input_padding", "enable", "--logits_dtype", "float32", "--multiple_profiles", "enable",
        "--workers", "4"],
    "llama8b_fp8kv": [
        "trtllm-build", "--checkpoint_dir", "ENGINES/llama8b_fp8kv/checkpoint",
        "--output_dir", "ENGINES/llama8b_fp8kv/engine", "--max_batch_size", "128", "--max_input_len", "32768",
        "--max_seq_len", "65536", "--max_num_tokens", "16384", "--gemm_plugin", "disable", "--gpt_attention_plugin",
        "auto", "--kv_cache_type", "paged", "--use_paged_context_fmha", "enable", "--use_fp8_context_fmha", "enable",
        "--remove_input_padding", "enable", "--logits_dtype", "float32", "--multiple_profiles", "enable", "--workers", "1"],
}
GOLDEN_TRTLLM_SERVE = {
    "llama8b_fp8kv_pytorch": (
        ["trtllm-serve", "ENGINES/llama8b_fp8kv_pytorch/checkpoint/hf", "--backend", "pytorch", "--host", "127.0.0.1",
         "--port", "8000", "--tp_size", "1", "--pp_size", "1", "--max_batch_size", "128", "--max_num_tokens", "16384",
         "--max_seq_len", "65536", "--kv_cache_free_gpu_memory_fraction", "0.9", "--extra_llm_api_options",
         "ENGINES/llama8b_fp8kv_pytorch/engine/llm_api_options.yaml"],
        {"max_input_len": 32768, "enable_chunked_prefill": True,  # max_input_len 32768 > max_num_tokens 16384
         "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.9, "enable_block_reuse": True}}),
    "llama70b_fp8kv_llmapi": (
        ["trtllm-serve", "ENGINES/llama70b_fp8kv_llmapi/checkpoint/hf", "--backend", "pytorch", "--host", "127.0.0.1",
         "--port", "8000", "--tp_size", "4", "--pp_size", "1", "--max_batch_size", "64", "--max_num_tokens", "8192",
         "--max_seq_len", "32768", "--kv_cache_free_gpu_memory_fraction", "0.9", "--extra_llm_api_options",
         "ENGINES/llama70b_fp8kv_llmapi/engine/llm_api_options.yaml"],
        {"max_input_len": 16384, "enable_chunked_prefill": True,
         "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.9, "enable_block_reuse": True}}),
    "llama70b_nvfp4kv": (
        ["trtllm-serve", "ENGINES/llama70b_nvfp4kv/checkpoint/hf", "--backend", "pytorch", "--host", "127.0.0.1",
         "--port", "8000", "--tp_size", "4", "--pp_size", "1", "--max_batch_size", "128", "--max_num_tokens", "8192",
         "--max_seq_len", "32768", "--kv_cache_free_gpu_memory_fraction", "0.9", "--extra_llm_api_options",
         "ENGINES/llama70b_nvfp4kv/engine/llm_api_options.yaml"],
        {"max_input_len": 16384, "enable_chunked_prefill": True,
         "kv_cache_config": {"dtype": "nvfp4", "free_gpu_memory_fraction": 0.9, "enable_block_reuse": True}}),
    "smollm2_fp8kv_llmapi": (
        ["trtllm-serve", "ENGINES/smollm2_fp8kv_llmapi/checkpoint/hf", "--backend", "pytorch", "--host", "127.0.0.1",
         "--port", "8000", "--tp_size", "1", "--pp_size", "1", "--max_batch_size", "4", "--max_num_tokens", "4096",
         "--max_seq_len", "4096", "--kv_cache_free_gpu_memory_fraction", "0.9", "--extra_llm_api_options",
         "ENGINES/smollm2_fp8kv_llmapi/engine/llm_api_options.yaml"],
        {"max_input_len": 2048, "enable_chunked_prefill": False,  # the reference runtime reuses blocks too (#55)
         "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.9, "enable_block_reuse": True}}),
}


def shipped(backend: Backend) -> list[str]:
    return [p.stem for p in list_recipes() if load_recipe(str(p)).build.backend is backend]


# ---------------------------------------------------------------------------------------------
# Commands


def test_every_shipped_gpu_recipe_has_a_golden_command() -> None:
    assert sorted(shipped(Backend.TENSORRT)) == sorted(GOLDEN_TRTLLM_BUILD)
    assert sorted(shipped(Backend.LLMAPI)) == sorted(GOLDEN_TRTLLM_SERVE)


@pytest.mark.parametrize("name", sorted(GOLDEN_TRTLLM_BUILD))
def test_trtllm_build_golden_command(name: str, engines_tmp: Path) -> None:
    recipe = load_recipe(name)
    cmd = tensorrt.trtllm_build_command(recipe, build.checkpoint_dir(recipe), build.engine_dir(recipe))
    assert relative(cmd, engines_tmp) == GOLDEN_TRTLLM_BUILD[name]
    check_flags(cmd, BUILD_FLAGS)
    assert not any("kv_cache" in c and c != "--kv_cache_type" for c in cmd if c.startswith("--"))


def test_flags_follow_the_recipe(engines_tmp: Path) -> None:
    recipe = load_recipe("llama70b_int8kv", ["quantization.weights=none", "build.tokens_per_block=64",
                                             "build.use_paged_context_fmha=false", "build.multiple_profiles=false"])
    cmd = tensorrt.trtllm_build_command(recipe, Path("c"), Path("o"))
    check_flags(cmd, BUILD_FLAGS)
    got = dict(zip(cmd[1::2], cmd[2::2], strict=True))
    assert got["--gemm_plugin"] == "auto" and got["--tokens_per_block"] == "64"
    assert got["--use_paged_context_fmha"] == "disable" and got["--multiple_profiles"] == "disable"
    assert got["--use_fp8_context_fmha"] == "disable"


@pytest.mark.parametrize("overrides, expected", [
    ((), "disable"),  # FP8 weights, max_batch_size 64: the guide wants the plugin off on FP8
    (("build.max_batch_size=4",), "fp8"),  # the small-batch case the experimental FP8 plugin is for
    (("build.max_batch_size=5",), "disable"),
    (("quantization.weights=none",), "auto"),  # 16-bit GEMMs: the plugin on, in the model dtype
    (("build.gemm_plugin=fp8",), "fp8"),  # an explicit choice is the recipe's
])
def test_gemm_plugin_auto_follows_the_perf_guide(overrides: tuple[str, ...], expected: str,
                                                 capsys: pytest.CaptureFixture[str], engines_tmp: Path) -> None:
    """`auto`: TensorRT-LLM's perf best practices (FP8: plugin disabled; the experimental FP8 plugin for batches <= 4;
    FP16/BF16: enabled); the dry run says why."""
    recipe = load_recipe("llama70b_fp8kv", list(overrides))
    cmd = tensorrt.trtllm_build_command(recipe, Path("c"), Path("o"))
    assert cmd[cmd.index("--gemm_plugin") + 1] == expected
    assert main(["build", "llama70b_fp8kv", *overrides, "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert f"--gemm_plugin {expected}:" in said
    if not overrides:
        assert "perf best practices" in said and "max_batch_size 64 > 4" in said


# (overrides on llama70b_fp8kv, expected --use_paged_context_fmha, --use_fp8_context_fmha): TensorRT-LLM's rules
CONTEXT_FMHA_CASES = [
    ((), "enable", "enable"),  # FP8 KV + FP8 weights: both on
    (("quantization.kv_cache=int8",), "disable", "disable"),  # "Paged Context FMHA doesn't work with int8 kv cache"
    (("quantization.weights=none",), "disable", "disable"),  # FP8 KV without the FP8 quantization workflow
    (("quantization.kv_cache=none",), "enable", "disable"),  # unquantized KV: paged on, nothing FP8
    (("build.use_paged_context_fmha=false", "build.use_fp8_context_fmha=false"), "disable", "disable"),
    (("build.use_paged_context_fmha=false",), "disable", "enable"),
]


@pytest.mark.parametrize("overrides,paged,fp8", CONTEXT_FMHA_CASES, ids=lambda v: str(v))
def test_context_fmha_flags_follow_tensorrt_llm_rules(overrides: tuple[str, ...], paged: str, fp8: str,
                                                      engines_tmp: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv", ["build.max_input_len=16384", *overrides])
    got = dict(zip(*[iter(tensorrt.trtllm_build_command(recipe, Path("c"), Path("o"))[1:])] * 2, strict=True))
    assert (got["--use_paged_context_fmha"], got["--use_fp8_context_fmha"]) == (paged, fp8)
    line = tensorrt.context_fmha_line(recipe)
    assert f"--use_paged_context_fmha {paged}" in line and f"--use_fp8_context_fmha {fp8}" in line
    if "quantization.kv_cache=int8" in overrides:
        assert "forced off" in line and "INT8" in line


@pytest.mark.parametrize("name", sorted(GOLDEN_TRTLLM_SERVE))
def test_trtllm_serve_golden_command_and_options(name: str, engines_tmp: Path) -> None:
    recipe = load_recipe(name)
    out = build.engine_dir(recipe)
    cmd = llmapi_serve.trtllm_serve_command(recipe, build.checkpoint_dir(recipe) / "hf", out / llmapi_serve.LLM_API_OPTIONS)
    golden_cmd, golden_options = GOLDEN_TRTLLM_SERVE[name]
    assert relative(cmd, engines_tmp) == golden_cmd
    check_flags(cmd, SERVE_FLAGS)
    options = llmapi_serve.serve_config(recipe)
    assert options == golden_options  # LLM() arguments (tests/backends/test_llmapi.py checks every key against upstream's list)


# ---------------------------------------------------------------------------------------------
# Dry run


@pytest.mark.parametrize("name", ["llama70b_fp8kv", "llama70b_int8kv", "llama8b_fp8kv"])
def test_dry_run_prints_complete_commands_and_writes_nothing(name: str, engines_tmp: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    algo = "INT8" if "int8" in name else "FP8"
    assert f"KV cache: {algo}, from checkpoint config quantization.kv_cache_quant_algo" in out
    assert f"trtllm-build has no --{algo.lower()}_kv_cache flag" in out
    assert "[calibrate]" in out and "ModelOpt" in out  # the calibration lines come from trtkv.calibrate
    assert "context FMHA: --use_paged_context_fmha" in out
    if algo == "INT8":
        assert "forced off: paged context FMHA doesn't work with an INT8 KV cache" in out
    joined = out.replace("\\\n", " ")
    for token in GOLDEN_TRTLLM_BUILD[name]:
        assert token.replace("ENGINES", str(engines_tmp)) in joined
    assert not engines_tmp.exists(), "a dry run must write nothing"


def test_dry_run_pytorch_and_reference(engines_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "llama8b_fp8kv_pytorch", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "kv_cache_config.dtype = fp8" in out and "trtllm-serve" in out and "dtype: fp8" in out
    assert main(["build", "smollm2_fp8kv", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "runtime.json" in out and "activations are not quantized" in out
    assert not engines_tmp.exists()


# ---------------------------------------------------------------------------------------------
# Preflight and a failing trtllm-build


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="TensorRT-LLM is installed here")
def test_tensorrt_preflight_stops_with_a_clear_error(engines_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.platform import trtllm

    monkeypatch.delenv(trtllm.PYTHON_ENV, raising=False)
    monkeypatch.setattr(trtllm.shutil, "which", lambda name: None)  # no docker on this "machine"
    assert main(["build", "llama70b_fp8kv"]) == 2
    err = capsys.readouterr().err
    assert "TensorRT-LLM is not available here" in err and "docker is not on PATH" in err
    assert "TRTKV_TRTLLM_PYTHON" in err and "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3" in err
    assert "GPU(s) visible" in err and "needs build.tp_size x pp_size = 4" in err
    assert "trtkv calibrate llama70b_fp8kv" in err
    assert not (engines_tmp / "llama70b_fp8kv" / "engine").exists()


def test_preflight_through_a_container_that_cannot_start(tmp_path: Path, engines_tmp: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Docker on PATH but no daemon (this machine): the preflight says so before anything is pulled or run."""
    from trtkv.platform import trtllm

    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('Cannot connect to the Docker daemon\\n')\n"
                    f"sys.exit(1)\n")
    fake.chmod(0o755)
    monkeypatch.delenv(trtllm.PYTHON_ENV, raising=False)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert main(["build", "llama70b_fp8kv"]) == 2
    err = capsys.readouterr().err
    assert "image nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3 is not on this machine" in err
    assert "Cannot connect to the Docker daemon" in err and "docker pull" in err


def tiny_recipe(tmp_path: Path, name: str, backend: str, kv: str = "fp8", weights: str = "fp8",
                dtype: str = "float32", source: str = "org/tiny") -> Path:
    """A recipe for a tiny model (the shipped ones describe real model sizes)."""
    gpu = {"hardware": {"gpu": "cpu", "count": 1}} if backend == "reference" else {
        "hardware": {"gpu": "H100-80GB", "count": 1}}
    data = {"description": "tiny test model", "model": {"source": source, "architecture": "llama", "dtype": dtype},
            "quantization": {"weights": weights, "kv_cache": kv},
            "build": {"backend": backend, "max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128,
                      "max_num_tokens": 256},
            "bench": {"input_tokens": 16, "output_tokens": 8, "needle_context_lengths": [48]}, **gpu}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build_script: str) -> None:
    """A fake `trtllm-build` and `nvidia-smi` on PATH and an importable fake `tensorrt_llm` (this test only)."""
    bin_dir, pkg = tmp_path / "bin", tmp_path / "pylib" / "tensorrt_llm"
    bin_dir.mkdir()
    (pkg / "commands").mkdir(parents=True)
    (pkg / "__init__.py").write_text('print("[TensorRT-LLM] TensorRT-LLM version: 1.2.1")\n__version__ = "1.2.1"\n')
    (pkg / "commands" / "__init__.py").write_text("")
    (pkg / "commands" / "build.py").write_text(build_script)  # what `trtllm-build` runs: python -m ...commands.build
    (pkg.parent / "tensorrt").mkdir()
    (pkg.parent / "tensorrt" / "__init__.py").write_text('__version__ = "10.14.1.48"\n')
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\nprint('GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fake)')\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(pkg.parent))
    monkeypatch.setenv("TRTKV_TRTLLM_PYTHON", sys.executable)  # "an environment where TensorRT-LLM is installed"


FAILING_BUILD = """
import sys, pathlib
out = pathlib.Path(sys.argv[sys.argv.index("--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
print("[TensorRT-LLM] TensorRT-LLM version: 1.2.1", flush=True)
print("[TRT-LLM] [I] Set dtype to float32.", flush=True)
(out / "rank0.engine").write_bytes(b"half an engine")
print("[TRT-LLM] [I] Build TensorRT engine Unnamed Network 0", flush=True)
print("Traceback (most recent call last):", flush=True)
print("RuntimeError: Encounter error 'key builder_config not found' in engine config", flush=True)
sys.exit(1)
"""

GOOD_BUILD = """
import sys, json, pathlib
out = pathlib.Path(sys.argv[sys.argv.index("--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "rank0.engine").write_bytes(b"engine")
(out / "config.json").write_text(json.dumps({"build_config": {"argv": sys.argv[1:]}}))
print("[TRT-LLM] [I] Total time of building all engines: 00:00:01")
"""


@pytest.fixture(scope="module")
def tiny() -> Any:
    return tiny_llama()


def test_fake_trtllm_build_failing_midway(tmp_path: Path, engines_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str], tiny: Any) -> None:
    recipe_path = tiny_recipe(tmp_path, "tiny_trt", "tensorrt")
    write_checkpoint(tiny, engines_tmp / "tiny_trt" / "checkpoint", weights="fp8", kv="FP8")
    fake_tools(tmp_path, monkeypatch, FAILING_BUILD)
    assert main(["build", str(recipe_path)]) != 0
    captured = capsys.readouterr()
    assert "Set dtype to float32" in captured.out  # streamed to the console as it ran
    assert "--- last lines of the log ---" in captured.err and "key builder_config not found" in captured.err
    assert "hint: engine/runtime version mismatch" in captured.err
    assert "hint: --use_fp8_context_fmha" not in captured.err  # the command line in the log is not a symptom
    root = engines_tmp / "tiny_trt"
    assert not (root / "engine").exists(), "a failed build must not leave an engine folder"
    assert not list(root.glob(".engine.tmp-*")), "the temporary folder must be removed"
    kept = tensorrt.failed_log_path(load_recipe(str(recipe_path)))
    assert "key builder_config not found" in kept.read_text()


def test_fake_trtllm_build_success_is_atomic_and_then_up_to_date(tmp_path: Path, engines_tmp: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str], tiny: Any) -> None:
    recipe_path = tiny_recipe(tmp_path, "tiny_trt", "tensorrt")
    write_checkpoint(tiny, engines_tmp / "tiny_trt" / "checkpoint", weights="fp8", kv="FP8")
    fake_tools(tmp_path, monkeypatch, GOOD_BUILD)
    assert main(["build", str(recipe_path)]) == 0
    engine = engines_tmp / "tiny_trt" / "engine"
    assert {"rank0.engine", "config.json", "build.log", "build_command.txt", "manifest.json"} <= {
        p.name for p in engine.iterdir()}
    command = (engine / "build_command.txt").read_text()
    assert f"--output_dir {engine}" in command and "kv_cache_quant_algo" in command
    assert f"{sys.executable} -m tensorrt_llm.commands.build" in command  # where TensorRT-LLM lives
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["versions"]["tensorrt_llm"] == "1.2.1" and manifest["versions"]["tensorrt"] == "10.14.1.48"
    assert manifest["preflight"]["visible_gpus"] == 1
    from trtkv.backends import container

    recipe = load_recipe(str(recipe_path))
    assert container.container_image(recipe) == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    monkeypatch.setenv("TRTKV_TRITON_IMAGE", "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3")
    with pytest.raises(StageError, match=r"ships TensorRT-LLM 1.1.0.*needs TensorRT-LLM 1.2.1.*26.07"):
        container.container_image(recipe)
    monkeypatch.delenv("TRTKV_TRITON_IMAGE")
    with pytest.raises(StageError, match=r"built by TensorRT-LLM 1.2.1, but the recipe's build.tensorrt_llm_version"):
        container.container_image(load_recipe(str(recipe_path), ["build.tensorrt_llm_version=1.1.0"]))
    capsys.readouterr()
    assert main(["build", str(recipe_path)]) == 0
    assert "up to date" in capsys.readouterr().out


def test_preflight_reports_checkpoint_mismatches(tmp_path: Path, engines_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], tiny: Any) -> None:
    recipe_path = tiny_recipe(tmp_path, "tiny_trt", "tensorrt", kv="int8", dtype="bfloat16")
    write_checkpoint(tiny, engines_tmp / "tiny_trt" / "checkpoint", weights="fp8", kv="FP8")
    fake_tools(tmp_path, monkeypatch, GOOD_BUILD)
    assert main(["build", str(recipe_path)]) == 2
    err = capsys.readouterr().err
    # the checkpoint validator calibrate runs (trtkv.checkpoints.trtllm_checkpoint), not a second copy of its rules
    assert "quantization.kv_cache_quant_algo = 'FP8', but recipe quantization.kv_cache = 'int8' needs 'INT8'" in err
    assert "dtype = 'float32', but recipe model.dtype = 'bfloat16'" in err
    assert "trtkv calibrate tiny_trt --force" in err
    assert not (engines_tmp / "tiny_trt" / "engine").exists()


def test_pitfall_hints() -> None:
    assert "FP8 KV cache" in tensorrt_pitfalls.pitfall_hints("AssertionError: use_fp8_context_fmha requires fp8 kv cache")[0]
    assert tensorrt_pitfalls.pitfall_hints("all good") == []
    (int8,) = tensorrt_pitfalls.pitfall_hints("RuntimeError: Paged Context FMHA doesn't work with int8 kv cache currently.")
    assert "--use_paged_context_fmha disable" in int8
    assert any("Blackwell" in h for h in tensorrt_pitfalls.pitfall_hints("INT8/INT4 quantization is not supported on SM>=100."))


def test_pitfall_hints_ignore_the_lines_every_build_prints() -> None:
    """TensorRT-LLM 1.x logs these on ordinary builds (builder.py warnings, PluginConfig info): no hint from them."""
    benign = "\n".join([
        "$ trtllm-build --checkpoint_dir c --use_fp8_context_fmha enable",
        "[11/30/2026-10:00:00] [TRT-LLM] [I] Set PluginConfig.use_fp8_context_fmha to True.",
        "[11/30/2026-10:00:00] [TRT-LLM] [W] FP8 Context FMHA is disabled because it must be used together with the "
        "fp8 quantization workflow.",
        "[11/30/2026-10:00:00] [TRT-LLM] [MPI_Rank 1] [W] Paged Context FMHA is disabled because it doesn't work with "
        "int8 kv cache currently.",
        "[TensorRT-LLM][INFO] kv_cache_quant_algo FP8",
    ])
    assert tensorrt_pitfalls.pitfall_hints(benign) == []
    assert tensorrt_pitfalls.pitfall_hints(benign + "\nRuntimeError: CUDA out of memory") == [tensorrt_pitfalls.PITFALLS[5][1]]


def test_preflight_uses_the_checkpoint_validator(tmp_path: Path, engines_tmp: Path, tiny: Any) -> None:
    """A rank file missing a tensor is found by trtkv.checkpoints.trtllm_checkpoint (one source of truth for the
    checkpoint rules)."""
    from safetensors.torch import load_file, save_file

    recipe = load_recipe(str(tiny_recipe(tmp_path, "tiny_ref", "reference")))
    ckpt = write_checkpoint(tiny, engines_tmp / "tiny_ref" / "checkpoint", weights="fp8", kv="FP8")
    assert backend_base.check_checkpoint(recipe)[2] == []
    tensors = load_file(str(ckpt / "rank0.safetensors"))
    del tensors["transformer.layers.1.attention.kv_cache_scaling_factor"]
    save_file(tensors, str(ckpt / "rank0.safetensors"))
    (problem,) = backend_base.check_checkpoint(recipe)[2]
    assert "transformer.layers.1.attention.kv_cache_scaling_factor is missing" in problem


def test_unreadable_hf_quant_config_is_a_clear_error(tmp_path: Path, engines_tmp: Path, tiny: Any,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    recipe_path = tiny_recipe(tmp_path, "tiny_pt", "pytorch")
    ckpt = write_checkpoint(tiny, engines_tmp / "tiny_pt" / "checkpoint", weights="fp8", kv="FP8")
    write_hf_export(tiny, ckpt / "hf")
    (ckpt / "hf" / "hf_quant_config.json").write_text("{not json")
    assert main(["build", str(recipe_path)]) == 2
    err = capsys.readouterr().err
    assert "hf_quant_config.json: not readable as JSON" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# llmapi and reference backends, real runs on tiny checkpoints


def test_llmapi_backend_writes_options_and_serve_command(tmp_path: Path, engines_tmp: Path, tiny: Any) -> None:
    recipe_path = tiny_recipe(tmp_path, "tiny_pt", "llmapi")
    ckpt = write_checkpoint(tiny, engines_tmp / "tiny_pt" / "checkpoint", weights="fp8", kv="FP8")
    write_hf_export(tiny, ckpt / "hf")
    assert main(["build", str(recipe_path)]) == 0
    engine = engines_tmp / "tiny_pt" / "engine"
    options = yaml.safe_load((engine / "llm_api_options.yaml").read_text())
    assert options["kv_cache_config"]["dtype"] == "fp8" and options["max_input_len"] == 64
    serve = (engine / "serve_command.txt").read_text().split()
    # a GPU recipe's command runs in a container: the canonical paths, not this machine's
    assert serve[:2] == ["trtllm-serve", "/models/tiny_pt/checkpoint/hf"]
    assert serve[serve.index("--max_num_tokens") + 1] == "256"
    assert serve[serve.index("--extra_llm_api_options") + 1] == "/models/tiny_pt/engine/llm_api_options.yaml"
    assert str(engines_tmp) not in (engine / "serve_command.txt").read_text()
    check_flags(serve, SERVE_FLAGS)


def test_llmapi_build_refuses_a_broken_hf_export(tmp_path: Path, engines_tmp: Path, tiny: Any,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file, save_file

    recipe_path = tiny_recipe(tmp_path, "tiny_pt", "llmapi")
    ckpt = write_checkpoint(tiny, engines_tmp / "tiny_pt" / "checkpoint", weights="fp8", kv="FP8")
    hf = write_hf_export(tiny, ckpt / "hf")
    tensors = load_file(str(hf / "model.safetensors"))
    del tensors["model.layers.1.self_attn.v_proj.v_scale"]
    tensors["model.layers.0.self_attn.k_proj.k_scale"] = torch.tensor(float("nan"))
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"].float()
    save_file(tensors, str(hf / "model.safetensors"))
    assert main(["build", str(recipe_path)]) == 2
    err = capsys.readouterr().err
    assert "found 3 problem(s)" in err
    assert "model.layers.1.self_attn.v_proj.v_scale missing" in err
    assert "model.layers.0.self_attn.k_proj.k_scale = nan, a scale must be finite and > 0" in err
    assert "model.layers.0.mlp.up_proj.weight is F32, recipe weights fp8 needs F8_E4M3" in err
    assert not (engines_tmp / "tiny_pt" / "engine").exists()


@needs_cache
def test_reference_backend_build_then_runtime(tmp_path: Path, engines_tmp: Path, tiny: Any) -> None:
    from transformers import AutoConfig

    from trtkv.runtime import ReferenceRuntime

    model_dir = tmp_path / "tiny_hf"
    tiny.save_pretrained(model_dir)
    assert AutoConfig.from_pretrained(model_dir).num_hidden_layers == 2
    recipe_path = tiny_recipe(tmp_path, "tiny_ref", "reference", source=str(model_dir))
    write_checkpoint(tiny, engines_tmp / "tiny_ref" / "checkpoint", weights="fp8", kv="FP8")
    assert main(["build", str(recipe_path)]) == 0
    engine = engines_tmp / "tiny_ref" / "engine"
    settings = json.loads((engine / "runtime.json").read_text())
    assert settings["kv_cache_quant_algo"] == "FP8" and settings["max_seq_len"] == 128
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["kv_format"] == "fp8" and manifest["kv_scales"] == [1.0, 1.0]
    runtime = ReferenceRuntime.load(engine, threads=1)
    tokens = runtime.generate([1, 2, 3], max_tokens=4)
    assert len(tokens) == 4
    moved = tmp_path / "moved"
    engines_tmp.rename(moved)  # the engines folder can move: runtime.json also holds ../checkpoint
    assert ReferenceRuntime.load(moved / "tiny_ref" / "engine").generate([1, 2, 3], max_tokens=4) == tokens


def test_reference_backend_refuses_a_mismatched_checkpoint(tmp_path: Path, engines_tmp: Path, tiny: Any,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    recipe_path = tiny_recipe(tmp_path, "tiny_ref", "reference", kv="int8")
    write_checkpoint(tiny, engines_tmp / "tiny_ref" / "checkpoint", weights="fp8", kv="FP8")
    assert main(["build", str(recipe_path)]) == 2
    assert "needs 'INT8'" in capsys.readouterr().err
    assert not (engines_tmp / "tiny_ref" / "engine").exists()


def test_build_without_checkpoint_names_the_calibrate_step(engines_tmp: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "smollm2_fp8kv"]) == 2
    assert "trtkv calibrate smollm2_fp8kv" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread: None) -> None:
    """Tiny models run fastest single-threaded (shared fixture in tests/conftest.py)."""


# ---------------------------------------------------------------------------------------------
# trtkv.core.tools.run_logged: how every external tool (trtllm-build first) is run


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def test_run_logged_decodes_bad_bytes_and_leaves_no_process(tmp_path: Path) -> None:
    """A tool that prints invalid UTF-8, starts a grandchild holding its output and fails: a clean ToolError, the
    bytes shown as replacement characters, and the grandchild ended with the tool's process group."""
    from trtkv.core.errors import ToolError
    from trtkv.core.tools import run_logged

    pid_file = tmp_path / "grandchild.pid"
    script = tmp_path / "tool.py"
    script.write_text(
        "import subprocess, sys\n"
        "sys.stdout.buffer.write(b'building \\xff\\xfe layer 3\\n'); sys.stdout.flush()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "sys.exit(7)\n")
    log = tmp_path / "tool.log"
    with pytest.raises(ToolError) as info:
        run_logged([sys.executable, str(script)], log, echo=False)
    message = str(info.value)
    assert "exited with code 7" in message and "building \ufffd\ufffd layer 3" in message
    assert "Traceback" not in message
    assert _gone(int(pid_file.read_text())), "the grandchild outlived the tool"


def test_run_logged_interrupted_or_timed_out_stops_the_group(tmp_path: Path) -> None:
    from trtkv.core.errors import ToolError
    from trtkv.core.tools import run_logged

    pid_file = tmp_path / "child.pid"
    script = tmp_path / "slow.py"
    script.write_text("import os, signal, time\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # ignores SIGTERM: SIGKILL must follow
                      f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                      "print('working', flush=True)\ntime.sleep(120)\n")
    with pytest.raises(ToolError, match="did not finish within 1.5 s"):
        run_logged([sys.executable, str(script)], tmp_path / "slow.log", echo=False, timeout_s=1.5,
                   stop_grace_s=0.5)
    assert _gone(int(pid_file.read_text()))


def test_run_logged_exec_errors_are_tool_errors(tmp_path: Path) -> None:
    from trtkv.core.errors import ToolError
    from trtkv.core.tools import run_logged

    not_executable = tmp_path / "tool.sh"
    not_executable.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(ToolError, match=r"permission denied.*chmod \+x"):
        run_logged([str(not_executable)], tmp_path / "a.log", echo=False)
    with pytest.raises(ToolError, match="not found"):
        run_logged([str(tmp_path / "no-such-tool")], tmp_path / "b.log", echo=False)
