"""NVIDIA Dynamo DynamoGraphDeployment (nvidia.com/v1beta1) for the LLM API path (Dynamo's TensorRT-LLM worker,
`python3 -m dynamo.trtllm`) and vLLM (`python3 -m dynamo.vllm`): aggregated (frontend + workers) and disaggregated
(frontend + prefill + decode workers, KV moved between them by NIXL). Workers larger than a node get
`multinode.nodeCount`; the engine configuration (the recipe's LLM API arguments, KV dtype included) is a ConfigMap.

Layout and flags from ai-dynamo/dynamo's examples/backends/{trtllm,vllm}/deploy at the 1.4.0 branch cut; not run here.
"""

from __future__ import annotations

from typing import Any

import yaml

from trtkv.backends import DynamoWorker
from trtkv.core.errors import StageError
from trtkv.deploy.k8s import _volumes, k8s_name, labels
from trtkv.deploy.launch import hf_dir, volume_folders
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe

DGD_API = "nvidia.com/v1beta1"
DYNAMO_VERSION = "1.4.0"
DYNAMO_IMAGES = "nvcr.io/nvidia/ai-dynamo"  # <runtime_image>:<version> per backendFramework
CONFIG_DIR = "/etc/trtkv-engine"
MODES = ("agg", "disagg")


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
        raise StageError(f"{recipe.name}: build.backend is {recipe.build.backend.value}; Dynamo's workers run the "
                         f"LLM API (dynamo.trtllm, on the HF checkpoint) or vLLM, not trtllm-build engines. Next: "
                         f"use build.backend llmapi (e.g. llama70b_fp8kv_llmapi) or vllm, or deploy this recipe with "
                         f"--target k8s or slurm.")
    return w


def image(recipe: Recipe) -> str:
    return f"{DYNAMO_IMAGES}/{_worker(recipe).runtime_image}:{DYNAMO_VERSION}"


def check_backend(recipe: Recipe) -> None:
    _worker(recipe)


def engine_config(recipe: Recipe, role: str) -> dict[str, Any] | None:
    """The worker's --extra-engine-args for `role` (None: it takes every argument on its command line)."""
    return _worker(recipe).engine_config(recipe, role)


def worker_args(recipe: Recipe, role: str) -> list[str]:
    args = _worker(recipe).args(recipe, hf_dir(recipe), role, CONFIG_DIR)
    if role in ("prefill", "decode"):
        args += ["--disaggregation-mode", role]
    return args


def _component(recipe: Recipe, sizing: Sizing, name: str, role: str, image: str, config: str) -> dict[str, Any]:
    module = f"dynamo.{framework(recipe)}"
    mounts = [{"name": "models", "mountPath": path, "subPath": sub, "readOnly": True}
              for sub, path in volume_folders(recipe, [hf_dir(recipe)])]
    volumes = [v for v in _volumes(recipe, False) if v["name"] == "models"]
    if engine_config(recipe, role) is not None:
        mounts.append({"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True})
        volumes.append({"name": "engine-config", "configMap": {"name": config}})
    comp: dict[str, Any] = {
        "name": name, "type": "worker" if role == "agg" else role, "replicas": sizing.replicas,
        "podTemplate": {"spec": {"containers": [{
            "name": "main", "image": image, "command": ["python3", "-m", module], "args": worker_args(recipe, role),
            "resources": {"limits": {"nvidia.com/gpu": sizing.gpus_per_pod}}, "volumeMounts": mounts}],
            "volumes": volumes}}}
    if sizing.nodes_per_replica > 1:
        comp["multinode"] = {"nodeCount": sizing.nodes_per_replica}
    return comp


def objects(recipe: Recipe, sizing: Sizing, mode: str) -> list[dict[str, Any]]:
    """The ConfigMap (when the worker takes an engine config) and the DynamoGraphDeployment for `mode` (agg or
    disagg)."""
    w = _worker(recipe)
    fw, img = w.framework, image(recipe)
    frontend = {"name": "Frontend", "type": "frontend", "replicas": 1,
                "podTemplate": {"spec": {"containers": [{"name": "main", "image": img}]}}}
    config = k8s_name(recipe, f"engine-{mode}")
    roles = [(w.component, "agg")] if mode == "agg" else [("prefill", "prefill"), ("decode", "decode")]
    dgd = {"apiVersion": DGD_API, "kind": "DynamoGraphDeployment",
           "metadata": {"name": k8s_name(recipe, mode), "labels": labels(recipe)},
           "spec": {"backendFramework": fw,
                    "components": [frontend, *(_component(recipe, sizing, n, r, img, config) for n, r in roles)]}}
    out: list[dict[str, Any]] = []
    configs = {r: w.engine_config(recipe, r) for _n, r in roles}
    if all(cfg is not None for cfg in configs.values()):
        data = {f"{r}.yaml": yaml.safe_dump(cfg, sort_keys=False) for r, cfg in configs.items()}
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": config, "labels": labels(recipe)}, "data": data})
    return [*out, dgd]
