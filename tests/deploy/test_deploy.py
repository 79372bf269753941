"""`trtkv deploy`: Kubernetes (Deployment / LeaderWorkerSet), Slurm and Dynamo files sized by the planner, each
checked by a consumer trtkv did not write (kubernetes-validate's Kubernetes schemas, the LWS and Dynamo CRDs' own
schemas read from upstream, bash -n). The checks are shown to refuse broken objects, so a pass means something."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from trtkv.cli import main
from trtkv.contracts.canary import canary_script
from trtkv.core.errors import RecipeError, StageError
from trtkv.deploy import Target, check, deploy, dynamo, k8s
from trtkv.deploy.check import check_object, crd_schema_info
from trtkv.deploy.launch import REQUIRE_KEY
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import load_recipe

DATA = Path(__file__).parents[1] / "data"
TP8_PP2 = ["build.tp_size=8", "build.pp_size=2", "hardware.count=16"]


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(folder: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(folder.glob("*.yaml")):
        for d in docs(path):
            out.setdefault(d["kind"], d)
    return out


def probe_script(container: dict[str, Any], probe: str) -> str:
    """The python program a probe runs (decoded from its `echo <base64> | base64 -d | python3` line)."""
    line = container[probe]["exec"]["command"][2]
    return base64.b64decode(line.split()[1]).decode()


def test_single_node_k8s_deployment_is_schema_valid_and_probes_run_the_canary(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv")
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", replicas=2, log=lambda _m: None)
    objs = by_kind(out)
    assert set(objs) == {"PersistentVolumeClaim", "Pod", "Deployment", "Service", "NetworkPolicy"}
    dep = objs["Deployment"]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 4  # TP4
    assert server["command"][:2] == ["bash", "-c"]  # the key from the Secret is expanded in the container
    assert "exec mpirun --allow-run-as-root" in server["command"][2]
    assert server["command"][2].count("/opt/tritonserver/bin/tritonserver") == 4
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe_script(server, probe) == canary_script(8000)  # the real one-token inference
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "8002"
    # the models volume holds what the server reads, mounted where the Triton repository's paths point
    from trtkv.recipe.layout import checkpoint_dir, engine_dir, repo_dir

    mounts = {m["subPath"]: m["mountPath"] for m in server["volumeMounts"] if m["name"] == "models"}
    assert mounts == {"engines/llama70b_fp8kv/engine": str(engine_dir(recipe)),
                      "engines/llama70b_fp8kv/checkpoint/tokenizer": str(checkpoint_dir(recipe) / "tokenizer"),
                      "triton_repo/llama70b_fp8kv": str(repo_dir(recipe))}
    config = (repo_dir(recipe) / "tensorrt_llm" / "config.pbtxt")
    if config.is_file():  # the repository names exactly these paths
        assert str(engine_dir(recipe)) in config.read_text()
    assert objs["Service"]["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    sizing = Sizing.load(out)  # the model deploy wrote it with
    assert sizing is not None and (sizing.gpus_per_replica, sizing.nodes_per_replica, sizing.replicas) == (4, 1, 2)
    assert json.loads((out / "sizing.json").read_text())["total_gpus"] == sizing.total_gpus == 8
    readme = (out / "README.md").read_text()
    assert "kubernetes-validate, Kubernetes" in readme and "tag v0.10.0" in readme


def test_16_gpus_on_8_gpu_nodes_is_a_leaderworkerset_of_two(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv", TP8_PP2)
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", log=lambda _m: None)
    objs = by_kind(out)
    assert "Deployment" not in objs
    lws = objs["LeaderWorkerSet"]
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 2
    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    worker = tmpl["workerTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 8 == worker["resources"]["limits"]["nvidia.com/gpu"]
    script = leader["command"][2]
    assert script.count("/opt/tritonserver/bin/tritonserver") == 16  # one tritonserver per rank, all 16 ranks
    assert '-H "$HOSTS"' in script
    assert probe_script(leader, "livenessProbe") == canary_script(8000)
    assert objs["Service"]["spec"]["selector"] == {k8s.LWS_NAME_LABEL: lws["metadata"]["name"], "role": "leader"}
    # LWS makes a headless Service named after itself for the pods' DNS names: ours must not take that name
    assert objs["Service"]["metadata"]["name"] != lws["metadata"]["name"]
    assert '--prefix "$MPI_HOME"' in script and "orte_keep_fqdn_hostnames 1" in script and "-x LD_LIBRARY_PATH" in script
    for c in (leader, worker):
        subprocess.run(["bash", "-n", "-c", c["command"][2]], check=True)


def test_leader_lists_every_pod_of_its_group_with_its_slots() -> None:
    """The host list the leader hands mpirun, computed by bash from LWS's environment (pod DNS names per LWS
    v0.10.0's pod_utils: leader <lws>-<group>.<subdomain>.<ns>, worker i <lws>-<group>-<i>.<subdomain>.<ns>)."""
    snippet = k8s.WORKER_HOSTS.replace("{slots}", "8") + 'echo "$HOSTS"'
    env = {"LWS_LEADER_ADDRESS": "trtkv-x-1.trtkv-x.prod", "LWS_GROUP_SIZE": "3", "PATH": "/usr/bin:/bin"}
    hosts = subprocess.run(["bash", "-c", snippet], env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert hosts == "trtkv-x-1.trtkv-x.prod:8,trtkv-x-1-1.trtkv-x.prod:8,trtkv-x-1-2.trtkv-x.prod:8"


def test_llmapi_across_nodes_runs_trtllm_serve_under_mpirun_and_vllm_uses_ray(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv_llmapi", TP8_PP2)
    lws = by_kind(deploy(recipe, Target.K8S, tmp_path / "a", log=lambda _m: None))["LeaderWorkerSet"]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert "mpirun --allow-run-as-root -H \"$HOSTS\"" in leader["command"][2]
    assert "-np 16 trtllm-llmapi-launch trtllm-serve" in leader["command"][2]
    assert "--tp_size 8 --pp_size 2" in leader["command"][2]
    recipe = load_recipe("llama70b_fp8kv_llmapi", [*TP8_PP2, "build.backend=vllm"])
    lws = by_kind(deploy(recipe, Target.K8S, tmp_path / "v", log=lambda _m: None))["LeaderWorkerSet"]
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    leader, worker = (tmpl[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate"))
    assert leader["command"][2].startswith(REQUIRE_KEY + "ray start --head")  # no vLLM without its key
    assert "--distributed-executor-backend ray" in leader["command"][2]
    assert "--kv-cache-dtype fp8" in leader["command"][2]
    assert worker["command"][2].startswith("until ray start --address=$LWS_LEADER_ADDRESS:6379 --block; do")
    assert 'sum(n["Alive"] for n in ray.nodes())' in leader["command"][2]


def test_slurm_script_srun_pmix_one_task_per_rank(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv", TP8_PP2)
    out = deploy(recipe, Target.SLURM, tmp_path / "slurm", log=lambda _m: None)
    job = (out / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in job and "#SBATCH --ntasks-per-node=8" in job
    assert "srun --mpi=pmix --ntasks=16 --ntasks-per-node=8" in job
    assert '--container-image="$IMAGE"' in job and "IMAGE=${TRTKV_IMAGE:-$DEFAULT_IMAGE}" in job
    assert "DEFAULT_IMAGE='nvcr.io#nvidia/tritonserver:" in job
    rank = (out / "rank.sh").read_text()
    assert 'if [ "$SLURM_PROCID" = 0 ]' in rank and 'prefix"$SLURM_PROCID"_' in rank
    assert "--load-model=tensorrt_llm" in rank.split("fi\n")[1]  # ranks > 0 load only the engine model
    for f in ("job.sbatch", "rank.sh"):
        subprocess.run(["bash", "-n", str(out / f)], check=True)
    llmapi = deploy(load_recipe("llama70b_fp8kv_llmapi"), Target.SLURM, tmp_path / "l", log=lambda _m: None)
    assert "exec trtllm-llmapi-launch trtllm-serve" in (llmapi / "rank.sh").read_text()


def test_dynamo_agg_and_disagg_for_the_llm_api(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv_llmapi", TP8_PP2)
    out = deploy(recipe, Target.DYNAMO, tmp_path / "dyn", target_concurrency=100, log=lambda _m: None)
    agg, disagg = docs(out / "agg.yaml"), docs(out / "disagg.yaml")
    dgd = agg[-1]
    assert dgd["kind"] == "DynamoGraphDeployment" and dgd["spec"]["backendFramework"] == "trtllm"
    worker = dgd["spec"]["components"][1]
    assert worker["multinode"] == {"nodeCount": 2}
    assert worker["replicas"] == 2  # 100 sequences at 64 per replica (max_batch_size bound)
    assert [c["type"] for c in disagg[-1]["spec"]["components"]] == ["frontend", "prefill", "decode"]
    fields = set(json.loads((DATA / "llm_args_fields.json").read_text())["llm_args"])
    for cm in (agg[0], disagg[0]):
        for text in cm["data"].values():
            cfg = yaml.safe_load(text)
            assert set(cfg) <= fields, set(cfg) - fields  # every key a TorchLlmArgs field
            assert cfg["kv_cache_config"]["dtype"] == "fp8"
            assert cfg["tensor_parallel_size"] == 8 and cfg["pipeline_parallel_size"] == 2
    assert "cache_transceiver_config" in yaml.safe_load(disagg[0]["data"]["prefill.yaml"])
    with pytest.raises(StageError, match="Dynamo's workers run the LLM API"):
        deploy(load_recipe("llama70b_fp8kv"), Target.DYNAMO, tmp_path / "no", log=lambda _m: None)
    assert not (tmp_path / "no").exists()


def test_checks_refuse_broken_objects() -> None:
    """The schemas are live: a misspelt field, a wrong type and an unknown enum value are each refused."""
    recipe = load_recipe("llama70b_fp8kv", TP8_PP2)
    from trtkv.deploy import launch, sizing

    s = sizing.size(recipe)
    objs = k8s.objects(recipe, launch.for_recipe(recipe, s), s)
    lws, svc = objs[2], objs[3]
    assert check_object(lws) == [] and check_object(svc) == []
    bad = json.loads(json.dumps(lws))
    bad["spec"]["leaderWorkerTemplate"]["sise"] = 2
    assert any("'sise' was unexpected" in p for p in check_object(bad))
    bad = json.loads(json.dumps(lws))
    bad["spec"]["leaderWorkerTemplate"]["size"] = "two"
    assert any(".spec.leaderWorkerTemplate.size" in p for p in check_object(bad))
    bad = json.loads(json.dumps(lws))
    bad["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["imagee"] = "x"
    assert any("'imagee' was unexpected" in p for p in check_object(bad))
    bad = json.loads(json.dumps(svc))
    bad["spec"]["ports"][0]["port"] = "http"
    assert any("spec.ports[0].port" in p for p in check_object(bad))
    bad["metadata"]["name"] = "Trtkv_X"
    assert any("DNS-1123" in p for p in check_object(bad))
    bad = json.loads(json.dumps(lws))
    bad["metadata"]["labelz"] = {"a": "b"}  # a CRD schema says only "metadata: object"; ObjectMeta's own is applied
    assert any("'labelz' was unexpected" in p for p in check_object(bad))
    bad = json.loads(json.dumps(lws))
    bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["command"][2] = "if then; fi"
    assert any("workerTemplate.spec.containers[0].command: bash -n" in p for p in check_object(bad))
    dgd = dynamo.objects(load_recipe("llama70b_fp8kv_llmapi"), s, "agg")[-1]
    assert check_object(dgd) == []
    dgd["spec"]["components"][1]["type"] = "router"
    assert any("'router' is not one of" in p for p in check_object(dgd))


def test_schema_data_names_its_release() -> None:
    lws = crd_schema_info(check.CRD_SCHEMAS[("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")])
    assert lws["kind"] == "LeaderWorkerSet" and "@2161f38ff333f9e24d3c44adef7cd5d9787cac00 (tag v0.10.0)" in lws["source"]
    dgd = crd_schema_info(check.CRD_SCHEMAS[("nvidia.com/v1beta1", "DynamoGraphDeployment")])
    assert dgd["version"] == "v1beta1" and dgd["served"] and "1.4.0 branch cut" in dgd["source"]


def test_failed_checks_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = load_recipe("llama70b_fp8kv")
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", log=lambda _m: None)
    before = {p.name: p.read_text() for p in out.iterdir()}
    real = k8s.objects

    def broken(*args: Any) -> list[dict[str, Any]]:
        objs = real(*args)
        objs[2]["spec"]["replicas"] = "many"
        return objs

    monkeypatch.setattr(k8s, "objects", broken)
    with pytest.raises(StageError, match=r"(?s)fail their checks \(nothing written.*spec\.replicas"):
        deploy(recipe, Target.K8S, out, replicas=3, log=lambda _m: None)
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["k8s"]  # no temporary folder left


def test_world_size_must_fill_whole_nodes_and_tp16_plans() -> None:
    with pytest.raises(RecipeError, match=r"hardware.count: 12 GPUs per model instance do not fill whole nodes"):
        load_recipe("llama70b_fp8kv", ["build.tp_size=4", "build.pp_size=3", "hardware.count=12"])
    load_recipe("llama70b_fp8kv", ["build.tp_size=4", "build.pp_size=3", "hardware.count=12",
                                   "hardware.gpus_per_node=4"])
    assert main(["plan", "llama70b_fp8kv", "build.tp_size=16", "hardware.count=16"]) == 0  # 8 KV heads, replicated


def test_cli_takes_overrides_after_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "llama70b_fp8kv", "--target", "k8s", "--output", str(tmp_path / "o"), *TP8_PP2,
                 "--target-concurrency", "200"]) == 0
    said = capsys.readouterr().out
    assert re.search(r"Replicas: 4 \(--target-concurrency 200 / 64 per replica\) -> 64 GPUs", said)
    assert main(["deploy", "smollm2_fp8kv", "--target", "k8s", "--output", str(tmp_path / "c")]) == StageError.exit_code
    assert "hardware.gpu is cpu" in capsys.readouterr().err


def test_enroot_image_and_counts() -> None:
    from trtkv.deploy.launch import enroot_image
    from trtkv.deploy.sizing import size

    assert enroot_image("nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3") == \
        "nvcr.io#nvidia/tritonserver:26.07-trtllm-python-py3"
    assert enroot_image("vllm/vllm-openai:v0.32.0") == "vllm/vllm-openai:v0.32.0"  # no registry host: default
    recipe = load_recipe("llama70b_fp8kv")
    for kwargs in ({"replicas": 0}, {"target_concurrency": -3}):
        with pytest.raises(StageError, match="use 1 or more"):
            size(recipe, **kwargs)
