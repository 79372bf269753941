"""NVIDIA Dynamo DynamoGraphDeployment (nvidia.com/v1beta1) for the LLM API path (Dynamo's
TensorRT-LLM worker, `python3 -m dynamo.trtllm`) and vLLM (`python3 -m dynamo.vllm`): aggregated
(frontend + workers) and disaggregated (frontend + prefill + decode workers, KV moved between them
by NIXL). Workers larger than a node get `multinode.nodeCount`; the engine configuration (the
recipe's LLM API arguments, KV dtype and prefix caching included) is a ConfigMap. The workers read
the HF export at /models/<recipe>/checkpoint/hf from the models volume the loader Job fills
(trtkv.deploy.loader) and wait for it; placement, resources, probes and security are
trtkv.deploy.pods'.

Layout and flags from ai-dynamo/dynamo's examples/backends/{trtllm,vllm}/deploy at the 1.4.0 branch
cut; the probes are the operator's own defaults made explicit
(deploy/operator/internal/dynamo/component_worker.go and component_frontend.go: worker /live and
/health on the system port 9090, frontend /live and /health on 8000), the worker's startup budget
sized from the model. Not run here.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from trtkv.backends import DynamoWorker
from trtkv.core.errors import StageError
from trtkv.deploy import pods
from trtkv.deploy.k8s import Fence, fence_policy, k8s_name, labels, meta
from trtkv.deploy.launch import NGC_UID
from trtkv.deploy.resources import (
    FRONTEND,
    STARTUP_PERIOD_S,
    host_tier_gib_per_pod,
    server_resources,
    startup_budget_s,
)
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe
from trtkv.recipe.layout import container_artifacts

DGD_API = "nvidia.com/v1beta1"
DYNAMO_VERSION = "1.4.0"
DYNAMO_IMAGES = "nvcr.io/nvidia/ai-dynamo"  # <runtime_image>:<version> per backendFramework
# the runtime images' user dynamo (container/templates/dynamo_runtime.Dockerfile: uid 1000)
DYNAMO_UID = NGC_UID
CONFIG_DIR = "/etc/trtkv-engine"
MODES = ("agg", "disagg")
SYSTEM_PORT = 9090  # the workers' system status server (the operator's DYN_SYSTEM_PORT)
FRONTEND_PORT = 8000
WORKER_SHM_GIB = 16


def worker(recipe: Recipe) -> DynamoWorker | None:
    """Dynamo's worker for the recipe's backend (None: Dynamo does not run it)."""
    from trtkv.backends import for_recipe

    return for_recipe(recipe).dynamo


def framework(recipe: Recipe) -> str | None:
    """Dynamo's backendFramework for the recipe's backend (None: Dynamo does not run it)."""
    w = worker(recipe)
    return w.framework if w is not None else None


def _worker(recipe: Recipe) -> DynamoWorker:
    w = worker(recipe)
    if w is None:
        raise StageError(
            f"{recipe.name}: build.backend is {recipe.build.backend.value}; Dynamo's workers run "
            "the LLM API (dynamo.trtllm, on the HF checkpoint) or vLLM, not trtllm-build engines. "
            "Next: use build.backend llmapi (e.g. llama70b_fp8kv_llmapi) or vllm, or deploy this "
            "recipe with --target k8s or slurm."
        )
    return w


def image(recipe: Recipe) -> str:
    return f"{DYNAMO_IMAGES}/{_worker(recipe).runtime_image}:{DYNAMO_VERSION}"


def check_backend(recipe: Recipe) -> None:
    _worker(recipe)


def engine_config(recipe: Recipe, role: str) -> dict[str, Any] | None:
    """The worker's --extra-engine-args for `role` (None: it takes every argument on its command
    line)."""
    return _worker(recipe).engine_config(recipe, role)


def worker_args(recipe: Recipe, role: str) -> list[str]:
    """The worker's arguments: the HF export at its canonical container path."""
    args = _worker(recipe).args(recipe, container_artifacts(recipe).hf, role, CONFIG_DIR)
    if role in ("prefill", "decode"):
        args += ["--disaggregation-mode", role]
    return args


def _probes(path_live: str, path_ready: str, port: int, startup_failures: int) -> dict[str, Any]:
    return {
        "startupProbe": pods.http_get(path_live, port, STARTUP_PERIOD_S, 5, startup_failures),
        "livenessProbe": pods.http_get(
            path_live, port, pods.LIVE_PERIOD_S, pods.LIVE_TIMEOUT_S, pods.LIVE_FAILURES
        ),
        "readinessProbe": pods.http_get(path_ready, port, 10, 5, pods.READY_FAILURES),
    }


def _pod_template(
    recipe: Recipe, container: dict[str, Any], spec: dict[str, Any], role: str
) -> dict[str, Any]:
    skips = pods.skip_annotations(*pods.image_skips([container["image"]], DYNAMO_UID), "CKV_K8S_38")
    return {
        "metadata": {
            "labels": {**labels(recipe), "app.kubernetes.io/component": role},
            "annotations": skips,
        },
        "spec": {
            "containers": [container],
            "enableServiceLinks": False,
            "securityContext": pods.pod_security(DYNAMO_UID),
            **spec,
        },
    }


def _component(
    recipe: Recipe, sizing: Sizing, name: str, role: str, img: str, config: str, load_id: str
) -> dict[str, Any]:
    module = f"dynamo.{framework(recipe)}"
    volume_mounts = [m for m in pods.mounts(False, False) if m["name"] in ("models", "home", "tmp")]
    volumes = [
        {
            "name": "models",
            "persistentVolumeClaim": {"claimName": k8s_name(recipe, "models"), "readOnly": True},
        },
        {"name": "home", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if engine_config(recipe, role) is not None:
        volume_mounts.append({"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True})
        volumes.append({"name": "engine-config", "configMap": {"name": config}})
    budget = startup_budget_s(recipe, sizing)
    container = {
        "name": "main",
        "image": img,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", module],
        "args": worker_args(recipe, role),
        "env": pods.env(False),
        "resources": server_resources(
            sizing, WORKER_SHM_GIB, host_tier_gib_per_pod(recipe, sizing)
        ).k8s(),
        "volumeMounts": volume_mounts,
        "securityContext": pods.container_security(),
        **_probes("/live", "/health", SYSTEM_PORT, math.ceil(budget / STARTUP_PERIOD_S)),
    }
    spec = {
        "initContainers": [pods.wait_for_load(recipe, img, load_id)],
        "volumes": volumes,
        **pods.placement(recipe),
        "terminationGracePeriodSeconds": 60,
    }
    comp: dict[str, Any] = {
        "name": name,
        "type": "worker" if role == "agg" else role,
        "replicas": sizing.replicas,
        "sharedMemorySize": f"{WORKER_SHM_GIB}Gi",
        "podTemplate": _pod_template(recipe, container, spec, role),
    }
    if sizing.nodes_per_replica > 1:
        comp["multinode"] = {"nodeCount": sizing.nodes_per_replica}
    return comp


def _frontend(recipe: Recipe, img: str) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": img,
        "imagePullPolicy": "IfNotPresent",
        "env": pods.env(False),
        "resources": FRONTEND.k8s(),
        "securityContext": pods.container_security(),
        "volumeMounts": [m for m in pods.mounts(False, False) if m["name"] in ("home", "tmp")],
        **_probes("/live", "/health", FRONTEND_PORT, 30),
    }
    spec = {"volumes": [{"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]}
    return {
        "name": "Frontend",
        "type": "frontend",
        "replicas": 1,
        "podTemplate": _pod_template(recipe, container, spec, "frontend"),
    }


def network_policy(recipe: Recipe, namespace: str, fence: Fence) -> dict[str, Any]:
    """Ingress to the graph's pods: the frontend's port from the clients, every port from the
    graph's own pods (frontend to workers, NIXL between prefill and decode), the system port from
    Prometheus."""
    return fence_policy(recipe, "dynamo-fence", namespace, fence, [FRONTEND_PORT], SYSTEM_PORT)


def objects(
    recipe: Recipe,
    sizing: Sizing,
    mode: str,
    load_id: str,
    namespace: str,
    fence: Fence | None = None,
) -> list[dict[str, Any]]:
    """The ConfigMap (when the worker takes an engine config), the DynamoGraphDeployment for `mode`
    (agg or disagg) and its NetworkPolicy."""
    w = _worker(recipe)
    img = image(recipe)
    config = k8s_name(recipe, f"engine-{mode}")
    roles = (
        [(w.component, "agg")] if mode == "agg" else [("prefill", "prefill"), ("decode", "decode")]
    )
    dgd = {
        "apiVersion": DGD_API,
        "kind": "DynamoGraphDeployment",
        "metadata": meta(recipe, k8s_name(recipe, mode), namespace),
        "spec": {
            "backendFramework": w.framework,
            "components": [
                _frontend(recipe, img),
                *(_component(recipe, sizing, n, r, img, config, load_id) for n, r in roles),
            ],
        },
    }
    out: list[dict[str, Any]] = []
    configs = {r: w.engine_config(recipe, r) for _n, r in roles}
    if all(cfg is not None for cfg in configs.values()):
        data = {f"{r}.yaml": yaml.safe_dump(cfg, sort_keys=False) for r, cfg in configs.items()}
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": meta(recipe, config, namespace),
                "data": data,
            }
        )
    return [*out, dgd, network_policy(recipe, namespace, fence or Fence())]
