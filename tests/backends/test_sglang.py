"""Backend sglang: its commands, rules, scales JSON and deploy files (fenced as vLLM's), without SGLang installed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.planned import deploy
from trtkv.backends import BACKENDS, for_recipe, sglang, sglang_scales
from trtkv.core.apikey import API_KEY_ENV
from trtkv.core.errors import RecipeError, StageError
from trtkv.deploy import Options, Target, k8s, launch
from trtkv.deploy.check import check_object
from trtkv.kvcache.engines import load_table
from trtkv.recipe import Backend, KVCacheQuant, load_recipe

RECIPE = "llama70b_fp8kv_sglang"
SENTINEL = "sglang-key-never-written-4242"


def quiet(_m: str) -> None:
    pass


def docs(folder: Path) -> list[dict[str, Any]]:
    return [d for p in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_the_recipe_serves_fp8_kv_with_the_checkpoints_scales_on_four_gpus() -> None:
    recipe = load_recipe(RECIPE)
    assert recipe.build.backend is Backend.SGLANG and BACKENDS[Backend.SGLANG] is sglang.BACKEND
    backend = for_recipe(recipe)
    assert backend.repo is None and backend.layout == "openai" and not backend.serving.serves_locally(recipe)
    cmd = sglang.gpu_command(recipe, sglang.hf_checkpoint_dir(recipe))
    i = cmd.index(sglang.SGLANG_IMAGE)
    assert cmd[:2] == ["docker", "run"] and cmd[i + 1:i + 4] == ["python3", "-m", "sglang.launch_server"]
    assert all(cmd[j + 1].endswith(":ro") for j, t in enumerate(cmd) if t == "-v") and "--ipc=host" not in cmd
    assert flag(cmd, "-p").startswith("127.0.0.1:")
    assert flag(cmd, "--kv-cache-dtype") == "fp8_e4m3" and flag(cmd, "--tp-size") == "4"
    assert flag(cmd, "--model-path").endswith("checkpoint/hf") and "--quantization-param-path" not in cmd
    assert flag(cmd, "--context-length") == "32768" and flag(cmd, "--chunked-prefill-size") == "8192"
    assert "--api-key" not in cmd  # the local container: keyless on 127.0.0.1, as vLLM's


def test_weights_none_hands_the_scales_over_as_sglangs_json() -> None:
    recipe = load_recipe(RECIPE, ["quantization.weights=none"])
    args = sglang.server_args(recipe, sglang.hf_checkpoint_dir(recipe), "0.0.0.0")
    assert flag(args, "--quantization-param-path").endswith(f"engine/{sglang_scales.SCALES_FILE}")
    assert sglang.engine_dir(recipe) in sglang.SglangServer().reads(recipe)  # deployments mount it
    assert flag(sglang.server_args(load_recipe(RECIPE, ["quantization.kv_cache=none"]), Path("/m"), "h"),
                "--kv-cache-dtype") == "auto"


def test_quant_param_document_is_sglangs_schema_shape() -> None:
    doc = sglang_scales.quant_param_document([448.0, 10.0], [224.0, 20.0], 2, "llama")
    assert doc["model_type"] == "llama" and doc["kv_cache"]["dtype"] == "float8_e4m3fn"
    assert doc["kv_cache"]["scaling_factor"] == {0: {0: 1.0, 1: pytest.approx(20 / 448)},
                                                 1: {0: 1.0, 1: pytest.approx(20 / 448)}}  # max(k, v): K and V share it
    json.dumps(doc)  # int keys become strings, which SGLang's pydantic model turns back into ints
    with pytest.raises(StageError, match="rerun `trtkv calibrate`"):
        sglang_scales.quant_param_document([1.0], [], 1, None)


def test_write_scales_file_reads_calibrates_kv_scales(tmp_path: Path) -> None:
    recipe = load_recipe(RECIPE, ["quantization.weights=none"])
    n = recipe.model.num_layers or 0
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(StageError, match="kv_scales.json is missing"):
        sglang_scales.write_scales_file(recipe, tmp_path, tmp_path)
    layers = [{"layer": i, "k_amax": 4.48 * (i + 1), "v_amax": 1.0} for i in range(n)]
    (tmp_path / "kv_scales.json").write_text(json.dumps({"kv_cache_quant_algo": "FP8", "layers": layers}))
    doc = json.loads(sglang_scales.write_scales_file(recipe, tmp_path, tmp_path).read_text())
    assert sorted(doc["kv_cache"]["scaling_factor"]) == ["0", "1", "2", "3"]
    assert doc["kv_cache"]["scaling_factor"]["3"]["1"] == pytest.approx(0.02)


def test_the_chunk_passed_and_the_fraction_planned_are_the_recipes_max_num_tokens() -> None:
    """--chunked-prefill-size is build.max_num_tokens even when every prompt fits it: -1 (chunking off) made SGLang
    size its reserve for max_prefill_tokens (16,384 tokens x 1.5 MiB), which exceeds a 24 GB card (a negative
    fraction) and was not the step the recipe asked for."""
    from trtkv.engines.sglang import sglang_default_mem_fraction, sglang_knobs
    from trtkv.engines.sizing import gpu_memory_mib

    short = ["build.max_seq_len=4096", "build.max_input_len=3584", "bench.needle_context_lengths=[2048]"]
    recipe = load_recipe(RECIPE, short)
    assert not recipe.chunked_context  # every prompt fits max_num_tokens 8192
    args = sglang.server_args(recipe, Path("/m"), "h")
    assert flag(args, "--chunked-prefill-size") == str(recipe.build.max_num_tokens) == "8192"
    b = recipe.build
    planned = sglang_default_mem_fraction(gpu_memory_mib(recipe), b.tp_size, b.pp_size, 8192, b.max_batch_size)
    assert sglang_knobs(recipe).value == planned == float(flag(args, "--mem-fraction-static"))
    small = load_recipe(RECIPE, [*short, "build.max_num_tokens=4096", "hardware.gpu=RTX-4090", "build.tp_size=1",
                                 "hardware.count=1"])
    assert flag(sglang.server_args(small, Path("/m"), "h"), "--chunked-prefill-size") == "4096"
    assert 0.6 < sglang_knobs(small).value < 0.8  # SGLang's own figure for a 4,096-token chunk on 24 GB


@pytest.mark.parametrize("overrides,field,message", [
    (["hardware.gpu=cpu", "build.tp_size=1", "hardware.count=1"], "hardware.gpu", "does not serve SGLang on the CPU"),
    (["quantization.kv_cache=int8"], "quantization.kv_cache", "SGLang 0.5.23 has no INT8 KV cache"),
    (["quantization.weights=int4_awq"], "quantization.weights", "fp8 or unquantized weights"),
    (["quantization.kv_skip_layers=[0]"], "quantization.kv_skip_layers", "SGLang"),
    (["build.tp_size=8", "build.pp_size=2", "hardware.count=16"], "build.tp_size", "one node"),
    (["quantization.kv_cache=nvfp4"], "quantization.kv_cache", "Blackwell"),
])
def test_what_sglang_refuses_is_said_at_validation(overrides: list[str], field: str, message: str) -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe(RECIPE, overrides)
    assert field in str(err.value) and message in str(err.value)


def test_nvfp4_kv_on_blackwell_selects_sglangs_nvfp4() -> None:
    recipe = load_recipe(RECIPE, ["quantization.kv_cache=nvfp4", "hardware.gpu=B200"])
    assert sglang.kv_cache_dtype(recipe) == "nvfp4"


def test_nvfp4_on_sm100_warns_of_sglangs_x6_on_modelopts_amax_over_448(tmp_path: Path) -> None:
    """SGLang 0.5.23 multiplies NVFP4 k/v_scale by 6 on SM100; ModelOpt 0.47 exports amax / 448: build says so."""
    recipe = load_recipe(RECIPE, ["quantization.kv_cache=nvfp4", "hardware.gpu=B200"])
    warning = sglang_scales.nvfp4_scale_warning(recipe)
    assert warning and "6x too large" in warning and "build.backend llmapi" in warning
    assert any(warning in line for line in sglang.SglangBuilder().dry_run_lines(recipe, tmp_path, tmp_path))
    assert "6x too large" in load_table().engine_rows("nvfp4", "sglang")[0].checkpoint_scales  # docs/kv-formats.md too
    assert sglang_scales.nvfp4_scale_warning(load_recipe(RECIPE)) is None  # fp8 on H100


def test_every_kv_cache_sglang_serves_gets_its_table_rows_value() -> None:
    """The serve command and docs/kv-formats.md agree: fp8_cast is fp8_e4m3 (scale 1.0), never auto (a 16-bit KV)."""
    table, served = load_table(), {}
    for q in KVCacheQuant:
        for gpu in ("H100-80GB", "B200"):
            try:
                recipe = load_recipe(RECIPE, [f"quantization.kv_cache={q.value}", f"hardware.gpu={gpu}"])
            except RecipeError:
                continue  # a format (or GPU) the validation refuses on SGLang
            rows = table.engine_rows("bf16" if q is KVCacheQuant.NONE else q.value, "sglang")
            assert rows, q  # validation lets through only what the table has an sglang row for
            served[q.value] = sglang.kv_cache_dtype(recipe)
            assert served[q.value] == rows[0].value, (q, gpu)
            assert flag(sglang.server_args(recipe, Path("/m"), "h"), "--kv-cache-dtype") == rows[0].value
    assert served == {"fp8": "fp8_e4m3", "fp8_cast": "fp8_e4m3", "nvfp4": "nvfp4", "none": "auto"}, served
    cast = load_recipe(RECIPE, ["quantization.kv_cache=fp8_cast"])
    assert "--quantization-param-path" not in sglang.server_args(cast, Path("/m"), "h")  # no scales: SGLang uses 1.0
    assert "1.0" in sglang.SglangBuilder().kv_source_line(cast)


def test_k8s_files_are_fenced_unprivileged_and_keyed_from_the_secret(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, SENTINEL)
    recipe = load_recipe(RECIPE)
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", log=quiet, options=Options(model_source="s3://my-bucket/x"))
    objs = docs(out)
    assert all(check_object(o) == [] for o in objs)
    for path in out.rglob("*"):
        assert not path.is_file() or SENTINEL not in path.read_text()
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["image"] == sglang.SGLANG_IMAGE and spec["securityContext"]["runAsNonRoot"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert not any("valueFrom" in e for e in c["env"])  # the key is a Secret file, read by the container's shell
    key_file = next(e["value"] for e in c["env"] if e["name"] == "TRTKV_API_KEY_FILE")
    assert c["command"][:2] == ["bash", "-c"] and c["command"][2].startswith(f'{API_KEY_ENV}="$(cat {key_file} ')
    assert c["livenessProbe"]["httpGet"]["path"] == "/health" and "/models/" in c["command"][2]
    assert f'--api-key "${API_KEY_ENV}"' in c["command"][2] and "sglang.launch_server" in c["command"][2]
    assert "\x00" not in c["command"][2] and sglang.KEY_REF == launch.KEY_REF
    readme = (out / "README.md").read_text()
    assert "uid 10001, never root" in readme and "--api-key" in readme
    # the key really is expanded from its file, and none refuses to start
    key = tmp_path / "key"
    key.write_text("k 1\n")
    script = c["command"][2].replace(key_file, str(key))
    proc = subprocess.run(["bash", "-c", script.replace("exec python3", "exec echo")],
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "--api-key k 1" in proc.stdout
    proc = subprocess.run(["bash", "-c", c["command"][2]], env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and f"{API_KEY_ENV} is empty" in proc.stderr
    assert k8s.k8s_name(recipe) in json.dumps(policy)


def test_slurm_files_require_the_key_and_mount_read_only(tmp_path: Path) -> None:
    from tests.support.planned import size
    from trtkv.deploy import render, slurm

    recipe = load_recipe(RECIPE)
    files, _readme = render(recipe, Target.SLURM, size(recipe), tmp_path / "s")
    job, rank = files[slurm.JOB_SCRIPT], files[slurm.RANK_SCRIPT]
    line = next(x for x in job.splitlines() if x.startswith("MOUNTS="))
    mounts = subprocess.run(["bash", "-c", line + '; echo "$MOUNTS"'], capture_output=True, text=True, check=True,
                            env={"ENGINES": "/e", "REPOSITORIES": "/r", "HERE": "/h"}).stdout.strip()
    assert all(m.endswith(":ro") for m in mounts.split(",")) and "--container-mounts=\"$MOUNTS\"" in job
    assert f': "${{{API_KEY_ENV}:?' in job and f'--api-key "${API_KEY_ENV}"' in rank and "\x00" not in rank
    assert "sglang.launch_server" in rank and "mpirun" not in rank
