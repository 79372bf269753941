"""checkov (3.3.30, its own venv: `make install-checkov`), a policy scanner trtkv did not write, over every Kubernetes
target of every shipped GPU recipe (and the multi-node LeaderWorkerSet and Dynamo variants): zero failed checks. The
pod templates of custom resources (LeaderWorkerSet, DynamoGraphDeployment), which checkov does not read, are scanned
as scan-only Pods (trtkv.deploy.check.scan_documents); the test asserts which resources checkov evaluated, and that
every skip is one of docs/deploy.md's, with its reason. One checkov run for the whole session."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.planned import size
from trtkv.deploy import Options, Target, render
from trtkv.deploy.check import SCAN_SUFFIX, scan_documents
from trtkv.deploy.pods import NEVER_SKIPPED, SKIPPABLE
from trtkv.recipe import list_recipes, load_recipe

pytestmark = pytest.mark.e2e
CHECKOV = Path(__file__).parents[2] / ".venv-checkov" / "bin" / "checkov"
TP8_PP2 = ["build.tp_size=8", "build.pp_size=2", "hardware.count=16"]
MULTI_NODE = [("llama70b_fp8kv", TP8_PP2, Target.K8S), ("llama70b_fp8kv_llmapi", TP8_PP2, Target.K8S),
              ("llama70b_fp8kv_llmapi", [*TP8_PP2, "build.backend=vllm"], Target.K8S),
              ("llama70b_fp8kv_llmapi", TP8_PP2, Target.DYNAMO)]
# a host KV tier (#55): its pinned memory inside the containers' requests and limits
TIER = ["triton.kv_host_tier_gib_per_replica=100"]
HOST_TIER = [("llama70b_fp8kv", TIER, Target.K8S), ("llama70b_fp8kv_sglang", TIER, Target.K8S),
             ("llama70b_fp8kv_llmapi", [*TIER, "build.backend=vllm"], Target.K8S),
             ("llama70b_fp8kv_llmapi", TIER, Target.DYNAMO)]
EVALUATED_KINDS = {"Deployment", "Job", "Pod", "Service", "ConfigMap"}  # what checkov 3.3.30 checks of ours


def targets() -> list[tuple[str, list[str], Target]]:
    """Every shipped GPU recipe on k8s, the Dynamo-capable ones on dynamo, and the multi-node variants."""
    out = []
    for path in list_recipes():
        recipe = load_recipe(str(path))
        if recipe.hardware.gpu.value == "cpu":
            continue
        out.append((path.stem, [], Target.K8S))
        from trtkv.deploy import dynamo

        if dynamo.worker(recipe) is not None:
            out.append((path.stem, [], Target.DYNAMO))
    return out + MULTI_NODE + HOST_TIER


@pytest.fixture(scope="session")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(every scanned document, checkov's JSON report): each target rendered in a namespace of its own."""
    if not CHECKOV.is_file():
        pytest.fail(f"{CHECKOV} is missing: `make install-checkov` (make test installs it)")
    root = tmp_path_factory.mktemp("checkov")
    docs: list[dict[str, Any]] = []
    for i, (name, overrides, target) in enumerate(targets()):
        recipe = load_recipe(name, overrides)
        files, _readme = render(recipe, target, size(recipe, replicas=2), root / f"out{i}",
                                Options(namespace=f"scan-{i}", model_source="s3://my-bucket/trtkv"))
        folder = root / f"t{i}"
        folder.mkdir()
        for file, text in files.items():
            (folder / file).write_text(text)
        target_docs = scan_documents(folder)
        for file in folder.glob("*.yaml"):
            file.unlink()
        (root / f"scan-{i}.yaml").write_text("---\n".join(yaml.safe_dump(d, sort_keys=False) for d in target_docs))
        docs += target_docs
    proc = subprocess.run([str(CHECKOV), "-d", str(root), "--framework", "kubernetes", "--compact", "--skip-download",
                           "-o", "json"], capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stdout)
    return docs, report[0] if isinstance(report, list) else report


def test_no_check_fails(scanned: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    _docs, report = scanned
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in report["results"]["failed_checks"]]
    assert failed == []
    assert report["summary"]["checkov_version"] == "3.3.30" and report["summary"]["parsing_errors"] == 0
    assert report["summary"]["passed"] > 1000  # it did check


def test_checkov_evaluated_every_workload_and_the_custom_resources_pod_templates(
        scanned: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    docs, report = scanned
    results = report["results"]
    seen = {c["resource"] for k in ("passed_checks", "skipped_checks", "failed_checks") for c in results[k]}
    expected = {f"{d['kind']}.{d['metadata']['namespace']}.{d['metadata']['name']}" for d in docs
                if d["kind"] in EVALUATED_KINDS}
    assert expected <= seen, sorted(expected - seen)
    scan_pods = {r for r in seen if r.startswith("Pod.") and r.endswith(SCAN_SUFFIX)}
    # the LeaderWorkerSets' leader and worker templates and every Dynamo component's podTemplate
    lws = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    dgd = [d for d in docs if d["kind"] == "DynamoGraphDeployment"]
    assert len(lws) == 3 and len(dgd) >= 8
    assert len(scan_pods) == 2 * len(lws) + sum(len(d["spec"]["components"]) for d in dgd)
    for kind in ("Deployment", "Job"):  # checkov evaluates the pod template of each as a Pod of its own too
        for d in (d for d in docs if d["kind"] == kind):
            assert any(r.startswith(f"Pod.{d['metadata']['namespace']}.{d['metadata']['name']}.") for r in seen), d


def test_every_skip_is_listed_with_its_reason_and_none_is_forbidden(
        scanned: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    _docs, report = scanned
    skipped = report["results"]["skipped_checks"]
    assert skipped  # the image tag and pull-policy skips are there
    for c in skipped:
        assert c["check_id"] in SKIPPABLE and c["check_id"] not in NEVER_SKIPPED, c["check_id"]
        assert c["check_result"]["suppress_comment"] == SKIPPABLE[c["check_id"]]


def test_a_digest_pinned_image_needs_no_digest_skip(tmp_path: Path) -> None:
    recipe = load_recipe("llama8b_fp8kv")
    digest = "nvcr.io/nvidia/tritonserver@sha256:" + "a" * 64
    files, _ = render(recipe, Target.K8S, size(recipe), tmp_path, Options(model_source="s3://my-bucket/x", image=digest))
    server = [d for d in yaml.safe_load_all(files["server.yaml"]) if d and d["kind"] == "Deployment"][0]
    assert server["spec"]["template"]["spec"]["containers"][0]["image"] == digest
    assert "CKV_K8S_43" not in json.dumps(server["metadata"].get("annotations", {}))
