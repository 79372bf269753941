"""The host KV tier (#55): the recipe key in each engine's unit and scope, the refusals naming the
engine or release that serves a tier, the pinned memory a deployment asks for, the repository's
Triton parameters and the plan's capacity per tier."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.planned import deploy
from trtkv.backends import llmapi_args, vllm_command
from trtkv.backends.sglang import server_args as sglang_args
from trtkv.core.errors import RecipeError
from trtkv.deploy import Options, Target
from trtkv.deploy.resources import host_tier
from trtkv.engines.kv_tiers import engine_tier_params
from trtkv.plan import plan
from trtkv.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
GIB = 1024**3
TIER = "triton.kv_host_tier_gib_per_replica"


def gpu(backend: str, *more: str):  # noqa: ANN201 - a Recipe
    """Llama-3-70B FP8 on 4 x H100 (TP 4), served by `backend`."""
    name = {"tensorrt": "llama70b_fp8kv", "llmapi": "llama70b_fp8kv_llmapi"}.get(backend, "llama70b_fp8kv_sglang")
    return load_recipe(RECIPES / f"{name}.yaml", [f"build.backend={backend}", *more])


def test_each_engine_gets_the_tier_in_its_own_unit_and_scope() -> None:
    v = gpu("vllm", f"{TIER}=100")
    args = vllm_command.server_args(v, Path("/m"), "0.0.0.0")
    # vLLM: GiB for the engine, summed over its 4 TP ranks (--numa-bind left out: host_tier().numa says why)
    assert args[args.index("--kv-offloading-size") + 1] == "100"
    assert args[args.index("--kv-offloading-backend") + 1] == "native"
    assert "--numa-bind" not in args and "numactl" in host_tier(v).numa
    assert host_tier(v).bytes_per_replica == 100 * GIB
    s = gpu("sglang", f"{TIER}=100")
    args = sglang_args(s, Path("/m"), "0.0.0.0")
    # SGLang: whole GB (1e9) per rank: 100 GiB / 4 ranks = 26.8e9 bytes -> 26
    assert args[args.index("--hicache-size") + 1] == "26"
    assert "--enable-hierarchical-cache" in args
    assert host_tier(s).bytes_per_replica == 26 * 10**9 * 4
    a = gpu("llmapi", f"{TIER}=100")
    cfg = llmapi_args.llm_args(a, Path("/m"))["kv_cache_config"]
    assert cfg["host_cache_size"] == 100 * GIB // 4  # bytes per rank
    t = gpu("tensorrt", f"{TIER}=100")
    assert engine_tier_params(t) == {
        "kv_cache_host_memory_bytes": str(100 * GIB // 4),
        "kv_cache_onboard_blocks": "true",
    }


def test_attention_dp_splits_vllms_size_over_its_engines() -> None:
    v = gpu("vllm", f"{TIER}=100", "build.attention_dp_size=2")
    args = vllm_command.server_args(v, Path("/m"), "0.0.0.0")
    assert args[args.index("--kv-offloading-size") + 1] == "50"


def test_without_a_tier_nothing_changes() -> None:
    v = gpu("vllm")
    assert "--kv-offloading-size" not in vllm_command.server_args(v, Path("/m"), "0.0.0.0")
    assert "--hicache-size" not in sglang_args(gpu("sglang"), Path("/m"), "0.0.0.0")
    assert "host_cache_size" not in llmapi_args.llm_args(gpu("llmapi"), Path("/m"))["kv_cache_config"]
    assert engine_tier_params(gpu("tensorrt")) == {
        "kv_cache_host_memory_bytes": "",
        "kv_cache_onboard_blocks": "",
    }


@pytest.mark.parametrize(
    ("recipe", "overrides", "says"),
    [
        ("smollm2_fp8kv.yaml", [f"{TIER}=4", "triton.enable_kv_cache_reuse=false"], "block reuse is"),
        ("smollm2_fp8kv_vllm.yaml", [f"{TIER}=4"], "already lives in host memory"),
        ("llama70b_fp8kv_sglang.yaml", [f"{TIER}=2"], "under 1 GB per rank"),
        (
            "llama70b_fp8kv_llmapi.yaml",
            ["triton.kv_disk_tier_gib_per_replica=500"],
            "first in 1.3.0rc27",
        ),
        ("llama70b_fp8kv_sglang.yaml", ["triton.kv_disk_tier_gib_per_replica=500"], "no size"),
        (
            "llama70b_fp8kv_sglang.yaml",
            ["build.backend=vllm", "triton.kv_disk_tier_gib_per_replica=500"],
            "fs tier",
        ),
    ],
)
def test_a_tier_the_engine_cannot_serve_is_refused_naming_who_serves_one(recipe: str, overrides: list[str], says: str) -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe(RECIPES / recipe, overrides)
    assert says in str(err.value)


def _server_memory(out: Path) -> dict:
    for p in sorted(out.glob("*.yaml")):
        for d in yaml.safe_load_all(p.read_text()):
            if d and d["kind"] == "Deployment":
                return d["spec"]["template"]["spec"]["containers"][0]["resources"]
    raise AssertionError("no Deployment")


def _gib(quantity: str) -> float:
    return float(quantity[:-2]) / (1024 if quantity.endswith("Mi") else 1)


def test_the_pinned_tier_is_inside_the_pods_memory_request_limit_and_slurms_mem(
    tmp_path: Path,
) -> None:
    opts = Options(model_source="s3://my-bucket/x")
    base = _server_memory(deploy(gpu("vllm"), Target.K8S, tmp_path / "a", log=lambda _m: None, options=opts))
    tier = _server_memory(deploy(gpu("vllm", f"{TIER}=100"), Target.K8S, tmp_path / "b", log=lambda _m: None, options=opts))
    for side, factor in (("requests", 1.0), ("limits", 1.25)):
        grown = _gib(tier[side]["memory"]) - _gib(base[side]["memory"])
        assert grown == pytest.approx(100 * factor, abs=1.5)  # ceil() to whole GiB on each side
    mem = [
        line
        for side in ("a", "b")
        for line in (
            deploy(
                gpu("vllm", *([f"{TIER}=100"] if side == "b" else [])),
                Target.SLURM,
                tmp_path / f"s{side}",
                log=lambda _m: None,
            )
            / "job.sbatch"
        )
        .read_text()
        .splitlines()
        if line.startswith("#SBATCH --mem-per-gpu=")
    ]
    per_gpu = [int(line.split("=")[1].rstrip("G")) for line in mem]
    assert per_gpu[1] - per_gpu[0] == pytest.approx(100 * 1.25 / 4, abs=1)


def test_plan_gives_each_formats_host_tokens_in_the_device_layout() -> None:
    p = plan(gpu("vllm", f"{TIER}=100"))
    assert p.kv_tiers is not None
    rows = {r.format: r for r in p.kv_tiers.rows}
    fp8, fp16 = rows["fp8"], rows["fp16"]
    # the host tier holds twice the tokens in FP8 as in FP16: the engines copy blocks as stored
    assert fp8.host_tokens == pytest.approx(2 * fp16.host_tokens, rel=1e-6)
    by_cap = {c.format: c for c in p.formats}
    assert fp8.host_tokens == int(100 * GIB / 4 // by_cap["fp8"].bytes_per_token_per_gpu)
    assert fp8.resident_sequences > fp8.running_sequences
    assert "kv_tiers" in p.to_dict()
    assert "kv_tiers" not in plan(gpu("vllm")).to_dict()  # plan --json unchanged without a tier


DATA = Path(__file__).resolve().parents[1] / "data"


def test_tensorrt_llms_names_are_its_own() -> None:
    """The LLM API field and the engine path's parameters are in the lists read from upstream (the
    field list was read after 1.3.0rc20: it names the field, the refusal of disk_cache_size rests on
    1.2.1 having none, trtkv.recipe.kv_tiers)."""
    import json

    fields = json.loads((DATA / "llm_args_fields.json").read_text())["kv_cache_config"]
    assert "host_cache_size" in fields
    params = (DATA / "triton_tensorrt_llm_parameters.txt").read_text().split()
    assert {"kv_cache_host_memory_bytes", "kv_cache_onboard_blocks"} <= set(params)


def test_dynamo_workers_carry_the_tier(tmp_path: Path) -> None:
    from tests.support.planned import size
    from trtkv.backends import llmapi, vllm
    from trtkv.deploy import dynamo

    a = gpu("llmapi", f"{TIER}=100")
    for role in ("agg", "prefill", "decode"):
        cfg = llmapi.LlmApiDynamo().engine_config(a, role)
        assert cfg["kv_cache_config"]["host_cache_size"] == 100 * GIB // 4
    v = gpu("vllm", f"{TIER}=100")
    agg = vllm.VllmDynamo().args(v, Path("/m"), "agg", "/c")
    assert agg[agg.index("--kv-offloading-size") + 1] == "100"
    decode = vllm.VllmDynamo().args(v, Path("/m"), "decode", "/c")
    assert "--kv-offloading-size" not in decode  # it would replace NIXL: a MultiConnector holds both
    assert "MultiConnector" in decode[decode.index("--kv-transfer-config") + 1]
    objs = dynamo.objects(a, size(a, replicas=1), "agg", "load", "ns")
    dgd = next(o for o in objs if o["kind"] == "DynamoGraphDeployment")
    base = dynamo.objects(gpu("llmapi"), size(gpu("llmapi"), replicas=1), "agg", "load", "ns")
    base_dgd = next(o for o in base if o["kind"] == "DynamoGraphDeployment")

    def worker_mem(d: dict) -> float:
        tpl = d["spec"]["components"][1]["podTemplate"]["spec"]
        main = next(c for c in tpl["containers"] if c["name"] == "main")
        return _gib(main["resources"]["requests"]["memory"])

    assert worker_mem(dgd) - worker_mem(base_dgd) == pytest.approx(100, abs=1.5)


def test_plan_text_shows_the_tiers() -> None:
    from trtkv.plan import tier_lines

    text = "\n".join(tier_lines(plan(gpu("sglang", f"{TIER}=100")).kv_tiers))
    assert "--hicache-size 26" in text and "whole GB (1e9 bytes) per rank" in text
    assert "fp8" in text and "resident" in text


def test_plan_summary_names_the_tier_only_when_set() -> None:
    from trtkv.cli.plan_summary import summary

    r = gpu("sglang", f"{TIER}=100")
    text = " ".join(summary(plan(r), r))
    assert "Host tier:" in text and "--hicache-size 26" in text and "resident" in text
    base = gpu("sglang")
    assert "Host tier:" not in " ".join(summary(plan(base), base))


def test_the_reference_runtime_takes_the_host_tier_as_its_second_block_pool() -> None:
    """The reference runtime's host tier (trtkv.runtime.block_reuse) is the recipe's GiB as bytes, in the
    kv_cache_host_memory_bytes parameter its repository carries; 0 where the key is unset (#55)."""
    from trtkv.recipe import host_tier_bytes

    r = load_recipe(RECIPES / "smollm2_fp8kv.yaml", [f"{TIER}=0.25"])
    assert host_tier_bytes(r) == 2**28
    assert host_tier_bytes(load_recipe(RECIPES / "smollm2_fp8kv.yaml")) == 0
    assert host_tier_bytes(gpu("vllm", f"{TIER}=100")) == 0  # the engines take it in their own unit


@pytest.mark.parametrize(("tier", "bytes_"), [("100", str(100 * GIB // 4)), (None, "0")])
def test_the_engine_paths_repository_carries_the_tier_per_rank(tier: str | None, bytes_: str) -> None:
    """config.pbtxt's kv_cache_host_memory_bytes on the engine path is the tier's bytes per rank (it was
    overwritten by the reference runtime's key, 0 off the reference backend, so the tier never reached
    the served engine), 0 without a tier (#55)."""
    from trtkv.repo import generate

    r = gpu("tensorrt", *([f"{TIER}={tier}"] if tier else []))
    values = generate.template_values(generate.plan_repo(r))
    assert values["kv_cache_host_memory_bytes"] == bytes_
    assert values["kv_cache_onboard_blocks"] == ("true" if tier else "")
