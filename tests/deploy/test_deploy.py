"""`trtkv deploy`: Kubernetes (Deployment / LeaderWorkerSet), Slurm and Dynamo files sized by the planner, each
checked by a consumer trtkv did not write (kubernetes-validate's Kubernetes schemas, the LWS and Dynamo CRDs' own
schemas read from upstream, bash -n; checkov in test_checkov.py). The checks are shown to refuse broken objects, so a
pass means something. Paths in every file a container reads are the canonical /models/<recipe>/... ones."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.planned import deploy
from trtkv.cli import main
from trtkv.contracts.canary import canary_script
from trtkv.core import paths
from trtkv.core.errors import RecipeError, StageError
from trtkv.deploy import Options, Target, check, dynamo, k8s, k8s_commands, pods, resources
from trtkv.deploy.check import check_object, crd_schema_info
from trtkv.deploy.launch import REQUIRE_KEY, TRITON_LIVE, TRITON_READY
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import list_recipes, load_recipe

DATA = Path(__file__).parents[1] / "data"
TP8_PP2 = ["build.tp_size=8", "build.pp_size=2", "hardware.count=16"]
SOURCE = "s3://my-bucket/trtkv/llama"
OPTS = Options(model_source=SOURCE)


def quiet(_m: str) -> None:
    pass


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(folder: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(folder.glob("*.yaml")):
        for d in docs(path):
            out.setdefault(d["kind"], d)
    return out


def probe_script(objs: dict[str, dict[str, Any]], container: dict[str, Any], probe: str) -> str:
    """The python program an exec probe runs: the file it names, read from the ConfigMap the pod mounts there (a
    readable file, no encoded blob)."""
    assert container[probe]["exec"]["command"] == ["python3", f"{pods.CANARY_DIR}/{pods.CANARY_FILE}"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == pods.CANARY_DIR]
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert objs["ConfigMap"]["metadata"]["name"] == volume["configMap"]["name"] and mount["readOnly"]
    return objs["ConfigMap"]["data"][pods.CANARY_FILE]


def gpu_recipes() -> list[str]:
    return [p.stem for p in list_recipes() if load_recipe(str(p)).hardware.gpu.value != "cpu"]


def test_single_node_k8s_deployment_is_placed_sized_probed_and_loads_its_model(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv")
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", log=quiet, options=OPTS)
    objs = by_kind(out)
    assert set(objs) == {"PersistentVolumeClaim", "Job", "ConfigMap", "Deployment", "Service", "NetworkPolicy"}  # no PDB
    assert {o["metadata"]["namespace"] for o in objs.values()} == {"trtkv"}
    dep = objs["Deployment"]
    assert dep["spec"]["strategy"] == {"type": "Recreate"}  # one 4-GPU replica: no spare GPUs for a surge
    pod = dep["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    res = server["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == 4  # TP4
    # host memory: the pod's 67.7 GiB of weights + 4 x 4 GiB per rank + 2 GiB /dev/shm + 4 GiB
    assert res["requests"]["memory"] == "90Gi" and res["limits"]["memory"] == "113Gi"
    assert res["requests"]["cpu"] == 10 and res["limits"]["cpu"] == 20 and "ephemeral-storage" in res["limits"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                            "values": ["NVIDIA-H100-80GB-HBM3"]}]}]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # probes: the engine's own endpoints for startup and liveness, the canary for readiness
    assert server["startupProbe"]["httpGet"] == {"path": TRITON_READY, "port": 8000}
    assert server["livenessProbe"]["httpGet"] == {"path": TRITON_LIVE, "port": 8000}
    from tests.support.planned import size

    budget = resources.startup_budget_s(recipe, size(recipe))
    assert server["startupProbe"]["failureThreshold"] * server["startupProbe"]["periodSeconds"] >= budget > 300
    assert probe_script(objs, server, "readinessProbe") == canary_script(8000, timeout_s=50.0)
    assert server["readinessProbe"]["timeoutSeconds"] == 60
    # the model arrives by the loader Job; the server waits for its marker
    (wait,) = pod["initContainers"]
    job = objs["Job"]
    lid = job["metadata"]["name"].rsplit("-", 1)[1]
    assert lid in wait["command"][2] and "/models/llama70b_fp8kv/.trtkv-loaded" in wait["command"][2]
    loader = job["spec"]["template"]["spec"]["containers"][0]
    assert loader["image"].startswith("amazon/aws-cli:")
    assert "root=/models/llama70b_fp8kv\n" in loader["command"][2]  # a link to the complete load in use (loader.py)
    for sub in ("engine", "checkpoint/tokenizer", "triton_repo"):
        assert f'aws s3 sync --only-show-errors --delete {SOURCE}/{sub} "$top/$new"/{sub}' in loader["command"][2]
    # every path the server reads is under /models/<recipe>; the volume is mounted read-only at /models
    script = server["command"][2]
    assert "--model-repository=/models/llama70b_fp8kv/triton_repo" in script
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in server["volumeMounts"]
    assert objs["Service"]["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    sizing = Sizing.load(out)  # the model deploy wrote it with
    assert sizing is not None and (sizing.gpus_per_replica, sizing.nodes_per_replica, sizing.replicas) == (4, 1, 1)
    assert json.loads((out / "sizing.json").read_text())["total_gpus"] == sizing.total_gpus == 4
    readme = (out / "README.md").read_text()
    assert "kubernetes-validate, Kubernetes" in readme and "tag v0.10.0" in readme
    assert "kubectl cp" not in readme and "aws s3 sync --delete" in readme
    assert f"kubectl -n trtkv wait --for=condition=complete job/{job['metadata']['name']}" in readme
    assert "trtkv-llama70b-fp8kv-api.trtkv.svc.cluster.local" in readme and "--url 127.0.0.1:8001" in readme
    assert "Never run" in readme


def test_replicas_roll_without_spare_gpus_and_keep_a_budget(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv_llmapi", ["build.backend=vllm"])
    objs = by_kind(deploy(recipe, Target.K8S, tmp_path / "k8s", replicas=3, log=quiet, options=OPTS))
    dep = objs["Deployment"]
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    pdb = objs["PodDisruptionBudget"]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]}}
    (spread,) = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    server = dep["spec"]["template"]["spec"]["containers"][0]
    assert server["livenessProbe"]["httpGet"] == server["startupProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert "--model /models/llama70b_fp8kv_llmapi/checkpoint/hf" in server["command"][2]
    assert "--enable-prefix-caching" in server["command"][2]  # vLLM's default, said explicitly
    from math import ceil

    weights = json.loads((tmp_path / "k8s" / "sizing.json").read_text())["weights_gib_total"]
    # vLLM's 16 GiB /dev/shm counts against the memory it asks for
    assert server["resources"]["requests"]["memory"] == f"{ceil(weights + 4 * 4 + 16 + 4)}Gi"


def test_16_gpus_on_8_gpu_nodes_is_a_leaderworkerset_of_two(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv", TP8_PP2)
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", replicas=2, log=quiet, options=OPTS)
    objs = by_kind(out)
    assert "Deployment" not in objs
    lws = objs["LeaderWorkerSet"]
    assert lws["spec"]["rolloutStrategy"] == {"type": "RollingUpdate",
                                              "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}}
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"  # the group's semantics as before
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 2 and tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    worker = tmpl["workerTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == 8 == worker["resources"]["limits"]["nvidia.com/gpu"]
    assert worker["livenessProbe"]["tcpSocket"] == {"port": 2222}  # its sshd
    script = leader["command"][2]
    assert script.count("/opt/tritonserver/bin/tritonserver") == 16  # one tritonserver per rank, all 16 ranks
    assert '-H "$HOSTS"' in script and "mkdir -p /run/sshd" not in script and "PermitRootLogin=no" in script
    assert objs["PodDisruptionBudget"]["spec"]["selector"] == {"matchLabels": {k8s.LWS_NAME_LABEL: k8s.k8s_name(recipe)}}
    # the startup budget waits for the other pods' sshd too
    assert leader["startupProbe"]["failureThreshold"] * 10 >= 600
    assert objs["Service"]["spec"]["selector"] == {k8s.LWS_NAME_LABEL: lws["metadata"]["name"], "role": "leader"}
    assert objs["Service"]["metadata"]["name"] != lws["metadata"]["name"]  # LWS's own headless Service takes that name
    assert '--prefix "$MPI_HOME"' in script and "orte_keep_fqdn_hostnames 1" in script and "-x LD_LIBRARY_PATH" in script
    for c in (leader, worker):
        subprocess.run(["bash", "-n", "-c", c["command"][2]], check=True)


def test_leader_lists_every_pod_of_its_group_with_its_slots() -> None:
    """The host list the leader hands mpirun, computed by bash from LWS's environment (pod DNS names per LWS
    v0.10.0's pod_utils: leader <lws>-<group>.<subdomain>.<ns>, worker i <lws>-<group>-<i>.<subdomain>.<ns>)."""
    snippet = k8s_commands.WORKER_HOSTS.replace("{slots}", "8") + 'echo "$HOSTS"'
    env = {"LWS_LEADER_ADDRESS": "trtkv-x-1.trtkv-x.prod", "LWS_GROUP_SIZE": "3", "PATH": "/usr/bin:/bin"}
    hosts = subprocess.run(["bash", "-c", snippet], env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert hosts == "trtkv-x-1.trtkv-x.prod:8,trtkv-x-1-1.trtkv-x.prod:8,trtkv-x-1-2.trtkv-x.prod:8"


def test_llmapi_across_nodes_runs_trtllm_serve_under_mpirun_and_vllm_uses_ray(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv_llmapi", TP8_PP2)
    lws = by_kind(deploy(recipe, Target.K8S, tmp_path / "a", log=quiet, options=OPTS))["LeaderWorkerSet"]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert "mpirun --allow-run-as-root -H \"$HOSTS\"" in leader["command"][2]
    assert "-np 16 trtllm-llmapi-launch trtllm-serve /models/llama70b_fp8kv_llmapi/checkpoint/hf" in leader["command"][2]
    assert "--tp_size 8 --pp_size 2" in leader["command"][2]
    assert "/models/llama70b_fp8kv_llmapi/engine/llm_api_options.yaml" in leader["command"][2]
    assert leader["livenessProbe"]["httpGet"]["path"] == "/health"  # trtllm-serve's own
    recipe = load_recipe("llama70b_fp8kv_llmapi", [*TP8_PP2, "build.backend=vllm"])
    lws = by_kind(deploy(recipe, Target.K8S, tmp_path / "v", log=quiet, options=OPTS))["LeaderWorkerSet"]
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    leader, worker = (tmpl[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate"))
    assert leader["command"][2].startswith(pods.key_from_file(_launch(recipe)) + REQUIRE_KEY + "ray start --head")
    assert "--distributed-executor-backend ray" in leader["command"][2]
    assert "--kv-cache-dtype fp8" in leader["command"][2]
    assert worker["command"][2].startswith("until ray start --address=$LWS_LEADER_ADDRESS:6379 --node-manager-port=6380")
    assert worker["livenessProbe"]["tcpSocket"] == {"port": k8s_commands.RAY_NODE_PORT}
    assert 'sum(n["Alive"] for n in ray.nodes())' in leader["command"][2]


def _launch(recipe: Any) -> Any:
    from tests.support.planned import size
    from trtkv.deploy import launch

    return launch.for_recipe(recipe, size(recipe))


@pytest.mark.parametrize("name", gpu_recipes())
def test_no_path_of_this_machine_reaches_a_pod_spec(name: str, tmp_path: Path) -> None:
    """Every target of every shipped GPU recipe: the pods (and Slurm's tasks) see /models/<recipe>/..., never the
    folders of the machine that ran trtkv."""
    recipe = load_recipe(name)
    here = [str(paths.project_root()), str(paths.engines_dir()), str(paths.triton_repo_dir()), str(Path.home())]
    targets = [Target.K8S, Target.SLURM] + ([Target.DYNAMO] if dynamo.worker(recipe) else [])
    for target in targets:
        out = deploy(recipe, target, tmp_path / target.value, log=quiet, options=OPTS)
        files = [out / "rank.sh"] if target is Target.SLURM else sorted(out.glob("*.yaml"))
        for file in files:
            text = file.read_text()
            assert not [h for h in here if h in text], (file, [h for h in here if h in text])
            assert f"/models/{name}/" in text or f"root=/models/{name}\n" in text, file


def test_slurm_packs_two_tp4_replicas_per_8_gpu_node_and_holds_no_idle_gpu(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv")
    out = deploy(recipe, Target.SLURM, tmp_path / "two", replicas=2, log=quiet)
    job, rank = (out / "job.sbatch").read_text(), (out / "rank.sh").read_text()
    assert "#SBATCH --gpus-per-node=8" in job and "--exclusive" not in job  # both TP4 replicas: all 8 GPUs, no more
    assert "INSTANCES=${TRTKV_INSTANCES:-2}" in job and "srun --exact --nodes=1 --mpi=pmix --ntasks=4 --gpus=4" in job
    assert rank.count("--http-port=8000") == 2 and rank.count("--http-port=8010") == 2  # instance 1: ports + 10
    assert "shm-region-prefix-name=i1prefix" in rank  # its own shared-memory names on the shared node
    one = deploy(recipe, Target.SLURM, tmp_path / "one", log=quiet)
    job1 = (one / "job.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=4" in job1 and "--exclusive" not in job1  # the other 4 GPUs stay free
    assert re.search(r"#SBATCH --cpus-per-gpu=\d+", job1) and re.search(r"#SBATCH --mem-per-gpu=\d+G", job1)
    three = deploy(recipe, Target.SLURM, tmp_path / "three", replicas=3, log=quiet)
    assert "TRTKV_INSTANCES=1 sbatch --gpus-per-node=4" in (three / "README.md").read_text()  # the last job: one
    for f in ("job.sbatch", "rank.sh"):
        subprocess.run(["bash", "-n", str(out / f)], check=True)


def test_slurm_job_refuses_to_hold_a_gpu_it_does_not_use(tmp_path: Path) -> None:
    """job.sbatch run with srun and scontrol stubbed: 8 GPUs held for one TP4 instance is refused; 8 for two runs both
    instances as job steps of their own."""
    out = deploy(load_recipe("llama70b_fp8kv"), Target.SLURM, tmp_path / "s", replicas=2, log=quiet)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "srun").write_text('#!/bin/sh\necho "srun $TRTKV_INSTANCE $*" >> "$LOG"\n')
    (stubs / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for s in stubs.iterdir():
        s.chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "TRTKV_API_KEY": "k", "SLURM_JOB_NODELIST": "node1",
           "SLURM_GPUS_ON_NODE": "8", "LOG": str(tmp_path / "log")}
    ok = subprocess.run(["bash", str(out / "job.sbatch")], env=env, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    steps = sorted((tmp_path / "log").read_text().splitlines())  # the two steps run side by side: either logs first
    assert len(steps) == 2 and steps[0].startswith("srun 0 --exact") and steps[1].startswith("srun 1 --exact")
    assert "/models/llama70b_fp8kv/deploy/rank.sh" in steps[0] and "http://node1:8010" in ok.stdout
    bad = subprocess.run(["bash", str(out / "job.sbatch")], env={**env, "TRTKV_INSTANCES": "1"}, capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 1 and "every GPU held must be used" in bad.stderr


def test_slurm_mounts_name_the_canonical_paths(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv", TP8_PP2)
    out = deploy(recipe, Target.SLURM, tmp_path / "slurm", log=quiet)
    job = (out / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in job and "#SBATCH --ntasks-per-node=8" in job and "#SBATCH --exclusive" in job
    assert "srun --mpi=pmix --ntasks=16 --ntasks-per-node=8" in job
    assert '--container-image="$IMAGE"' in job and "IMAGE=${TRTKV_IMAGE:-$DEFAULT_IMAGE}" in job
    assert "DEFAULT_IMAGE='nvcr.io#nvidia/tritonserver:" in job
    mounts = subprocess.run(["bash", "-c", next(x for x in job.splitlines() if x.startswith("MOUNTS=")) + '; echo "$MOUNTS"'],
                            env={"ENGINES": "/e", "REPOSITORIES": "/r", "HERE": "/h"}, capture_output=True,
                            text=True, check=True).stdout.strip()
    assert mounts.split(",") == ["/e/llama70b_fp8kv/engine:/models/llama70b_fp8kv/engine:ro",
                                 "/e/llama70b_fp8kv/checkpoint/tokenizer:/models/llama70b_fp8kv/checkpoint/tokenizer:ro",
                                 "/r/llama70b_fp8kv:/models/llama70b_fp8kv/triton_repo:ro",
                                 "/h:/models/llama70b_fp8kv/deploy:ro"]
    rank = (out / "rank.sh").read_text()
    assert 'if [ "$SLURM_PROCID" = 0 ]' in rank and 'prefix"$SLURM_PROCID"_' in rank
    assert "--load-model=tensorrt_llm" in rank.split("fi\n")[1]  # ranks > 0 load only the engine model
    assert "--model-repository=/models/llama70b_fp8kv/triton_repo" in rank
    llmapi = deploy(load_recipe("llama70b_fp8kv_llmapi"), Target.SLURM, tmp_path / "l", log=quiet)
    assert "exec trtllm-llmapi-launch trtllm-serve /models/llama70b_fp8kv_llmapi/checkpoint/hf" in \
        (llmapi / "rank.sh").read_text()


def test_dynamo_agg_and_disagg_for_the_llm_api(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv_llmapi", TP8_PP2)
    out = deploy(recipe, Target.DYNAMO, tmp_path / "dyn", target_concurrency=100, log=quiet, options=OPTS)
    agg, disagg = docs(out / "agg.yaml"), docs(out / "disagg.yaml")
    dgd = next(d for d in agg if d["kind"] == "DynamoGraphDeployment")
    assert dgd["spec"]["backendFramework"] == "trtllm" and dgd["metadata"]["namespace"] == "trtkv"
    frontend, worker = dgd["spec"]["components"]
    assert worker["multinode"] == {"nodeCount": 2}
    assert worker["replicas"] == 2  # 100 sequences at 64 per replica (max_batch_size bound)
    main_c = worker["podTemplate"]["spec"]["containers"][0]
    assert main_c["args"][:2] == ["--model", "/models/llama70b_fp8kv_llmapi/checkpoint/hf"]
    assert main_c["livenessProbe"]["httpGet"] == {"path": "/live", "port": 9090}  # the operator's own, explicit
    assert main_c["resources"]["limits"]["nvidia.com/gpu"] == 8 and worker["sharedMemorySize"] == "16Gi"
    assert worker["podTemplate"]["spec"]["initContainers"][0]["name"] == "wait-for-models"
    assert frontend["podTemplate"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] == 8000
    assert [c["type"] for c in next(d for d in disagg if d["kind"] == "DynamoGraphDeployment")["spec"]["components"]] \
        == ["frontend", "prefill", "decode"]
    assert any(d["kind"] == "NetworkPolicy" for d in agg)
    fields = set(json.loads((DATA / "llm_args_fields.json").read_text())["llm_args"])
    for cm in (agg[0], disagg[0]):
        for text in cm["data"].values():
            cfg = yaml.safe_load(text)
            assert set(cfg) <= fields, set(cfg) - fields  # every key a TorchLlmArgs field
            assert cfg["kv_cache_config"]["dtype"] == "fp8" and cfg["kv_cache_config"]["enable_block_reuse"] is True
            assert cfg["tensor_parallel_size"] == 8 and cfg["pipeline_parallel_size"] == 2
    assert "cache_transceiver_config" in yaml.safe_load(disagg[0]["data"]["prefill.yaml"])
    job = next(d for d in docs(out / "models.yaml") if d["kind"] == "Job")
    loads = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "root=/models/llama70b_fp8kv_llmapi\n" in loads and '"$top/$new"/checkpoint/hf' in loads
    with pytest.raises(StageError, match="Dynamo's workers run the LLM API"):
        deploy(load_recipe("llama70b_fp8kv"), Target.DYNAMO, tmp_path / "no", log=quiet, options=OPTS)
    assert not (tmp_path / "no").exists()


def test_checks_refuse_broken_objects() -> None:
    """The schemas are live: a misspelt field, a wrong type and an unknown enum value are each refused."""
    recipe = load_recipe("llama70b_fp8kv", TP8_PP2)
    from tests.support.planned import size
    from trtkv.deploy import launch

    s = size(recipe)
    objs = k8s.objects(recipe, launch.for_recipe(recipe, s), s, "0123456789ab", "trtkv")
    canary, lws, svc = objs[0], objs[1], objs[2]  # the canary's ConfigMap first: the pods mount it
    assert canary["kind"] == "ConfigMap" and check_object(canary) == []
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
    dgd = next(o for o in dynamo.objects(load_recipe("llama70b_fp8kv_llmapi"), s, "agg", "0123456789ab", "trtkv")
               if o["kind"] == "DynamoGraphDeployment")
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
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", log=quiet, options=OPTS)
    before = {p.name: p.read_text() for p in out.iterdir()}
    real = k8s.objects

    def broken(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        objs = real(*args, **kwargs)
        objs[1]["spec"]["replicas"] = "many"  # the Deployment, after the canary's ConfigMap
        return objs

    monkeypatch.setattr(k8s, "objects", broken)
    with pytest.raises(StageError, match=r"(?s)fail their checks \(nothing written.*spec\.replicas"):
        deploy(recipe, Target.K8S, out, replicas=3, log=quiet, options=OPTS)
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["k8s"]  # no temporary folder left


def test_world_size_must_fill_whole_nodes_and_tp16_plans() -> None:
    with pytest.raises(RecipeError, match=r"hardware.count: 12 GPUs per model instance do not fill whole nodes"):
        load_recipe("llama70b_fp8kv", ["build.tp_size=4", "build.pp_size=3", "hardware.count=12"])
    load_recipe("llama70b_fp8kv", ["build.tp_size=4", "build.pp_size=3", "hardware.count=12",
                                   "hardware.gpus_per_node=4"])
    assert main(["plan", "llama70b_fp8kv", "build.tp_size=16", "hardware.count=16"]) == 0  # 8 KV heads, replicated


def test_cli_takes_overrides_after_options_and_refuses_what_cannot_apply(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "llama70b_fp8kv", "--target", "k8s", "--output", str(tmp_path / "o"), *TP8_PP2,
                 "--target-concurrency", "200", "--model-source", SOURCE, "--namespace", "llm"]) == 0
    said = capsys.readouterr().out
    assert re.search(r"Replicas: 4 \(--target-concurrency 200 / 64 per replica\) -> 64 GPUs", said)
    assert {d["metadata"]["namespace"] for d in docs(tmp_path / "o" / "server.yaml")} == {"llm"}
    for argv, message in [
        ([], "--model-source s3://BUCKET/PREFIX"),  # where the loader copies from: the user's to name
        (["--model-source", SOURCE, "--namespace", "default"], "not `default`"),
        (["--model-source", "s3://my-bucket/$(x)"], "a path or prefix holds letters, digits and ._~/@+=- only"),
        (["--model-source", "hf://nvidia/Llama-3.3-70B-Instruct-FP8"], "a hub repository holds an HF export"),
    ]:
        assert main(["deploy", "llama70b_fp8kv", "--target", "k8s", "--output", str(tmp_path / "x"), *argv]) == \
            StageError.exit_code
        assert message in capsys.readouterr().err
        assert not (tmp_path / "x").exists()
    assert main(["deploy", "smollm2_fp8kv", "--target", "k8s", "--output", str(tmp_path / "c")]) == StageError.exit_code
    assert "hardware.gpu is cpu" in capsys.readouterr().err


def test_enroot_image_and_counts() -> None:
    from tests.support.planned import size
    from trtkv.deploy.launch import enroot_image

    assert enroot_image("nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3") == \
        "nvcr.io#nvidia/tritonserver:26.07-trtllm-python-py3"
    assert enroot_image("vllm/vllm-openai:v0.32.0") == "vllm/vllm-openai:v0.32.0"  # no registry host: default
    recipe = load_recipe("llama70b_fp8kv")
    for kwargs in ({"replicas": 0}, {"target_concurrency": -3}):
        with pytest.raises(StageError, match="use 1 or more"):
            size(recipe, **kwargs)


def test_probe_budgets_follow_the_model_and_the_recipes_storage(tmp_path: Path) -> None:
    """A slower volume or a slower engine start widens the startup probe; the canary's deadline grows with the
    decode time of an in-flight request."""
    from tests.support.planned import size

    base = load_recipe("llama70b_fp8kv")
    s = size(base)
    load_s = s.weights_gib_per_pod * 1024**3 / 0.5e9
    assert resources.startup_budget_s(base, s) == pytest.approx(2 * load_s + 300, abs=1)
    slow = load_recipe("llama70b_fp8kv", ["triton.storage_read_gbps=0.1", "triton.engine_init_s=600"])
    assert resources.startup_budget_s(slow, size(slow)) == pytest.approx(2 * load_s * 5 + 600, abs=1)
    long = load_recipe("llama70b_fp8kv", ["bench.output_tokens=8192", "bench.input_tokens=1024"])
    ls = size(long)
    assert resources.canary_timeout_s(long, ls) == int(2 * 8192 * ls.decode_step_ms / 1000 + 10) + 1 > 50
    out = deploy(long, Target.K8S, tmp_path / "k", log=quiet, options=OPTS)
    objs = by_kind(out)
    server = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    script = probe_script(objs, server, "readinessProbe")
    assert f"no whole answer within {resources.canary_timeout_s(long, ls)} s" in script
    assert f"canary.py: |\n    {script.splitlines()[0]}\n" in (out / "server.yaml").read_text()  # a readable block
