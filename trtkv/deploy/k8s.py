"""Kubernetes objects for a recipe: a Deployment when one replica fits on one node, else a LeaderWorkerSet (one pod
per node, the leader runs the multi-node launch); a Service on the leader/serving pods; the models PVC and a loader
pod to copy the artifacts onto it. Probes are the real one-token inference (trtkv.contracts.canary), not a port check."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from trtkv.contracts.canary import health_cmd
from trtkv.core.apikey import API_KEY_ENV
from trtkv.core.errors import StageError
from trtkv.deploy.launch import RAY_PORT, REQUIRE_KEY, SSH_DIR, SSH_PORT, SSH_WAIT_S, Launch, shell_join
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
MODELS_MOUNT = "/models"


DEFAULT_CLIENTS = "trtkv-client=true"
DEFAULT_PROMETHEUS = "app.kubernetes.io/name=prometheus"
DEFAULT_PROMETHEUS_NAMESPACE = "kubernetes.io/metadata.name=monitoring"
KEY_SECRET_FIELD = "api-key"
HOME = "/home/trtkv"  # non-root pods: a writable HOME (emptyDir) for the caches vLLM, torch and Ray write
NON_ROOT_UID = 1000
# sshd as root with every capability dropped but these: privilege separation (setuid/setgid, chroot) and its login
# records; nothing else in the pod needs one
SSHD_CAPABILITIES = ["SETUID", "SETGID", "SYS_CHROOT", "AUDIT_WRITE"]
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


def selector(text: str, option: str) -> dict[str, str]:
    """`KEY=VALUE[,KEY=VALUE...]` as matchLabels; StageError naming the option when a key or value is no label."""
    out: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise StageError(f"{option} {text!r}: {part.strip()!r} is not KEY=VALUE with a Kubernetes label key "
                             f"([prefix/]name, name 1-63 of letters, digits, '-', '_', '.') and value (0-63 of the "
                             f"same). Next: e.g. {option} app=gateway (several: a=b,c=d).")
        out[key] = value
    return out


@dataclass(frozen=True)
class Fence:
    """Who the NetworkPolicy admits: the Service's clients (pods of these labels, in this namespace or in the
    namespaces of `client_namespaces`), and the cluster's Prometheus to the metrics port; the group's own pods always."""

    clients: dict[str, str] = field(default_factory=lambda: selector(DEFAULT_CLIENTS, "--allow-from"))
    client_namespaces: dict[str, str] | None = None  # None: the deployment's own namespace
    prometheus: dict[str, str] = field(default_factory=lambda: selector(DEFAULT_PROMETHEUS, "--prometheus"))
    prometheus_namespace: dict[str, str] = field(
        default_factory=lambda: selector(DEFAULT_PROMETHEUS_NAMESPACE, "--prometheus-namespace"))


def _match(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


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


def _volumes(recipe: Recipe, ssh: bool, home: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "models", "persistentVolumeClaim": {"claimName": k8s_name(recipe, "models"), "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},  # NCCL and Triton's Python backend use /dev/shm
    ]
    if ssh:
        out.append({"name": "ssh", "secret": {"secretName": k8s_name(recipe, "ssh"), "defaultMode": 0o400}})
    if home:
        out.append({"name": "home", "emptyDir": {}})
    return out


def _mounts(launch: Launch, ssh: bool) -> list[dict[str, Any]]:
    out = [{"name": "models", "mountPath": path, "subPath": sub, "readOnly": True} for sub, path in launch.mounts]
    out.append({"name": "dshm", "mountPath": "/dev/shm"})
    if ssh:
        out.append({"name": "ssh", "mountPath": SSH_DIR, "readOnly": True})
    if launch.non_root:
        out.append({"name": "home", "mountPath": HOME})
    return out


def container_security(ssh: bool = False) -> dict[str, Any]:
    """No privilege escalation, every capability dropped (sshd's few added back where the pod runs it)."""
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if ssh:
        caps["add"] = list(SSHD_CAPABILITIES)
    return {"allowPrivilegeEscalation": False, "capabilities": caps}


def _key_env(recipe: Recipe, launch: Launch) -> list[dict[str, Any]]:
    """The API key from Secret <name>-key as $TRTKV_API_KEY (the canary sends it; Triton's command line expands it)
    and, for vLLM, VLLM_API_KEY (vLLM's --api-key, read from the environment): a name in the YAML, never the key."""
    if not launch.keyed:
        return []
    ref = {"secretKeyRef": {"name": k8s_name(recipe, "key"), "key": KEY_SECRET_FIELD}}
    env = [{"name": API_KEY_ENV, "valueFrom": ref}]
    if launch.key_env:
        env.append({"name": launch.key_env, "valueFrom": ref})
    return env


def _container(name: str, launch: Launch, sizing: Sizing, command: list[str], ports: bool, ssh: bool,
               extra: dict[str, Any] | None = None, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": launch.image, "command": command,
                         "resources": {"limits": {"nvidia.com/gpu": sizing.gpus_per_pod}},
                         "volumeMounts": _mounts(launch, ssh), "securityContext": container_security(ssh)}
    env = list(env or []) + ([{"name": "HOME", "value": HOME}] if launch.non_root else [])
    if env:
        c["env"] = env
    if ports:
        c["ports"] = [{"name": n, "containerPort": p} for n, p in launch.ports.items()]
    return {**c, **(extra or {})}


def pod_security(non_root: bool) -> dict[str, Any]:
    """The pod's securityContext: the runtime's default seccomp profile; a fixed non-root user where the image
    allows it (vLLM); root for the NGC Triton/TensorRT-LLM images (their launches run as root: `mpirun
    --allow-run-as-root`, sshd for the multi-node ranks; see the README)."""
    out: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if non_root:
        out.update(runAsNonRoot=True, runAsUser=NON_ROOT_UID, runAsGroup=NON_ROOT_UID, fsGroup=NON_ROOT_UID)
    return out


def _pod_spec(recipe: Recipe, containers: list[dict[str, Any]], ssh: bool, non_root: bool = False) -> dict[str, Any]:
    return {"containers": containers, "volumes": _volumes(recipe, ssh, non_root),
            "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": pod_security(non_root), "terminationGracePeriodSeconds": 60}


SSH_HOST_KEY = f"{SSH_DIR}/ssh_host_ed25519_key"  # one host key for every pod of the deployment, from the Secret
SSH_KNOWN_HOSTS = f"{SSH_DIR}/known_hosts"  # its line for the LWS pods' DNS names (the README's secret step)
SSHD = (f"mkdir -p /run/sshd && /usr/sbin/sshd -e -p {SSH_PORT} -h {SSH_HOST_KEY} "
        f"-o PermitRootLogin=prohibit-password -o AuthorizedKeysFile={SSH_DIR}/authorized_keys -o StrictModes=no "
        "-o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o AllowTcpForwarding=no "
        "-o X11Forwarding=no -o PermitTunnel=no")
SSH_OPTIONS = (f"-p {SSH_PORT} -i {SSH_DIR}/id_ed25519 -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
               f"-o UserKnownHostsFile={SSH_KNOWN_HOSTS} -o GlobalKnownHostsFile=/dev/null -o BatchMode=yes")


def known_hosts_pattern(recipe: Recipe) -> str:
    """The known_hosts host pattern of every pod of the LeaderWorkerSet (LWS v0.10.0 DNS names: leader
    <lws>-<group>.<lws>.<namespace>, worker <lws>-<group>-<i>.<lws>.<namespace>) on the sshd port."""
    name = k8s_name(recipe)
    return f"[{name}-*.{name}.*]:{SSH_PORT}"
WORKER_HOSTS = ('NAME=${LWS_LEADER_ADDRESS%%.*}; DOMAIN=${LWS_LEADER_ADDRESS#*.}; HOSTS="$LWS_LEADER_ADDRESS:{slots}"; '
                'for i in $(seq 1 $((LWS_GROUP_SIZE - 1))); do HOSTS="$HOSTS,$NAME-$i.$DOMAIN:{slots}"; done; ')
WAIT_SSH = ('for h in $(echo "$HOSTS" | tr , " "); do h=${h%:*}; n=0; '
            f'until (exec 3<>/dev/tcp/$h/{SSH_PORT}) 2>/dev/null; do n=$((n+1)); '
            f'[ $n -gt {SSH_WAIT_S // 5} ] && echo "no sshd on $h after {SSH_WAIT_S} s" >&2 && exit 1; sleep 5; done; '
            'done; ')
# mpirun's own install (orted on the other pods) and the image's environment for every rank; FQDNs kept whole
MPI_PREFIX = 'MPI_HOME=$(dirname "$(dirname "$(command -v mpirun)")"); '
MPI_ARGS = ["--prefix", "\x00MPI_HOME", "-mca", "orte_keep_fqdn_hostnames", "1", "-x", "PATH", "-x", "LD_LIBRARY_PATH",
            "-x", "PYTHONPATH", "-x", "HOME"]
RAY_ALIVE = ("python3 -c 'import ray; ray.init(address=\"auto\", logging_level=\"ERROR\"); "
             "print(sum(n[\"Alive\"] for n in ray.nodes()))' 2>/dev/null")


def leader_script(launch: Launch, sizing: Sizing) -> str:
    """bash on the leader pod: the MPI launch over every pod of the group, or the Ray head then vLLM."""
    if launch.ray_worker:
        return (REQUIRE_KEY if launch.keyed else "") + ray_head(launch, "$LWS_GROUP_SIZE")
    mpirun = launch.leader[:2] + ["-H", "\x00HOSTS", "-mca", "plm_rsh_args", SSH_OPTIONS, *MPI_ARGS] + launch.leader[2:]
    cmd = shell_join(mpirun, {"\x00HOSTS": '"$HOSTS"', "\x00MPI_HOME": '"$MPI_HOME"'})
    return ((REQUIRE_KEY if launch.keyed else "") + f"{SSHD} && "
            + WORKER_HOSTS.replace("{slots}", str(sizing.gpus_per_pod)) + WAIT_SSH + MPI_PREFIX + f"exec {cmd}")


def ray_head(launch: Launch, nodes: str) -> str:
    """The Ray head, a wait (bounded) until `nodes` nodes are alive, then vLLM on the cluster."""
    return (f"ray start --head --port={RAY_PORT} && n=0 && "
            f"until [ \"$({RAY_ALIVE})\" -ge \"{nodes}\" ] 2>/dev/null; do n=$((n+1)); "
            f"[ $n -gt {SSH_WAIT_S // 5} ] && echo \"Ray: fewer than {nodes} nodes after {SSH_WAIT_S} s\" >&2 && "
            f"exit 1; sleep 5; done && exec {shell_join(launch.leader)}")


def ray_worker(address: str) -> str:
    """Join the head's Ray cluster, retrying until the head answers (it may start later than this pod)."""
    return (f"until ray start --address={address}:{RAY_PORT} --block; do echo 'Ray head not answering yet' >&2; "
            f"sleep 5; done")


def worker_script(launch: Launch) -> str:
    if launch.ray_worker:
        return ray_worker("$LWS_LEADER_ADDRESS")
    return SSHD.replace("/usr/sbin/sshd -e", "exec /usr/sbin/sshd -D -e")


def single_command(launch: Launch) -> list[str]:
    """The one-node server command; a keyed server under bash -c, which expands $TRTKV_API_KEY (from the Secret) and
    refuses to start with an empty key (vLLM and Triton would then take any request)."""
    if not launch.keyed:
        return launch.single
    return ["bash", "-c", REQUIRE_KEY + "exec " + shell_join(launch.single)]


def network_policy(recipe: Recipe, launch: Launch, fence: Fence) -> dict[str, Any]:
    """Ingress to every pod of the deployment: the Service's ports from the clients' pods, every port from the
    deployment's own pods (ssh, MPI, NCCL, Ray), the metrics port from the cluster's Prometheus; nothing else."""
    lab = labels(recipe)
    client: dict[str, Any] = {"podSelector": {"matchLabels": dict(fence.clients)}}
    if fence.client_namespaces is not None:
        client["namespaceSelector"] = {"matchLabels": dict(fence.client_namespaces)}
    serving = [{"protocol": "TCP", "port": p} for n, p in launch.ports.items() if n != "metrics"]
    ingress: list[dict[str, Any]] = [
        {"from": [client], "ports": serving},
        {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": lab["app.kubernetes.io/name"]}}}]},
    ]
    if launch.metrics_path is not None:
        port = launch.ports.get("metrics", launch.ports["http"])
        ingress.append({"from": [{"namespaceSelector": {"matchLabels": dict(fence.prometheus_namespace)},
                                  "podSelector": {"matchLabels": dict(fence.prometheus)}}],
                        "ports": [{"protocol": "TCP", "port": port}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": k8s_name(recipe, "fence"), "labels": lab},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": lab["app.kubernetes.io/name"]}},
                     "policyTypes": ["Ingress"], "ingress": ingress}}


def objects(recipe: Recipe, launch: Launch, sizing: Sizing, fence: Fence | None = None) -> list[dict[str, Any]]:
    """Every object of the deployment, in apply order (PVC, loader pod, workload, Service, NetworkPolicy)."""
    name, lab = k8s_name(recipe), labels(recipe)
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": k8s_name(recipe, "models"),
                                                                             "labels": lab},
           "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": f"{sizing.storage_gib}Gi"}}}}
    # root (it writes the volume), every capability dropped: `kubectl cp --no-preserve` needs no chown
    loader = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": k8s_name(recipe, "loader"), "labels": lab},
              "spec": {"containers": [{"name": "loader", "image": launch.image, "command": ["sleep", "infinity"],
                                       "volumeMounts": [{"name": "models", "mountPath": MODELS_MOUNT}],
                                       "securityContext": container_security()}],
                       "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": k8s_name(recipe, "models")}}],
                       "automountServiceAccountToken": False, "enableServiceLinks": False,
                       "securityContext": pod_security(False), "restartPolicy": "Never"}}
    service_ports = [{"name": n, "port": p, "targetPort": p} for n, p in launch.ports.items()]
    if not launch.multi_node:
        pod_labels = {**lab, "app.kubernetes.io/component": "server"}
        main = _container("server", launch, sizing, single_command(launch), True, False, probes(recipe, launch),
                          _key_env(recipe, launch))
        workload: dict[str, Any] = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": lab},
            "spec": {"replicas": sizing.replicas, "selector": {"matchLabels": pod_labels},
                     "template": {"metadata": {"labels": pod_labels, "annotations": _annotations(launch)},
                                  "spec": _pod_spec(recipe, [main], False, launch.non_root)}}}
        selector = pod_labels
    else:
        ssh = launch.uses_ssh
        leader = _container("leader", launch, sizing, ["bash", "-c", leader_script(launch, sizing)], True, ssh,
                            probes(recipe, launch), _key_env(recipe, launch))
        worker = _container("worker", launch, sizing, ["bash", "-c", worker_script(launch)], False, ssh)
        workload = {
            "apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": {"name": name, "labels": lab},
            "spec": {"replicas": sizing.replicas, "startupPolicy": "LeaderCreated",
                     "leaderWorkerTemplate": {
                         "size": sizing.nodes_per_replica, "restartPolicy": "RecreateGroupOnPodRestart",
                         "leaderTemplate": {"metadata": {"labels": {**lab, "role": "leader"},
                                                         "annotations": _annotations(launch)},
                                            "spec": _pod_spec(recipe, [leader], ssh, launch.non_root)},
                         "workerTemplate": {"metadata": {"labels": {**lab, "role": "worker"}},
                                            "spec": _pod_spec(recipe, [worker], ssh, launch.non_root)}}}}
        selector = {LWS_NAME_LABEL: name, "role": "leader"}
    # not the LWS's own name: LeaderWorkerSet makes a headless Service of that name for the pods' DNS records
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": k8s_name(recipe, "api"), "labels": lab},
               "spec": {"type": "ClusterIP", "selector": selector, "ports": service_ports}}
    return [pvc, loader, workload, service, network_policy(recipe, launch, fence or Fence())]
