"""The pods' readiness canary ships as a readable file (#54 item 9): a ConfigMap holding canary.py, mounted read-only
and run by path, for every shipped GPU recipe and its multi-node form; no base64 blob piped to python3 in any
generated Kubernetes file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.planned import deploy
from trtkv.core.errors import RecipeError
from trtkv.deploy import Options, Target, pods
from trtkv.recipe import list_recipes, load_recipe

TP8_PP2 = ["build.tp_size=8", "build.pp_size=2", "hardware.count=16"]


def gpu_recipes() -> list[str]:
    return [p.stem for p in list_recipes() if load_recipe(str(p)).hardware.gpu.value != "cpu"]


def pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] == "Deployment":
        return [doc["spec"]["template"]["spec"]]
    if doc["kind"] == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        return [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]
    return []


@pytest.mark.parametrize("name", gpu_recipes())
@pytest.mark.parametrize("overrides", [[], TP8_PP2], ids=["one-node", "two-nodes"])
def test_the_readiness_canary_is_a_mounted_readable_file(name: str, overrides: list[str], tmp_path: Path) -> None:
    try:
        recipe = load_recipe(name, overrides)
    except RecipeError:  # a recipe that has no two-node form (SGLang: one node)
        pytest.skip(f"{name} has no {overrides} form")
    out = deploy(recipe, Target.K8S, tmp_path / "k", log=lambda _m: None,
                 options=Options(model_source="s3://my-bucket/x"))
    text = (out / "server.yaml").read_text()
    assert "base64" not in text
    docs = [d for d in yaml.safe_load_all(text) if d]
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    execs = 0
    for spec in (s for d in docs for s in pod_specs(d)):
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["containers"]:
            probe = c["readinessProbe"].get("exec")
            if probe is None:
                continue
            execs += 1
            assert probe["command"] == ["python3", f"{pods.CANARY_DIR}/{pods.CANARY_FILE}"]
            (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == pods.CANARY_DIR]
            script = maps[volumes[mount["name"]]["configMap"]["name"]]["data"][pods.CANARY_FILE]
            compile(script, pods.CANARY_FILE, "exec")  # python3 reads it as written
            assert "/v1/completions" in script or "/generate" in script
            assert f"{pods.CANARY_FILE}: |\n" in text  # a literal block a reviewer reads as is
    assert execs >= 1
