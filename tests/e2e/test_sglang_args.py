"""Every SGLang command trtkv writes, parsed strictly by SGLang's own parser (`prepare_server_args`, sglang 0.5.23 in
.venv-sglang, `make install-sglang`); every sglang row of the formats table selects a value that parser accepts; and
the --quantization-param-path JSON validated by SGLang's own pydantic schema. SGLang is not served here: its CPU path
wants AMX/AVX-512 (this machine type is AVX2-only)."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import side_python
from tests.support.planned import deploy
from trtkv.backends import sglang, sglang_scales
from trtkv.core import paths
from trtkv.core.apikey import API_KEY_ENV
from trtkv.core.errors import TrtkvError
from trtkv.deploy import Options, Target, launch
from trtkv.kvcache.engines import load_table
from trtkv.recipe import load_recipe
from trtkv.recipe.enums import KVCacheQuant

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PYTHON = paths.project_root() / sglang.SGLANG_VENV / "bin" / "python"
needs_sglang = pytest.mark.skipif(not PYTHON.is_file(), reason=f"{PYTHON} is missing: `make install-sglang` (SGLang's "
                                                                f"parser in a venv of its own; `make test` installs it)")
RECIPE = "llama70b_fp8kv_sglang"

PARSE = """
import json, sys
from sglang.srt.server_args import prepare_server_args
out = []
for args in json.loads(sys.stdin.read()):
    try:
        a = prepare_server_args(args)  # strict: an unknown flag or a bad choice exits 2
    except SystemExit as exc:
        out.append({"error": exc.code})
        continue
    out.append({"model_path": a.model_path, "kv_cache_dtype": a.kv_cache_dtype, "tp": a.tp_size, "pp": a.pp_size,
                "host": a.host, "port": a.port, "api_key": a.api_key, "qpp": a.quantization_param_path,
                "context_length": a.context_length, "max_running_requests": a.max_running_requests,
                "chunked_prefill_size": a.chunked_prefill_size, "served_model_name": a.served_model_name,
                "enable_metrics": a.enable_metrics, "disable_radix_cache": a.disable_radix_cache})
print(json.dumps(out))
"""


def parse(argvs: list[list[str]]) -> list[dict]:
    proc = side_python.run([str(PYTHON), "-c", PARSE], input=json.dumps(argvs), timeout=300, cwd="/", preload="sglang")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def launch_args(cmd: list[str]) -> list[str]:
    return cmd[cmd.index("sglang.launch_server") + 1:]


def deploy_args(tmp_path: Path, overrides: list[str]) -> list[str]:
    """The launch_server arguments of the k8s Deployment trtkv writes, as its container's bash expands them."""
    out = deploy(load_recipe(RECIPE, overrides), Target.K8S, tmp_path / "k8s", log=lambda _m: None,
                 options=Options(model_source="s3://my-bucket/x"))
    objs = [d for p in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    script = dep["spec"]["template"]["spec"]["containers"][0]["command"][2]
    script = script.split(launch.REQUIRE_KEY, 1)[1]  # after the key's read from its file and the refusal of none
    return launch_args(shlex.split(script.replace(f'"${API_KEY_ENV}"', "the-key")))


@needs_sglang
def test_every_sglang_command_trtkv_writes_parses_with_sglangs_parser(tmp_path: Path) -> None:
    cases = [([], "fp8_e4m3", None), (["quantization.weights=none"], "fp8_e4m3", sglang_scales.SCALES_FILE),
             (["quantization.kv_cache=none"], "auto", None), (["quantization.kv_cache=fp8_cast"], "fp8_e4m3", None),
             (["quantization.kv_cache=nvfp4", "hardware.gpu=B200"], "nvfp4", None),
             (["build.tp_size=2", "build.pp_size=2"], "fp8_e4m3", None),
             (["triton.enable_kv_cache_reuse=false"], "fp8_e4m3", None)]
    argvs, wanted = [], []
    for i, (overrides, dtype, qpp) in enumerate(cases):
        recipe = load_recipe(RECIPE, overrides)
        served = launch_args(sglang.gpu_command(recipe, sglang.hf_checkpoint_dir(recipe)))
        argvs += [served, deploy_args(tmp_path / str(i), overrides)]
        wanted += [(recipe, dtype, qpp, None), (recipe, dtype, qpp, "the-key")]
    for p, (recipe, dtype, qpp, key) in zip(parse(argvs), wanted, strict=True):
        assert "error" not in p, p
        # the container's view: the canonical paths, docker and the deploy files alike
        assert p["model_path"] == f"/models/{recipe.name}/checkpoint/hf"
        assert p["kv_cache_dtype"] == dtype and p["api_key"] == key
        assert p["qpp"] is None or p["qpp"] == f"/models/{recipe.name}/engine/{sglang_scales.SCALES_FILE}"
        # prefix caching: SGLang's radix cache as it ships (on), off only when the recipe says so
        assert p["disable_radix_cache"] is (recipe.triton.enable_kv_cache_reuse is False)
        assert (p["tp"], p["pp"]) == (recipe.build.tp_size, recipe.build.pp_size) and p["host"] == "0.0.0.0"
        assert p["port"] == recipe.triton.http_port and p["served_model_name"] == recipe.name and p["enable_metrics"]
        assert (p["context_length"], p["max_running_requests"], p["chunked_prefill_size"]) == (
            recipe.build.max_seq_len, recipe.build.max_batch_size, recipe.build.max_num_tokens)
        assert (p["qpp"] and Path(p["qpp"]).name) == qpp
    assert parse([["--model-path", "/m", "--no-such-flag"]]) == [{"error": 2}]  # the parser is strict


def _row_argvs() -> dict[str, list[str]]:
    """{test id: the arguments} of every sglang row of the formats table (a "(flag)" value is a bare flag)."""
    out = {}
    for fmt in load_table().formats.values():
        for row in fmt.engines:
            if row.engine == "sglang":
                argv = [row.config] if row.value == "(flag)" else [row.config, row.value]
                out[f"{fmt.name}:{' '.join(argv)}"] = argv
    return out


@pytest.fixture(scope="module")
def parsed_rows() -> dict[str, dict]:
    """Every row parsed in one interpreter (importing sglang costs ~15 s of CPU each time)."""
    rows = _row_argvs()
    return dict(zip(rows, parse([["--model-path", "/m", *argv] for argv in rows.values()]), strict=True))


def test_every_sglang_row_is_keyed_to_the_pinned_version() -> None:
    rows = [(f.name, r.version) for f in load_table().formats.values() for r in f.engines if r.engine == "sglang"]
    assert rows and all(v == sglang.SGLANG_VERSION for _, v in rows), rows


def test_every_kv_cache_dtype_trtkv_passes_to_sglang_has_a_row() -> None:
    """trtkv's SGLang backend writes --kv-cache-dtype nvfp4 for NVFP4 KV on Blackwell: the table keys that value too,
    so the row check below parses it."""
    rows = {r.value for f in load_table().formats.values() for r in f.engines if r.engine == "sglang"}
    written = set()
    for q in KVCacheQuant:
        for gpu in ("H100-80GB", "B200"):
            try:
                written.add(sglang.kv_cache_dtype(load_recipe(RECIPE, [f"quantization.kv_cache={q.value}",
                                                                       f"hardware.gpu={gpu}"])))
            except TrtkvError:
                continue  # a KV format (or GPU) the recipe validation refuses on SGLang
    assert {"fp8_e4m3", "nvfp4", "auto"} <= written and written <= rows, (written, rows)
    assert "nvfp4:--kv-cache-dtype nvfp4" in _row_argvs()


@needs_sglang
@pytest.mark.parametrize("case", list(_row_argvs()))
def test_each_sglang_row_of_the_formats_table_names_a_value_sglangs_parser_accepts(case: str,
                                                                                   parsed_rows: dict) -> None:
    argv, p = _row_argvs()[case], parsed_rows[case]
    assert "error" not in p, f"{case}: SGLang {sglang.SGLANG_VERSION}'s parser rejects {argv}"
    if argv[0] == "--kv-cache-dtype":
        assert p["kv_cache_dtype"] == argv[1]


@needs_sglang
def test_the_row_check_fails_on_a_flag_the_parser_rejects() -> None:
    """What the formats table named before 0.5.23 was pinned (--int8-kv-cache, from docs on main) is rejected."""
    assert parse([["--model-path", "/m", "--int8-kv-cache"], ["--model-path", "/m", "--kv-cache-dtype", "int8"]]) == [
        {"error": 2}, {"error": 2}]


def _sglang_schema(python: Path) -> dict:
    """SGLang's own KVCacheQuantSchema and QuantParamSchema classes, taken from its installed weight_utils.py (the
    module itself imports transformers 5.19 and more, which this parser-only venv does not hold)."""
    found = side_python.run([str(python), "-c", "import sglang, os; print(os.path.dirname(sglang.__file__))"],
                            timeout=120, cwd="/", preload="sglang")
    found.check_returncode()
    site = found.stdout.strip().splitlines()[-1]
    return {"source": Path(site, "srt", "model_loader", "weight_utils.py").read_text()}


VALIDATE = """
import ast, json, sys
from typing import Dict, Optional
from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
src, doc, ctx = json.loads(sys.stdin.read())
tree = ast.parse(src)
keep = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in ("KVCacheQuantSchema", "QuantParamSchema")]
assert len(keep) == 2, [n.name for n in keep]
ns = {"BaseModel": BaseModel, "ConfigDict": ConfigDict, "ValidationInfo": ValidationInfo,
      "model_validator": model_validator, "Dict": Dict, "Optional": Optional}
exec(compile(ast.Module(body=keep, type_ignores=[]), "weight_utils.py", "exec"), ns)
schema = ns["QuantParamSchema"].model_validate(doc, context=ctx)
print(json.dumps({str(k): v for k, v in schema.kv_cache.scaling_factor[ctx["tp_rank"]].items()}))
"""


@needs_sglang
def test_the_scales_json_trtkv_writes_validates_with_sglangs_schema(tmp_path: Path) -> None:
    recipe = load_recipe(RECIPE, ["quantization.weights=none"])
    n = int(recipe.model.num_layers or 0)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "llama"}')
    layers = [{"layer": i, "k_amax": 2.0 + i, "v_amax": 1.0} for i in range(n)]
    (tmp_path / "kv_scales.json").write_text(json.dumps({"kv_cache_quant_algo": "FP8", "layers": layers}))
    doc = json.loads(sglang_scales.write_scales_file(recipe, tmp_path, tmp_path).read_text())
    src = _sglang_schema(PYTHON)["source"]
    assert ast.parse(src)
    for rank in range(recipe.build.tp_size):
        ctx = {"model_type": "llama", "num_hidden_layers": n, "tp_rank": rank, "tp_size": recipe.build.tp_size}
        proc = subprocess.run([str(PYTHON), "-c", VALIDATE], input=json.dumps([src, doc, ctx]), capture_output=True,
                              text=True, timeout=120, cwd="/")  # a fresh interpreter: pydantic resolves the exec'd names
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert len(got) == n and got["5"] == pytest.approx(7.0 / 448)
    bad = {**doc, "model_type": "gemma3"}  # SGLang refuses scales made for another model type
    ctx = {"model_type": "llama", "num_hidden_layers": n, "tp_rank": 0, "tp_size": recipe.build.tp_size}
    proc = subprocess.run([str(PYTHON), "-c", VALIDATE], input=json.dumps([src, bad, ctx]), capture_output=True,
                          text=True, timeout=120, cwd="/")  # a fresh interpreter: pydantic resolves the exec'd names
    assert proc.returncode != 0 and "different model type" in proc.stderr
