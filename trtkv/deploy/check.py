"""Checks of the files `trtkv deploy` writes, by consumers trtkv did not write:

- core Kubernetes objects: kubernetes-validate (the Kubernetes OpenAPI schemas it ships) for
  KUBERNETES_VERSION, strict (an unknown field is an error, as `kubectl apply --validate=strict`
  makes it);
- LeaderWorkerSet and DynamoGraphDeployment: the CRDs' own openAPIV3Schema, read from upstream at a
  named release (trtkv/data/schemas, SOURCES.json; scripts/crd_schema.py extracts them), with
  unknown fields refused the same way;
- shell scripts: `bash -n`, and shellcheck when it is installed; a Slurm job's pyxis mount list
  split as pyxis splits it (one /SRC:/DST:ro per folder).
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

KUBERNETES_VERSION = "1.34"
CRD_SCHEMAS = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.x-k8s.io_v1.json.gz",
    (
        "nvidia.com/v1beta1",
        "DynamoGraphDeployment",
    ): "nvidia.com_dynamographdeployments_v1beta1.json.gz",
}
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def crd_schema_info(file: str) -> dict[str, Any]:
    return json.loads(
        gzip.decompress((resources.files("trtkv") / "data" / "schemas" / file).read_bytes())
    )


def _strict(schema: Any) -> Any:
    """additionalProperties: false wherever an object lists its properties and does not keep unknown
    fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def _crd_validator(file: str) -> Any:
    import jsonschema

    schema = _strict(copy.deepcopy(crd_schema_info(file)["openAPIV3Schema"]))
    return jsonschema.Draft7Validator(schema)


def _where(path: Any) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path) or "(top)"


def check_object(obj: dict[str, Any]) -> list[str]:
    """Every problem with one object (empty when valid)."""
    kind, api = obj.get("kind"), obj.get("apiVersion")
    name = (obj.get("metadata") or {}).get("name", "")
    head = f"{kind} {name}"
    problems = []
    if not isinstance(name, str) or len(name) > 63 or not DNS1123.match(name):
        problems.append(
            f"{head}: metadata.name {name!r} is not a DNS-1123 label (lower case, digits, '-', <= "
            "63)"
        )
    problems += [f"{head}: {p}" for p in _scripts(obj)]
    file = CRD_SCHEMAS.get((str(api), str(kind)))
    if file is not None:
        validator = _crd_validator(file)
        for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
            problems.append(f"{head}: {_where(err.absolute_path)}: {err.message}")
        # a CRD's schema says only "metadata: object": check it as any object's ObjectMeta
        obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata")}
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        problems.append(f"{head}: {_where(exc.path)}: {exc.message}")
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        problems.append(
            f"{head}: no Kubernetes {KUBERNETES_VERSION} schema for {api} {kind} ({exc})"
        )
    return problems


def _scripts(node: Any, path: str = "") -> list[str]:
    """`bash -n` on every container command of the form [bash|sh, -c, SCRIPT] anywhere in the
    object."""
    out: list[str] = []
    if isinstance(node, dict):
        cmd = node.get("command")
        if (
            isinstance(cmd, list)
            and len(cmd) == 3
            and cmd[0] in ("bash", "sh")
            and cmd[1] == "-c"
            and isinstance(cmd[2], str)
        ):
            proc = subprocess.run(["bash", "-n", "-c", cmd[2]], capture_output=True, text=True)
            if proc.returncode:
                out.append(f"{path}.command: bash -n: {proc.stderr.strip()}")
        for key, value in node.items():
            out += _scripts(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _scripts(value, f"{path}[{i}]")
    return out


def check_shell(path: Path) -> list[str]:
    problems = []
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    if proc.returncode:
        problems.append(f"{path.name}: bash -n: {proc.stderr.strip()}")
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        proc = subprocess.run(
            [shellcheck, "-S", "warning", str(path)], capture_output=True, text=True
        )
        if proc.returncode:
            problems.append(f"{path.name}: shellcheck: {proc.stdout.strip()}")
    return problems


# the job's lines that build pyxis's mount list (trtkv.deploy.slurm.job_script)
MOUNT_LINES = ("ENGINES=", "REPOSITORIES=", "HERE=", "MOUNTS=")


def check_mounts(path: Path) -> list[str]:
    """pyxis's reading of a Slurm job's --container-mounts list (SRC:DST[:FLAGS] split at every ','
    and ':', no escaping), with the folders the job names when no TRTKV_* is set: one mount per
    folder the list names, each `/SRC:/DST:ro`."""
    lines = [x for x in path.read_text().splitlines() if x.startswith(MOUNT_LINES)]
    listed = next((x for x in lines if x.startswith("MOUNTS=")), None)
    if listed is None:
        return []
    if any("$(" in x or "`" in x for x in lines):
        return [f"{path.name}: the mount list's lines hold a command substitution"]
    proc = subprocess.run(
        ["bash", "-c", "\n".join(lines) + '\nprintf %s "$MOUNTS"'],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode:
        return [f"{path.name}: the mount list does not expand: {proc.stderr.strip()}"]
    mounts, wanted = proc.stdout.split(","), listed.count('"$')
    problems = []
    if len(mounts) != wanted:
        problems.append(
            f"{path.name}: pyxis reads {len(mounts)} mounts where the job names {wanted}: a ',' in "
            f"a path splits --container-mounts ({proc.stdout!r})"
        )
    for mount in mounts:
        fields = mount.split(":")
        if len(fields) != 3 or fields[2] != "ro" or not all(f.startswith("/") for f in fields[:2]):
            problems.append(
                f"{path.name}: pyxis reads the mount {mount!r}, not /SRC:/DST:ro (a ':' or ',' in "
                "a path)"
            )
    return problems


def check_folder(folder: Path) -> tuple[list[str], list[str]]:
    """(what was checked, problems) for every .yaml and .sh/.sbatch file in `folder`."""
    import yaml

    checked, problems = [], []
    for path in sorted(folder.iterdir()):
        if path.suffix == ".yaml":
            for obj in yaml.safe_load_all(path.read_text()):
                if obj:
                    found = check_object(obj)
                    problems += [f"{path.name}: {p}" for p in found]
                    how = (
                        "its CRD schema"
                        if (obj.get("apiVersion"), obj.get("kind")) in CRD_SCHEMAS
                        else f"Kubernetes {KUBERNETES_VERSION}"
                    )
                    checked.append(
                        f"{path.name}: {obj['kind']} {obj['metadata']['name']} against {how}"
                    )
        elif path.suffix in (".sh", ".sbatch"):
            problems += check_shell(path)
            mounts = check_mounts(path)
            problems += mounts
            checked.append(
                f"{path.name}: bash -n" + (" + shellcheck" if shutil.which("shellcheck") else "")
            )
            if path.suffix == ".sbatch" and not mounts:
                checked.append(f"{path.name}: --container-mounts read as pyxis splits it")
    return checked, problems


# ---------------------------------------------------------------------------------------------
# checkov (tests/deploy/test_checkov.py runs it, pinned, from its own venv: `make install-checkov`)

SCAN_SUFFIX = "-scan"  # scan-only Pods are named <object>-<template>-scan


def _scan_pod(name: str, namespace: str | None, template: dict[str, Any]) -> dict[str, Any]:
    """A Pod built from a pod template (metadata labels and annotations, spec), for checkov only: it
    evaluates pod specs inside Pod/Deployment/Job/... objects, not inside custom resources."""
    meta: dict[str, Any] = {
        "name": name + SCAN_SUFFIX,
        **({"namespace": namespace} if namespace else {}),
    }
    for key in ("labels", "annotations"):
        if (template.get("metadata") or {}).get(key):
            meta[key] = dict(template["metadata"][key])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": copy.deepcopy(template["spec"]),
    }


def scan_pods(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The scan-only Pods of a LeaderWorkerSet (leader and worker templates) or a
    DynamoGraphDeployment (each component's podTemplate); none for other kinds (checkov reads their
    pod specs itself)."""
    meta, kind = obj.get("metadata") or {}, obj.get("kind")
    name, ns = str(meta.get("name", "")), meta.get("namespace")
    if kind == "LeaderWorkerSet":
        tmpl = obj["spec"]["leaderWorkerTemplate"]
        return [
            _scan_pod(f"{name}-{role}", ns, tmpl[f"{role}Template"])
            for role in ("leader", "worker")
            if f"{role}Template" in tmpl
        ]
    if kind == "DynamoGraphDeployment":
        return [
            _scan_pod(f"{name}-{c['name'].lower()}", ns, c["podTemplate"])
            for c in obj["spec"]["components"]
            if "podTemplate" in c
        ]
    return []


def scan_documents(folder: Path) -> list[dict[str, Any]]:
    """Every object of a deploy folder's YAML files, followed by the scan-only Pods of its custom
    resources."""
    import yaml

    objs = [
        o for p in sorted(folder.glob("*.yaml")) for o in yaml.safe_load_all(p.read_text()) if o
    ]
    return objs + [pod for o in objs for pod in scan_pods(o)]
