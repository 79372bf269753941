"""Kubernetes objects for a recipe: a Deployment when one replica fits on one node, else a LeaderWorkerSet (one pod
per node, the leader runs the multi-node launch); a Service on the leader/serving pods; the models PVC and a loader
pod to copy the artifacts onto it. Probes are the real one-token inference (trtkv.canary), not a port check."""

from __future__ import annotations

import math
import shlex
from typing import Any

from trtkv.canary import health_cmd
from trtkv.deploy.launch import RAY_PORT, SSH_DIR, SSH_PORT, SSH_WAIT_S, Launch
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
    """startup: the canary every 10 s for triton.startup_timeout_s (plus the wait for the other pods' sshd or Ray
    when a replica spans nodes); then readiness every 30 s (out of the Service after 3 misses) and liveness every
    60 s with a 120 s budget per try (restart after 5 misses in a row: a dead model instance keeps Triton "ready", and
    a saturated server still answers one token within minutes)."""
    budget = recipe.triton.startup_timeout_s + (SSH_WAIT_S if launch.multi_node else 0)
    start = {**_exec(launch.canary), "periodSeconds": 10, "timeoutSeconds": 60,
             "failureThreshold": max(1, math.ceil(budget / 10))}
    ready = {**_exec(launch.canary), "periodSeconds": 30, "timeoutSeconds": 60, "failureThreshold": 3}
    live = {**_exec(launch.canary), "periodSeconds": 60, "timeoutSeconds": 120, "failureThreshold": 5}
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
            f'[ $n -gt {SSH_WAIT_S // 5} ] && echo "no sshd on $h after {SSH_WAIT_S} s" >&2 && exit 1; sleep 5; done; '
            'done; ')
# mpirun's own install (orted on the other pods) and the image's environment for every rank; FQDNs kept whole
MPI_PREFIX = 'MPI_HOME=$(dirname "$(dirname "$(command -v mpirun)")"); '
MPI_ARGS = ["--prefix", "MPI_HOME", "-mca", "orte_keep_fqdn_hostnames", "1", "-x", "PATH", "-x", "LD_LIBRARY_PATH",
            "-x", "PYTHONPATH", "-x", "HOME"]
RAY_ALIVE = ("python3 -c 'import ray; ray.init(address=\"auto\", logging_level=\"ERROR\"); "
             "print(sum(n[\"Alive\"] for n in ray.nodes()))' 2>/dev/null")


def leader_script(launch: Launch, sizing: Sizing) -> str:
    """bash on the leader pod: the MPI launch over every pod of the group, or the Ray head then vLLM."""
    if launch.ray_worker:
        return ray_head(launch, "$LWS_GROUP_SIZE")
    rsh = f"-p {SSH_PORT} -i {SSH_DIR}/id_ed25519 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
    mpirun = launch.leader[:2] + ["-H", "HOSTS", "-mca", "plm_rsh_args", rsh, *MPI_ARGS] + launch.leader[2:]
    cmd = shlex.join(mpirun).replace(" HOSTS ", ' "$HOSTS" ', 1).replace(" MPI_HOME ", ' "$MPI_HOME" ', 1)
    return (f"{SSHD} && " + WORKER_HOSTS.replace("{slots}", str(sizing.gpus_per_pod)) + WAIT_SSH + MPI_PREFIX
            + f"exec {cmd}")


def ray_head(launch: Launch, nodes: str) -> str:
    """The Ray head, a wait (bounded) until `nodes` nodes are alive, then vLLM on the cluster."""
    return (f"ray start --head --port={RAY_PORT} && n=0 && "
            f"until [ \"$({RAY_ALIVE})\" -ge \"{nodes}\" ] 2>/dev/null; do n=$((n+1)); "
            f"[ $n -gt {SSH_WAIT_S // 5} ] && echo \"Ray: fewer than {nodes} nodes after {SSH_WAIT_S} s\" >&2 && "
            f"exit 1; sleep 5; done && exec {shlex.join(launch.leader)}")


def ray_worker(address: str) -> str:
    """Join the head's Ray cluster, retrying until the head answers (it may start later than this pod)."""
    return (f"until ray start --address={address}:{RAY_PORT} --block; do echo 'Ray head not answering yet' >&2; "
            f"sleep 5; done")


def worker_script(launch: Launch) -> str:
    if launch.ray_worker:
        return ray_worker("$LWS_LEADER_ADDRESS")
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
    # not the LWS's own name: LeaderWorkerSet makes a headless Service of that name for the pods' DNS records
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": k8s_name(recipe, "api"), "labels": lab},
               "spec": {"type": "ClusterIP", "selector": selector, "ports": service_ports}}
    return [pvc, loader, workload, service]
