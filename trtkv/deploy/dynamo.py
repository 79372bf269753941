"""NVIDIA Dynamo DynamoGraphDeployment (nvidia.com/v1beta1) for the LLM API path (Dynamo's TensorRT-LLM worker,
`python3 -m dynamo.trtllm`) and vLLM (`python3 -m dynamo.vllm`): aggregated (frontend + workers) and disaggregated
(frontend + prefill + decode workers, KV moved between them by NIXL). Workers larger than a node get
`multinode.nodeCount`; the engine configuration (the recipe's LLM API arguments, KV dtype included) is a ConfigMap.

Layout and flags from ai-dynamo/dynamo's examples/backends/{trtllm,vllm}/deploy at the 1.4.0 branch cut; not run here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trtkv.core.errors import StageError
from trtkv.deploy.k8s import _volumes, k8s_name, labels
from trtkv.deploy.launch import hf_dir, volume_folders
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe

DGD_API = "nvidia.com/v1beta1"
DYNAMO_VERSION = "1.4.0"
IMAGES = {"trtllm": f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_VERSION}",
          "vllm": f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{DYNAMO_VERSION}"}  # by backendFramework
CONFIG_DIR = "/etc/trtkv-engine"
NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
MODES = ("agg", "disagg")


def framework(recipe: Recipe) -> str | None:
    """Dynamo's backendFramework for the recipe's backend (None: Dynamo does not run it)."""
    from trtkv.backends import for_recipe

    return for_recipe(recipe).dynamo_framework


def image(recipe: Recipe) -> str:
    return IMAGES[framework(recipe) or "trtllm"]


def check_backend(recipe: Recipe) -> None:
    if framework(recipe) not in IMAGES:
        raise StageError(f"{recipe.name}: build.backend is {recipe.build.backend.value}; Dynamo's workers run the "
                         f"LLM API (dynamo.trtllm, on the HF checkpoint) or vLLM, not trtllm-build engines. Next: "
                         f"use build.backend llmapi (e.g. llama70b_fp8kv_llmapi) or vllm, or deploy this recipe with "
                         f"--target k8s or slurm.")


def engine_config(recipe: Recipe, role: str) -> dict[str, Any]:
    """dynamo.trtllm --extra-engine-args: the recipe's LLM() arguments (TorchLlmArgs fields), minus the model path;
    prefill/decode workers add the KV cache transceiver (and prefill drops the overlap scheduler, as upstream's)."""
    from trtkv.backends.llmapi import llm_args

    cfg = {k: v for k, v in llm_args(recipe, Path()).items() if k != "model"}
    if role in ("prefill", "decode"):
        cfg["cache_transceiver_config"] = {"backend": "DEFAULT"}
    if role == "prefill":
        cfg["disable_overlap_scheduler"] = True
    return cfg


def worker_args(recipe: Recipe, role: str) -> list[str]:
    if framework(recipe) == "trtllm":
        args = ["--model", str(hf_dir(recipe)), "--served-model-name", recipe.name,
                "--extra-engine-args", f"{CONFIG_DIR}/{role}.yaml"]
    else:
        from trtkv.backends import vllm

        args = vllm.server_args(recipe, hf_dir(recipe), "0.0.0.0")
        # dynamo.vllm takes vLLM's engine arguments; the frontend owns host and port
        for flag in ("--host", "--port"):
            i = args.index(flag)
            del args[i:i + 2]
        if role in ("prefill", "decode"):
            args += ["--kv-transfer-config", NIXL]
    if role in ("prefill", "decode"):
        args += ["--disaggregation-mode", role]
    return args


def _component(recipe: Recipe, sizing: Sizing, name: str, role: str, image: str, config: str) -> dict[str, Any]:
    module = f"dynamo.{framework(recipe)}"
    mounts = [{"name": "models", "mountPath": path, "subPath": sub, "readOnly": True}
              for sub, path in volume_folders(recipe, "hf")]
    volumes = [v for v in _volumes(recipe, False) if v["name"] == "models"]
    if framework(recipe) == "trtllm":
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
    """The ConfigMap (LLM API) and the DynamoGraphDeployment for `mode` (agg or disagg)."""
    check_backend(recipe)
    fw, img = framework(recipe), image(recipe)
    frontend = {"name": "Frontend", "type": "frontend", "replicas": 1,
                "podTemplate": {"spec": {"containers": [{"name": "main", "image": img}]}}}
    config = k8s_name(recipe, f"engine-{mode}")
    roles = [("TrtllmWorker" if fw == "trtllm" else "VllmWorker", "agg")] if mode == "agg" \
        else [("prefill", "prefill"), ("decode", "decode")]
    dgd = {"apiVersion": DGD_API, "kind": "DynamoGraphDeployment",
           "metadata": {"name": k8s_name(recipe, mode), "labels": labels(recipe)},
           "spec": {"backendFramework": fw,
                    "components": [frontend, *(_component(recipe, sizing, n, r, img, config) for n, r in roles)]}}
    out: list[dict[str, Any]] = []
    if fw == "trtllm":
        data = {f"{r}.yaml": yaml.safe_dump(engine_config(recipe, r), sort_keys=False) for _n, r in roles}
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": config, "labels": labels(recipe)}, "data": data})
    return [*out, dgd]
