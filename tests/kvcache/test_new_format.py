"""Adding a KV format is one registry row (plus a codec, here an existing one): a fixture row added to a copy of
trtkv/data/kv_formats.json through $TRTKV_KV_FORMATS, with no other file edited, reaches `trtkv plan --json`,
`trtkv probe --formats` (its codec run), each engine's rendered flag or refusal, and the recipe reference.
docs/architecture.md ("Adding a KV format") names this test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((ROOT / "tests" / "data" / "kv_formats" / "fp8_twin_row.json").read_text())
NAME = FIXTURE["name"]  # fp8_twin: stores like fp8_scale1 (its codec), vLLM fp8_e4m3, the LLM API fp8


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a trtkv process that reads the shipped registry plus the fixture row."""
    table = json.loads((ROOT / "trtkv" / "data" / "kv_formats.json").read_text())
    assert NAME not in table["formats"]
    table["formats"][NAME] = FIXTURE["row"]
    (tmp_path / "kv_formats.json").write_text(json.dumps(table))
    return {**os.environ, "PYTHONPATH": str(ROOT), "TRTKV_KV_FORMATS": str(tmp_path / "kv_formats.json"),
            "TRTKV_ENGINES": str(tmp_path / "engines"), "TRTKV_TRITON_REPO": str(tmp_path / "triton_repo")}


def trtkv(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtkv", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_a_new_row_reaches_the_plan_the_engines_and_the_reference(env: dict[str, str], tmp_path: Path) -> None:
    kv = f"quantization.kv_cache={NAME}"
    plan = trtkv(env, "plan", "llama70b_fp8kv", "--json", kv, "build.backend=vllm")
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    rows = {f["format"]: f for f in doc["formats"]}
    assert doc["recipe_kv_format"] == NAME
    # 8 bits per element, per-tensor scale: Llama-70B's 80 layers x 8 KV heads x 128 x 2 (K, V) x 1 byte
    assert rows[NAME]["bytes_per_token"] == rows["fp8"]["bytes_per_token"] == 80 * 8 * 128 * 2

    # vLLM: the row's --kv-cache-dtype; the LLM API: the row's kv_cache_config.dtype; the others refuse
    served = trtkv(env, "serve", "llama70b_fp8kv", "build.backend=vllm", kv, "--dry-run")
    assert served.returncode == 0, served.stderr
    assert " --kv-cache-dtype fp8_e4m3 " in served.stdout
    repo = trtkv(env, "repo", "llama70b_fp8kv_llmapi", kv)
    assert repo.returncode == 0, repo.stderr
    model_yaml = (tmp_path / "triton_repo" / "llama70b_fp8kv_llmapi" / "tensorrt_llm" / "1" / "model.yaml").read_text()
    assert "kv_cache_config:\n  dtype: fp8\n" in model_yaml
    for backend in ("sglang", "tensorrt", "reference"):
        refused = trtkv(env, "serve", "llama70b_fp8kv", f"build.backend={backend}", kv, "--dry-run")
        assert refused.returncode != 0
        assert f"quantization.kv_cache: {NAME} is served by vllm 0.32.0: --kv-cache-dtype fp8_e4m3" in refused.stderr
        assert f"not by build.backend {backend}: use build.backend llmapi or vllm" in refused.stderr

    reference = subprocess.run(
        [sys.executable, "-c", "from trtkv.recipe.reference import reference_markdown; print(reference_markdown())"],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert reference.returncode == 0, reference.stderr
    help_text = FIXTURE["row"]["recipe"]["help"]
    assert f"| `{NAME}` | engine | null | `{NAME}` | {help_text} |" in reference.stdout.splitlines()


@pytest.mark.slow  # runs the real SmolLM2 (about 20 s)
def test_a_new_row_runs_its_codec_in_the_probe(env: dict[str, str], tmp_path: Path, smollm2_dir: Path) -> None:
    out = tmp_path / "probe"
    probe = trtkv(env, "probe", "smollm2_fp8kv", "calibration.num_samples=4", "calibration.seq_len=64", "--formats",
                  f"fp8_scale1,{NAME}", "--lengths", "64", "--no-needle", "--decode-steps", "1", "--threads", "1",
                  "--no-progress", "--output", str(out))
    assert probe.returncode == 0, probe.stderr
    records = {r["format"]: r for r in json.loads((out / "probe.json").read_text())["records"]}
    twin, scale1 = records[NAME], records["fp8_scale1"]
    # the same codec on the same model and tokens: the same figures to the bit, and a real quantization error
    assert twin["kl_mean"] == scale1["kl_mean"] > 0
    assert twin["top1_agreement"] == scale1["top1_agreement"]
    assert twin["kv_bytes_per_token"] == scale1["kv_bytes_per_token"] == 11520  # SmolLM2: 30 x 3 x 64 x 2 x 1 B


def test_a_row_naming_no_codec_is_refused() -> None:
    """storage.codec names a storage row (whose codec in trtkv.kvcache.codecs.CODECS runs): another name is an error
    naming the file, the row and the field, at load."""
    from trtkv.core.errors import TrtkvError
    from trtkv.kvcache.engines import parse_table

    table = json.loads((ROOT / "trtkv" / "data" / "kv_formats.json").read_text())
    table["formats"][NAME] = {**FIXTURE["row"], "storage": {**FIXTURE["row"]["storage"], "codec": "fp8_twin_codec"}}
    with pytest.raises(TrtkvError, match=r"formats\.fp8_twin\.storage\.codec: 'fp8_twin_codec' is no storage row"):
        parse_table(table)
    table["formats"][NAME] = FIXTURE["row"]
    assert parse_table(table).row(NAME).storage.codec == "fp8_scale1"  # type: ignore[union-attr]


READERS = """
import json, sys
from pathlib import Path
from trtkv.checkpoints.checkpoint_quant import read_checkpoint_quant
from trtkv.probe.serving import serving
from trtkv.recipe import load_recipe
folder = Path(sys.argv[1])
(folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"kv_cache_quant_algo": "FP8_TWIN"}}))
stored = read_checkpoint_quant(None, folder, [])
print(json.dumps({"engines": serving(load_recipe("llama70b_fp8kv"), sys.argv[2])["engines"],
                  "kv": stored.kv_cache if stored else None}))
"""


def test_a_new_row_reaches_the_probes_engines_and_the_checkpoint_reader(tmp_path: Path) -> None:
    """The engines a probed format deploys on (trtkv.probe.serving) and a stored checkpoint's KV cache
    (trtkv.checkpoints.checkpoint_quant) come from the registry: the fixture row, and a calibrated twin of it whose
    checkpoints say kv_cache_quant_algo FP8_TWIN, reach them."""
    table = json.loads((ROOT / "trtkv" / "data" / "kv_formats.json").read_text())
    row = FIXTURE["row"]
    table["formats"][NAME] = row
    twin = f"{NAME}_calibrated"
    table["formats"][twin] = {**row, "probe": twin, "engines": [], "recipe": {
        **row["recipe"], "name": twin, "kind": "calibrated", "checkpoint_algo": "FP8_TWIN", "storage": twin}}
    (tmp_path / "kv_formats.json").write_text(json.dumps(table))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRTKV_KV_FORMATS": str(tmp_path / "kv_formats.json")}
    out = subprocess.run([sys.executable, "-c", READERS, str(tmp_path), NAME], env=env, capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    # the row's engines (vLLM, the LLM API) on the recipe's H100, and none of the others
    assert doc["engines"] == {"llmapi": ["H100-80GB"], "vllm": ["H100-80GB"]}
    assert doc["kv"] == f"{twin} per tensor"
