"""The parts every server pod of a deployment shares (Deployment, LeaderWorkerSet leader and
workers, Dynamo workers): placement on the GPU the plan sized for, the non-root user and read-only
root filesystem with writable emptyDirs, the API key and ssh keys as Secret files, the models volume
at /models, the init container that waits for the loader Job's marker, probes on the engine's own
health endpoints and on trtkv's canary, and checkov's skip annotations (each skip with its reason,
only from SKIPPABLE; docs/deploy.md lists them).
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from trtkv.core.apikey import API_KEY_ENV, API_KEY_FILE_ENV
from trtkv.core.errors import StageError
from trtkv.deploy.launch import NGC_UID, SSH_DIR, SSH_PORT, SSH_WAIT_S, Launch
from trtkv.deploy.resources import STARTUP_PERIOD_S, WAITER, canary_timeout_s, startup_budget_s
from trtkv.deploy.sizing import Sizing
from trtkv.platform.hardware import GPU_SPECS
from trtkv.recipe import Recipe
from trtkv.recipe.layout import CONTAINER_ROOT

# the models volume: /models/<recipe>/{checkpoint,engine,triton_repo}
MODELS_MOUNT = str(CONTAINER_ROOT)
# a writable HOME (emptyDir) for the caches the engines write (JIT kernels, torch, Ray)
HOME = "/home/trtkv"
KEY_SECRET_FIELD = "api-key"
# the API key's Secret, mounted as a file (never an environment variable from a Secret)
KEY_DIR = "/etc/trtkv-key"
# the readiness canary, a readable python3 file from the ConfigMap <name>-canary (server.yaml)
CANARY_DIR = "/etc/trtkv-canary"
CANARY_FILE = "canary.py"
KEY_FILE = f"{KEY_DIR}/{KEY_SECRET_FIELD}"
GFD_PRODUCT = "nvidia.com/gpu.product"  # GPU feature discovery's node label (GPUSpec.gfd_product)
# the usual GPU-node taint
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# /models/<recipe>/.trtkv-loaded: written by the loader Job last, holding its load id
LOAD_MARKER = ".trtkv-loaded"
# how long a server's init container waits for the loader Job before it fails (and retries)
LOAD_WAIT_S = 6 * 3600
LIVE_PERIOD_S, LIVE_TIMEOUT_S, LIVE_FAILURES = 30, 10, 3
READY_PERIOD_S, READY_FAILURES = 30, 3

# checkov checks a deployment may skip, with the reason written into the manifest (checkov.io/skipN
# annotations). Never: resources (CKV_K8S_10-13), probes (8, 9), capabilities (7, 24, 25, 28, 36,
# 37, 39), seccomp (31, 32), namespace (21). tests/deploy/test_checkov.py holds the scan to zero
# failed checks and this list to docs/deploy.md.
SKIPPABLE = {
    "CKV_K8S_43": "image by tag: pin a digest with `trtkv deploy --image IMAGE@sha256:...` (the "
    "server) or `kustomize edit set image` (any image); trtkv cannot know which digest your "
    "registry mirrors",
    "CKV_K8S_15": "imagePullPolicy IfNotPresent: the engine images are 10-25 GB and pinned by tag "
    "(or digest); Always would reach the registry on every restart of a GPU pod",
    "CKV_K8S_40": "uid 1000 is the NGC images' own user: Triton/TensorRT-LLM's triton-server "
    "(triton-inference-server/server build.py asserts uid and gid 1000), Dynamo's dynamo "
    "(container/templates/dynamo_runtime.Dockerfile asserts uid 1000); ssh and OpenMPI need a uid "
    "with a passwd entry",
    "CKV_K8S_38": "Dynamo's components find each other through the Kubernetes API (the operator's "
    "default DYN_DISCOVERY_BACKEND kubernetes) with the service account the operator binds",
}
CHECK_NAMES = {
    "CKV_K8S_43": "Image should use digest",
    "CKV_K8S_15": "Image Pull Policy should be Always",
    "CKV_K8S_40": "Containers should run as a high UID to avoid host conflict",
    "CKV_K8S_38": "Ensure that Service Account Tokens are only mounted where necessary",
}
NEVER_SKIPPED = (
    "CKV_K8S_7",
    "CKV_K8S_8",
    "CKV_K8S_9",
    "CKV_K8S_10",
    "CKV_K8S_11",
    "CKV_K8S_12",
    "CKV_K8S_13",
    "CKV_K8S_21",
    "CKV_K8S_24",
    "CKV_K8S_25",
    "CKV_K8S_28",
    "CKV_K8S_31",
    "CKV_K8S_32",
    "CKV_K8S_36",
    "CKV_K8S_37",
    "CKV_K8S_39",
)


def skip_annotations(*checks: str) -> dict[str, str]:
    """checkov's in-manifest skips (`checkov.io/skip1: CKV_K8S_43=reason`), only for checks in
    SKIPPABLE."""
    out = {}
    for n, check in enumerate(checks, 1):
        if check not in SKIPPABLE or "=" in SKIPPABLE[check]:  # pragma: no cover - a bug (tests)
            raise StageError(
                f"checkov check {check} is not in trtkv.deploy.pods.SKIPPABLE (or its reason holds "
                "a '=', which checkov's annotation parser splits on)"
            )
        out[f"checkov.io/skip{n}"] = f"{check}={SKIPPABLE[check]}"
    return out


def image_skips(images: list[str], uid: int | None = None) -> list[str]:
    """The skips an object's images and user need: digest (unless every image is pinned by one),
    pull policy, uid."""
    out = [] if all("@sha256:" in i for i in images) else ["CKV_K8S_43"]
    out.append("CKV_K8S_15")
    if uid == NGC_UID:
        out.append("CKV_K8S_40")
    return out


def gpu_product(recipe: Recipe) -> str:
    """The GFD label value of the recipe's GPU."""
    spec = GPU_SPECS.get(recipe.hardware.gpu)
    if spec is None or not spec.gfd_product:
        raise StageError(
            f"{recipe.name}: hardware.gpu {recipe.hardware.gpu.value} has no GPU feature discovery "
            "label in trtkv's GPU table (trtkv/platform/hardware.py gfd_product). Next: use a GPU "
            "the table knows, or add its nvidia.com/gpu.product value there."
        )
    return spec.gfd_product


def placement(recipe: Recipe) -> dict[str, Any]:
    """Node affinity on the GPU the plan sized for (GFD's nvidia.com/gpu.product) and a toleration
    of the usual nvidia.com/gpu taint."""
    term = {
        "matchExpressions": [
            {"key": GFD_PRODUCT, "operator": "In", "values": [gpu_product(recipe)]}
        ]
    }
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        },
        "tolerations": [dict(GPU_TOLERATION)],
    }


def spread(match: dict[str, str], replicas: int) -> dict[str, Any]:
    """Replicas spread over nodes where the cluster allows (ScheduleAnyway: never blocks scheduling
    on a small cluster); nothing for one replica."""
    if replicas < 2:
        return {}
    return {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": dict(match)},
            }
        ]
    }


def container_security() -> dict[str, Any]:
    """No privilege escalation, every capability dropped, a read-only root filesystem, never
    root."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def pod_security(uid: int) -> dict[str, Any]:
    """The runtime's default seccomp profile and a fixed non-root user (its group owns the volumes:
    fsGroup, changed only when the volume's root does not match: no recursive chown of a 100 GB
    models volume on every start)."""
    return {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",
    }


def volumes(
    models_claim: str,
    launch: Launch,
    ssh_secret: str | None,
    key_secret: str | None,
    canary_map: str | None = None,
) -> list[dict[str, Any]]:
    """The models PVC (read-only), memory-backed /dev/shm (sized: it counts against the memory
    limit), HOME and /tmp emptyDirs, the Secrets mounted as files and the canary's ConfigMap."""
    out: list[dict[str, Any]] = [
        {"name": "models", "persistentVolumeClaim": {"claimName": models_claim, "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{launch.shm_gib}Gi"}},
        {"name": "home", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if ssh_secret:
        out.append({"name": "ssh", "secret": {"secretName": ssh_secret, "defaultMode": 0o440}})
    if key_secret:
        out.append({"name": "api-key", "secret": {"secretName": key_secret, "defaultMode": 0o440}})
    if canary_map:
        out.append({"name": "canary", "configMap": {"name": canary_map, "defaultMode": 0o444}})
    return out


def mounts(ssh: bool, keyed: bool, canary: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "home", "mountPath": HOME},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if ssh:
        out.append({"name": "ssh", "mountPath": SSH_DIR, "readOnly": True})
    if keyed:
        out.append({"name": "api-key", "mountPath": KEY_DIR, "readOnly": True})
    if canary:
        out.append({"name": "canary", "mountPath": CANARY_DIR, "readOnly": True})
    return out


def env(keyed: bool) -> list[dict[str, Any]]:
    """HOME, TMPDIR and a user name (getpass and torch's caches read USER when the uid has no passwd
    entry); the key's file for the canary. No Secret is ever an environment variable."""
    out = [
        {"name": "HOME", "value": HOME},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "USER", "value": "trtkv"},
    ]
    if keyed:
        out.append({"name": API_KEY_FILE_ENV, "value": KEY_FILE})
    return out


def key_from_file(launch: Launch) -> str:
    """Shell: the API key from its Secret file into $TRTKV_API_KEY (and the server's own variable),
    for the command line that follows (Triton's restricted APIs, SGLang's --api-key) or the server
    itself (vLLM)."""
    out = f'{API_KEY_ENV}="$(cat {KEY_FILE} 2>/dev/null)"; export {API_KEY_ENV}; '
    if launch.key_env:
        out += f'export {launch.key_env}="${API_KEY_ENV}"; '
    return out


def http_get(path: str, port: int, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def probes(recipe: Recipe, launch: Launch, sizing: Sizing) -> dict[str, Any]:
    """startup: the engine's ready endpoint, for as long as loading the model takes
    (trtkv.deploy.resources); liveness: its live endpoint (cheap: a saturated but healthy server
    answers it); readiness: trtkv's one-token canary with a deadline a loaded server meets (a dead
    model instance shows here: Triton stays "live"), run from its ConfigMap's file."""
    port = launch.ports["http"]
    budget = startup_budget_s(recipe, sizing, SSH_WAIT_S if launch.multi_node else 0)
    deadline = canary_timeout_s(recipe, sizing)  # the deadline launch.canary was written with
    return {
        "startupProbe": http_get(
            launch.start_path, port, STARTUP_PERIOD_S, 5, math.ceil(budget / STARTUP_PERIOD_S)
        ),
        "livenessProbe": http_get(
            launch.live_path, port, LIVE_PERIOD_S, LIVE_TIMEOUT_S, LIVE_FAILURES
        ),
        "readinessProbe": {
            # the ConfigMap's file (canary_config_map): a reviewer reads what runs
            "exec": {"command": ["python3", f"{CANARY_DIR}/{CANARY_FILE}"]},
            "periodSeconds": READY_PERIOD_S,
            "timeoutSeconds": deadline + 10,
            "failureThreshold": READY_FAILURES,
        },
    }


def canary_config_map(launch: Launch, name: str, meta: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap holding the readiness canary as a readable python3 file (launch.canary),
    mounted read-only at CANARY_DIR: no encoded blob for a platform reviewer to decode. `meta`: its
    metadata (name, namespace, labels)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "name": name},
        "data": {CANARY_FILE: launch.canary},
    }


def tcp_probes(port: int) -> dict[str, Any]:
    """A multi-node worker's probes: the port its launch listens on (sshd for MPI, the raylet for
    Ray)."""
    probe = {
        "tcpSocket": {"port": port},
        "periodSeconds": LIVE_PERIOD_S,
        "timeoutSeconds": LIVE_TIMEOUT_S,
    }
    return {
        "startupProbe": {**probe, "periodSeconds": STARTUP_PERIOD_S, "failureThreshold": 60},
        "livenessProbe": {**probe, "failureThreshold": LIVE_FAILURES},
        "readinessProbe": {**probe, "failureThreshold": READY_FAILURES},
    }


def process_probes() -> dict[str, Any]:
    """A multi-node worker with no port of its own (a headless vLLM DP node): alive while its
    server, the container's first process, runs."""
    probe = {
        "exec": {"command": ["kill", "-0", "1"]},
        "periodSeconds": LIVE_PERIOD_S,
        "timeoutSeconds": LIVE_TIMEOUT_S,
    }
    return {
        "livenessProbe": {**probe, "failureThreshold": LIVE_FAILURES},
        "readinessProbe": {**probe, "failureThreshold": READY_FAILURES},
    }


def wait_for_load(recipe: Recipe, image: str, load_id: str) -> dict[str, Any]:
    """The init container: wait (bounded) until the loader Job wrote this load's marker on the
    models volume."""
    marker = shlex.quote(f"{MODELS_MOUNT}/{recipe.name}/{LOAD_MARKER}")
    script = (
        f'n=0; until [ "$(cat {marker} 2>/dev/null)" = {load_id} ]; do n=$((n+1)); '
        f'if [ $n -gt {LOAD_WAIT_S // 10} ]; then echo "no marker "{marker}" with load {load_id} '
        f'after {LOAD_WAIT_S} s: has the loader Job finished? (kubectl get jobs)" >&2; exit 1; fi; '
        f'sleep 10; done; echo "models loaded ({load_id})"'
    )
    return {
        "name": "wait-for-models",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "resources": WAITER.k8s(),
        "securityContext": container_security(),
        "volumeMounts": [{"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True}],
    }


def ssh_ports() -> list[dict[str, Any]]:
    return [{"name": "ssh", "containerPort": SSH_PORT}]


def skips_markdown() -> str:
    """docs/deploy.md's list of the checkov checks a deployment may skip (scripts/update_docs.py
    keeps it current)."""
    rows = [
        "| check | checkov's name | why trtkv's files skip it (the annotation's reason) |",
        "|---|---|---|",
    ]
    rows += [f"| `{k}` | {CHECK_NAMES[k]} | {v.replace('|', '/')} |" for k, v in SKIPPABLE.items()]
    return "\n".join(
        rows
        + [
            "",
            "Never skipped: "
            + ", ".join(f"`{c}`" for c in NEVER_SKIPPED)
            + " (resources, probes, capabilities, seccomp, namespace).",
        ]
    )
