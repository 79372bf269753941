"""Kubernetes objects for a recipe: a Deployment when one replica fits on one node, else a LeaderWorkerSet (one pod
per node, the leader runs the multi-node launch); a Service on the leader/serving pods; the models PVC and a loader
pod to copy the artifacts onto it. Probes are the real one-token inference (trtkv.canary), not a port check."""

from __future__ import annotations

import math
import shlex
from typing import Any

from trtkv.canary import health_cmd
from trtkv.deploy.launch import RAY_PORT, SSH_DIR, SSH_PORT, Launch
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
MODELS_MOUNT = "/models"


def k8s_name(recipe: Recipe, suffix: str = "") -> str:
    """A DNS-1123 name: trtkv-<recipe>[-suffix], lower case, '_' and '.' as '-'."""
    base = f"trtkv-{recipe.name}".lower().replace("_", "-").replace(".", "-")
    return f"{base}-{suffix}" if suffix else base


def labels(recipe: Recipe) -> dict[str, str]:
    return {"app.kubernetes.io/name": k8s_name(recipe), "app.kubernetes.io/managed-by": "trtkv"}


def _exec(script: str) -> dict[str, Any]:
    return {"exec": {"command": ["sh", "-c", health_cmd(script)]}}


def probes(recipe: Recipe, launch: Launch) -> dict[str, Any]:
    """startup: the canary every 10 s for triton.startup_timeout_s; then readiness every 30 s (out of the Service
    after 3 misses) and liveness every 60 s (restart after 3 misses: a dead model instance keeps Triton "ready")."""
    start = {**_exec(launch.canary), "periodSeconds": 10, "timeoutSeconds": 60,
             "failureThreshold": max(1, math.ceil(recipe.triton.startup_timeout_s / 10))}
    ready = {**_exec(launch.canary), "periodSeconds": 30, "timeoutSeconds": 60, "failureThreshold": 3}
    live = {**_exec(launch.canary), "periodSeconds": 60, "timeoutSeconds": 60, "failureThreshold": 3}
    return {"startupProbe": start, "readinessProbe": ready, "livenessProbe": live}


def _annotations(launch: Launch) -> dict[str, str]:
    if launch.metrics_path is None:
        return {}
    port = launch.ports.get("metrics", launch.ports["http"])
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": launch.metrics_path}


def _volumes(recipe: Recipe, ssh: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "models", "persistentVolumeClaim": {"claimName": k8s_name(recipe, "models"), "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},  # NCCL and Triton's Python backend use /dev/shm
    ]
    if ssh:
        out.append({"name": "ssh", "secret": {"secretName": k8s_name(recipe, "ssh"), "defaultMode": 0o400}})
    return out


def _mounts(launch: Launch, ssh: bool) -> list[dict[str, Any]]:
    out = [{"name": "models", "mountPath": path, "subPath": sub, "readOnly": True} for sub, path in launch.mounts]
    out.append({"name": "dshm", "mountPath": "/dev/shm"})
    if ssh:
        out.append({"name": "ssh", "mountPath": SSH_DIR, "readOnly": True})
    return out


def _container(name: str, launch: Launch, sizing: Sizing, command: list[str], ports: bool, ssh: bool,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": launch.image, "command": command,
                         "resources": {"limits": {"nvidia.com/gpu": sizing.gpus_per_pod}},
                         "volumeMounts": _mounts(launch, ssh)}
    if ports:
        c["ports"] = [{"name": n, "containerPort": p} for n, p in launch.ports.items()]
    return {**c, **(extra or {})}


def _pod_spec(recipe: Recipe, containers: list[dict[str, Any]], ssh: bool) -> dict[str, Any]:
    return {"containers": containers, "volumes": _volumes(recipe, ssh),
            "terminationGracePeriodSeconds": 60}


SSHD = (f"mkdir -p /run/sshd && ssh-keygen -A && /usr/sbin/sshd -e -p {SSH_PORT} "
        f"-o PermitRootLogin=prohibit-password -o AuthorizedKeysFile={SSH_DIR}/authorized_keys -o StrictModes=no")
WORKER_HOSTS = ('NAME=${LWS_LEADER_ADDRESS%%.*}; DOMAIN=${LWS_LEADER_ADDRESS#*.}; HOSTS="$LWS_LEADER_ADDRESS:{slots}"; '
                'for i in $(seq 1 $((LWS_GROUP_SIZE - 1))); do HOSTS="$HOSTS,$NAME-$i.$DOMAIN:{slots}"; done; ')
WAIT_SSH = ('for h in $(echo "$HOSTS" | tr , " "); do h=${h%:*}; n=0; '
            f'until (exec 3<>/dev/tcp/$h/{SSH_PORT}) 2>/dev/null; do n=$((n+1)); '
            '[ $n -gt 120 ] && echo "no sshd on $h after 10 min" >&2 && exit 1; sleep 5; done; done; ')


def leader_script(launch: Launch, sizing: Sizing) -> str:
    """bash on the leader pod: the MPI launch over every pod of the group, or the Ray head then vLLM."""
    if launch.ray_worker:
        return (f"ray start --head --port={RAY_PORT} && "
                f"until [ \"$(ray status 2>/dev/null | grep -c node_)\" -ge \"$LWS_GROUP_SIZE\" ]; do sleep 5; done && "
                f"exec {shlex.join(launch.leader)}")
    rsh = f"-p {SSH_PORT} -i {SSH_DIR}/id_ed25519 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
    mpirun = launch.leader[:2] + ["-H", "HOSTS", "-mca", "plm_rsh_args", rsh] + launch.leader[2:]
    cmd = shlex.join(mpirun).replace(" HOSTS ", ' "$HOSTS" ', 1)
    return f"{SSHD} && " + WORKER_HOSTS.replace("{slots}", str(sizing.gpus_per_pod)) + WAIT_SSH + f"exec {cmd}"


def worker_script(launch: Launch) -> str:
    if launch.ray_worker:
        return f"exec ray start --address=$LWS_LEADER_ADDRESS:{RAY_PORT} --block"
    return SSHD.replace("/usr/sbin/sshd -e", "exec /usr/sbin/sshd -D -e")


def objects(recipe: Recipe, launch: Launch, sizing: Sizing) -> list[dict[str, Any]]:
    """Every object of the deployment, in apply order (PVC, loader pod, workload, Service)."""
    name, lab = k8s_name(recipe), labels(recipe)
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": k8s_name(recipe, "models"),
                                                                             "labels": lab},
           "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": f"{sizing.storage_gib}Gi"}}}}
    loader = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": k8s_name(recipe, "loader"), "labels": lab},
              "spec": {"containers": [{"name": "loader", "image": launch.image, "command": ["sleep", "infinity"],
                                       "volumeMounts": [{"name": "models", "mountPath": MODELS_MOUNT}]}],
                       "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": k8s_name(recipe, "models")}}],
                       "restartPolicy": "Never"}}
    service_ports = [{"name": n, "port": p, "targetPort": p} for n, p in launch.ports.items()]
    if not launch.multi_node:
        pod_labels = {**lab, "app.kubernetes.io/component": "server"}
        main = _container("server", launch, sizing, launch.single, True, False, probes(recipe, launch))
        workload: dict[str, Any] = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": lab},
            "spec": {"replicas": sizing.replicas, "selector": {"matchLabels": pod_labels},
                     "template": {"metadata": {"labels": pod_labels, "annotations": _annotations(launch)},
                                  "spec": _pod_spec(recipe, [main], False)}}}
        selector = pod_labels
    else:
        ssh = launch.uses_ssh
        leader = _container("leader", launch, sizing, ["bash", "-c", leader_script(launch, sizing)], True, ssh,
                            probes(recipe, launch))
        worker = _container("worker", launch, sizing, ["bash", "-c", worker_script(launch)], False, ssh)
        workload = {
            "apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": {"name": name, "labels": lab},
            "spec": {"replicas": sizing.replicas, "startupPolicy": "LeaderCreated",
                     "leaderWorkerTemplate": {
                         "size": sizing.nodes_per_replica, "restartPolicy": "RecreateGroupOnPodRestart",
                         "leaderTemplate": {"metadata": {"labels": {**lab, "role": "leader"},
                                                         "annotations": _annotations(launch)},
                                            "spec": _pod_spec(recipe, [leader], ssh)},
                         "workerTemplate": {"metadata": {"labels": {**lab, "role": "worker"}},
                                            "spec": _pod_spec(recipe, [worker], ssh)}}}}
        selector = {LWS_NAME_LABEL: name, "role": "leader"}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": lab},
               "spec": {"type": "ClusterIP", "selector": selector, "ports": service_ports}}
    return [pvc, loader, workload, service]
