"""Kubernetes objects for a recipe, in one namespace (`--namespace`): the models PVC and the loader
Job that fills it (trtkv.deploy.loader); a Deployment when one replica fits on one node, else a
LeaderWorkerSet (one pod per node, the leader runs the multi-node launch); a PodDisruptionBudget
past one replica; a Service on the serving pods; a NetworkPolicy. Pod-level parts (placement,
resources, probes, security, the wait for the loader) are trtkv.deploy.pods'. GPU-bound replicas
roll out without spare GPUs: Recreate for one replica, maxSurge 0 past it. What the containers run
(the one-node command, the leader's and workers' scripts) is trtkv.deploy.k8s_commands'."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trtkv.core.errors import StageError
from trtkv.deploy import pods
from trtkv.deploy.k8s_commands import RAY_NODE_PORT, leader_script, single_command, worker_script
from trtkv.deploy.launch import SSH_PORT, Launch
from trtkv.deploy.resources import server_resources
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
DEFAULT_CLIENTS = "trtkv-client=true"
DEFAULT_PROMETHEUS = "app.kubernetes.io/name=prometheus"
DEFAULT_PROMETHEUS_NAMESPACE = "kubernetes.io/metadata.name=monitoring"
KEY_SECRET_FIELD = pods.KEY_SECRET_FIELD
DEFAULT_NAMESPACE = "trtkv"
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


def selector(text: str, option: str) -> dict[str, str]:
    """`KEY=VALUE[,KEY=VALUE...]` as matchLabels; StageError naming the option when a key or value
    is no label."""
    out: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise StageError(
                f"{option} {text!r}: {part.strip()!r} is not KEY=VALUE with a Kubernetes label key "
                "([prefix/]name, name 1-63 of letters, digits, '-', '_', '.') and value (0-63 of "
                f"the same). Next: e.g. {option} app=gateway (several: a=b,c=d)."
            )
        out[key] = value
    return out


@dataclass(frozen=True)
class Fence:
    """Who the NetworkPolicy admits: the Service's clients (pods of these labels, in this namespace
    or in the namespaces of `client_namespaces`), and the cluster's Prometheus to the metrics port;
    the group's own pods always."""

    clients: dict[str, str] = field(
        default_factory=lambda: selector(DEFAULT_CLIENTS, "--allow-from")
    )
    client_namespaces: dict[str, str] | None = None  # None: the deployment's own namespace
    prometheus: dict[str, str] = field(
        default_factory=lambda: selector(DEFAULT_PROMETHEUS, "--prometheus")
    )
    prometheus_namespace: dict[str, str] = field(
        default_factory=lambda: selector(DEFAULT_PROMETHEUS_NAMESPACE, "--prometheus-namespace")
    )


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def k8s_name(recipe: Recipe, suffix: str = "") -> str:
    """A DNS-1123 name: trtkv-<recipe>[-suffix], lower case, '_' and '.' as '-'."""
    base = f"trtkv-{recipe.name}".lower().replace("_", "-").replace(".", "-")
    return f"{base}-{suffix}" if suffix else base


def labels(recipe: Recipe) -> dict[str, str]:
    return {"app.kubernetes.io/name": k8s_name(recipe), "app.kubernetes.io/managed-by": "trtkv"}


def namespace_name(text: str) -> str:
    """`--namespace`: a DNS-1123 label, not `default` (the objects get a namespace of their own)."""
    if text == "default" or not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", text):
        raise StageError(
            f"--namespace {text!r}: use a namespace of the deployment's own, a DNS-1123 label "
            "(lower case, digits, '-', at most 63), not `default` (platform policies and checkov "
            f"CKV_K8S_21 refuse it). Next: e.g. --namespace {DEFAULT_NAMESPACE} (`kubectl create "
            f"namespace {DEFAULT_NAMESPACE}`)."
        )
    return text


def meta(
    recipe: Recipe,
    name: str,
    namespace: str,
    extra: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {**labels(recipe), **(extra or {})},
    }
    if annotations:
        out["annotations"] = annotations
    return out


def _annotations(launch: Launch) -> dict[str, str]:
    if launch.metrics_path is None:
        return {}
    port = launch.ports.get("metrics", launch.ports["http"])
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": launch.metrics_path,
    }


def _container(
    name: str, launch: Launch, sizing: Sizing, command: list[str], ssh: bool, extra: dict[str, Any]
) -> dict[str, Any]:
    ports = (
        [{"name": n, "containerPort": p} for n, p in launch.ports.items()]
        if name != "worker"
        else []
    )
    if ssh:
        ports += pods.ssh_ports()
    c: dict[str, Any] = {
        "name": name,
        "image": launch.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": pods.env(launch.keyed and name != "worker"),
        "resources": server_resources(sizing, launch.shm_gib, launch.host_tier_gib).k8s(),
        "volumeMounts": pods.mounts(ssh, launch.keyed and name != "worker", name != "worker"),
        "securityContext": pods.container_security(),
    }
    if ports:
        c["ports"] = ports
    return {**c, **extra}


def _pod_spec(
    recipe: Recipe,
    launch: Launch,
    containers: list[dict[str, Any]],
    ssh: bool,
    load_id: str,
    replicas: int,
    match: dict[str, str],
) -> dict[str, Any]:
    keyed = launch.keyed and containers[0]["name"] != "worker"
    return {
        "initContainers": [pods.wait_for_load(recipe, launch.image, load_id)],
        "containers": containers,
        "volumes": pods.volumes(
            k8s_name(recipe, "models"),
            launch,
            k8s_name(recipe, "ssh") if ssh else None,
            k8s_name(recipe, "key") if keyed else None,
            k8s_name(recipe, "canary") if containers[0]["name"] != "worker" else None,
        ),
        **pods.placement(recipe),
        **pods.spread(match, replicas),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pods.pod_security(launch.uid),
        "terminationGracePeriodSeconds": 60,
    }


def known_hosts_pattern(recipe: Recipe) -> str:
    """The known_hosts host pattern of every pod of the LeaderWorkerSet (LWS v0.10.0 DNS names:
    leader <lws>-<group>.<lws>.<namespace>, worker <lws>-<group>-<i>.<lws>.<namespace>) on the sshd
    port."""
    name = k8s_name(recipe)
    return f"[{name}-*.{name}.*]:{SSH_PORT}"


def network_policy(recipe: Recipe, launch: Launch, fence: Fence, namespace: str) -> dict[str, Any]:
    """Ingress to every pod of the deployment: the Service's ports from the clients' pods, every
    port from the deployment's own pods (ssh, MPI, NCCL, Ray), the metrics port from the cluster's
    Prometheus; nothing else."""
    serving = [p for n, p in launch.ports.items() if n != "metrics"]
    metrics = (
        launch.ports.get("metrics", launch.ports["http"])
        if launch.metrics_path is not None
        else None
    )
    return fence_policy(recipe, "fence", namespace, fence, serving, metrics)


def fence_policy(
    recipe: Recipe,
    suffix: str,
    namespace: str,
    fence: Fence,
    serving: list[int],
    metrics: int | None,
) -> dict[str, Any]:
    """The NetworkPolicy `<name>-<suffix>` admitting to the recipe's pods: the clients on the
    `serving` ports, the recipe's own pods on every port, Prometheus on the `metrics` port (None:
    not at all)."""
    own = {"app.kubernetes.io/name": labels(recipe)["app.kubernetes.io/name"]}
    client: dict[str, Any] = {"podSelector": {"matchLabels": dict(fence.clients)}}
    if fence.client_namespaces is not None:
        client["namespaceSelector"] = {"matchLabels": dict(fence.client_namespaces)}
    ingress: list[dict[str, Any]] = [
        {"from": [client], "ports": [{"protocol": "TCP", "port": p} for p in serving]},
        {"from": [{"podSelector": {"matchLabels": own}}]},
    ]
    if metrics is not None:
        prometheus = {
            "namespaceSelector": {"matchLabels": dict(fence.prometheus_namespace)},
            "podSelector": {"matchLabels": dict(fence.prometheus)},
        }
        ingress.append({"from": [prometheus], "ports": [{"protocol": "TCP", "port": metrics}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(recipe, k8s_name(recipe, suffix), namespace),
        "spec": {
            "podSelector": {"matchLabels": own},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def models_claim(recipe: Recipe, sizing: Sizing, namespace: str) -> dict[str, Any]:
    """The models volume: ReadWriteMany (the loader writes it, every server pod reads it)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta(recipe, k8s_name(recipe, "models"), namespace),
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": f"{sizing.storage_gib}Gi"}},
        },
    }


def _deployment(
    recipe: Recipe,
    launch: Launch,
    sizing: Sizing,
    load_id: str,
    namespace: str,
    image_skips: list[str],
) -> tuple[dict[str, Any], dict[str, str]]:
    pod_labels = {**labels(recipe), "app.kubernetes.io/component": "server"}
    main = _container(
        "server", launch, sizing, single_command(launch), False, pods.probes(recipe, launch, sizing)
    )
    strategy: dict[str, Any] = (
        {"type": "Recreate"}
        if sizing.replicas == 1
        else {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(
            recipe, k8s_name(recipe), namespace, annotations=pods.skip_annotations(*image_skips)
        ),
        "spec": {
            "replicas": sizing.replicas,
            "strategy": strategy,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": _annotations(launch)},
                "spec": _pod_spec(
                    recipe, launch, [main], False, load_id, sizing.replicas, pod_labels
                ),
            },
        },
    }, pod_labels


def _leader_worker_set(
    recipe: Recipe,
    launch: Launch,
    sizing: Sizing,
    load_id: str,
    namespace: str,
    image_skips: list[str],
) -> tuple[dict[str, Any], dict[str, str]]:
    name, lab, ssh = k8s_name(recipe), labels(recipe), launch.uses_ssh
    skips = pods.skip_annotations(*image_skips)
    worker_port = SSH_PORT if ssh else RAY_NODE_PORT
    # a headless vLLM DP node listens on no fixed port: its probes ask whether the server runs
    worker_probes = pods.process_probes() if launch.dp_worker else pods.tcp_probes(worker_port)
    leader = _container(
        "leader",
        launch,
        sizing,
        ["bash", "-c", leader_script(launch, sizing)],
        ssh,
        pods.probes(recipe, launch, sizing),
    )
    worker = _container(
        "worker",
        launch,
        sizing,
        ["bash", "-c", worker_script(launch)],
        ssh,
        worker_probes,
    )
    leaders = {LWS_NAME_LABEL: name, "role": "leader"}
    spec = {
        "replicas": sizing.replicas,
        "startupPolicy": "LeaderCreated",
        # LWS's own defaults, said: one group at a time, no surge
        "rolloutStrategy": {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
        },
        "leaderWorkerTemplate": {
            "size": sizing.nodes_per_replica,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": {
                "metadata": {
                    "labels": {**lab, "role": "leader"},
                    "annotations": {**_annotations(launch), **skips},
                },
                "spec": _pod_spec(recipe, launch, [leader], ssh, load_id, sizing.replicas, leaders),
            },
            "workerTemplate": {
                "metadata": {"labels": {**lab, "role": "worker"}, "annotations": skips},
                "spec": _pod_spec(recipe, launch, [worker], ssh, load_id, 1, {}),
            },
        },
    }
    lws = {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": meta(recipe, name, namespace),
        "spec": spec,
    }
    return lws, leaders


def objects(
    recipe: Recipe,
    launch: Launch,
    sizing: Sizing,
    load_id: str,
    namespace: str,
    fence: Fence | None = None,
) -> list[dict[str, Any]]:
    """The server's objects in apply order (the canary's ConfigMap, workload, PodDisruptionBudget
    past one replica, Service, NetworkPolicy); the PVC and loader Job are trtkv.deploy.loader's
    (models.yaml)."""
    skips = pods.image_skips([launch.image], launch.uid)
    if not launch.multi_node:
        workload, selector = _deployment(recipe, launch, sizing, load_id, namespace, skips)
        disruptable = selector
    else:
        workload, selector = _leader_worker_set(recipe, launch, sizing, load_id, namespace, skips)
        disruptable = {LWS_NAME_LABEL: k8s_name(recipe)}
    canary = k8s_name(recipe, "canary")
    out = [pods.canary_config_map(launch, canary, meta(recipe, canary, namespace)), workload]
    # one replica: a budget would block every node drain; past one, one replica at a time
    if sizing.replicas > 1:
        out.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": meta(recipe, k8s_name(recipe, "pdb"), namespace),
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": disruptable}},
            }
        )
    # not the LWS's own name: LeaderWorkerSet makes a headless Service of that name for the pods'
    # DNS records
    service_ports = [{"name": n, "port": p, "targetPort": p} for n, p in launch.ports.items()]
    out.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(recipe, k8s_name(recipe, "api"), namespace),
            "spec": {"type": "ClusterIP", "selector": selector, "ports": service_ports},
        }
    )
    return [*out, network_policy(recipe, launch, fence or Fence(), namespace)]
