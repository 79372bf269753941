"""The README.md `trtkv deploy` writes beside the files: the commands to apply them (upload, load,
apply, reach the server), each sizing figure and probe explained, what is fenced and what is not,
and what was checked or never run."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from trtkv.core.apikey import API_KEY_ENV
from trtkv.deploy import dynamo, k8s, loader, pods, resources, slurm
from trtkv.deploy.launch import SSH_PORT, SSH_WAIT_S, Launch
from trtkv.deploy.sizing import Sizing
from trtkv.recipe import Recipe

q = shlex.quote  # every value a shell line of the README names

if TYPE_CHECKING:
    from trtkv.deploy import Models, Options


def _clients_line() -> str:
    return (
        "trtkv's clients (`trtkv bench`, `trtkv status`, the canary, the AIPerf/GenAI-Perf "
        f"cross-checks) send the key of `${API_KEY_ENV}` when it is set (`export "
        f"{API_KEY_ENV}=$(cat trtkv-api-key)`); it is read from the environment, never written "
        "into these files, logs or results."
    )


def _bench_line(recipe: Recipe, lch: Launch, host: str, offset: int = 0) -> str:
    """`trtkv bench` against `host`: Triton's gRPC port, or the OpenAI server's HTTP port."""
    if lch.triton:
        return f"trtkv bench {q(recipe.name)} --url {host}:{lch.ports['grpc'] + offset}"
    return (
        f"trtkv bench {q(recipe.name)} --protocol openai --url {host}:{lch.ports['http'] + offset}"
    )


def _upload(recipe: Recipe, models: Models, ns: str) -> list[str]:
    src = models.source
    secret = k8s.k8s_name(recipe, "loader")
    lines = [
        f"# 1. the folders the server reads, from this machine to {src.uri} (they mirror "
        f"/models/{recipe.name}/)"
    ]
    lines += loader.upload_lines(src, models.folders)
    hint = {
        loader.SourceKind.S3: "--from-file=credentials=$HOME/.aws/credentials "
        "--from-file=config=$HOME/.aws/config",
        loader.SourceKind.GS: "--from-file=key.json=<service-account key>",
        loader.SourceKind.HF: "--from-file=token=<a file holding the hub token>",
    }.get(src.kind)
    if hint:
        lines.append(
            f"# optional (else the node's or pod's cloud identity): kubectl -n {q(ns)} create "
            f"secret generic {q(secret)} {hint}"
        )
    return lines


def _apply_lines(
    recipe: Recipe, out: Path, models: Models, options: Options, first: str
) -> list[str]:
    ns = options.namespace
    job = k8s.k8s_name(recipe, f"load-{models.load_id[:8]}")
    return [
        "```bash",
        f"kubectl create namespace {q(ns)}   # once",
        *_upload(recipe, models, ns),
        "# 2. the models volume and the Job that fills it (a new build: a new Job name, the old "
        "one finished)",
        f"kubectl apply -f {q(str(out / 'models.yaml'))}",
        f"kubectl -n {q(ns)} wait --for=condition=complete {q('job/' + job)} "
        f"--timeout={loader.JOB_DEADLINE_S}s",
        first,
    ]


def k8s_body(
    recipe: Recipe, lch: Launch, sizing: Sizing, out: Path, models: Models, options: Options
) -> list[str]:
    ns, api = options.namespace, k8s.k8s_name(recipe, "api")
    lines = ["## Apply", "", *_apply_lines(recipe, out, models, options, "# 3. the server")]
    if lch.keyed:
        lines += [
            "umask 077; openssl rand -hex 32 > trtkv-api-key   # the key clients send "
            f"(${API_KEY_ENV})",
            f"kubectl -n {q(ns)} create secret generic {q(k8s.k8s_name(recipe, 'key'))} "
            f"--from-file={k8s.KEY_SECRET_FIELD}=trtkv-api-key",
        ]
    if lch.uses_ssh and lch.multi_node:  # one node: no ssh between pods
        lines += [
            "ssh-keygen -q -t ed25519 -N '' -C trtkv-client -f trtkv-ssh       # the key mpirun "
            "logs in with",
            "ssh-keygen -q -t ed25519 -N '' -C trtkv-host -f trtkv-ssh-host   # every pod's sshd "
            "host key",
            f"echo \"{k8s.known_hosts_pattern(recipe)} $(cut -d' ' -f1,2 trtkv-ssh-host.pub)\" > "
            "trtkv-known_hosts",
            f"kubectl -n {q(ns)} create secret generic {q(k8s.k8s_name(recipe, 'ssh'))} "
            "--from-file=id_ed25519=trtkv-ssh --from-file=authorized_keys=trtkv-ssh.pub "
            "--from-file=ssh_host_ed25519_key=trtkv-ssh-host "
            "--from-file=known_hosts=trtkv-known_hosts",
        ]
    lines += [f"kubectl apply -f {q(str(out / 'server.yaml'))}", "```", ""]
    if lch.multi_node:
        lines += [
            f"One replica spans {sizing.nodes_per_replica} nodes: a LeaderWorkerSet (install the "
            f"LWS controller, v0.10.0 schema) of size {sizing.nodes_per_replica}; the leader pod "
            "runs "
            + (
                f"the Ray head and {lch.label}, the workers join its Ray cluster."
                if lch.ray_worker
                else f"{lch.label} with {lch.dp_local} of the replica's attention-DP ranks and "
                "coordinates them (--data-parallel-address, --data-parallel-rpc-port); each worker "
                f"pod runs {lch.dp_local} more, headless, from --data-parallel-start-rank "
                "(LWS_WORKER_INDEX x that count)."
                if lch.dp_worker
                else f"`mpirun` over all {sizing.gpus_per_replica} ranks through ssh on port "
                f"{SSH_PORT} (every pod runs sshd as the image's own user with the keys of Secret "
                f"{k8s.k8s_name(recipe, 'ssh')}; the image must contain openssh-server)."
            ),
            "",
        ]
    lines += [
        f"The storage class of PVC {k8s.k8s_name(recipe, 'models')} must offer ReadWriteMany (set "
        "`storageClassName` for your cluster); the server pods mount it read-only at /models and "
        f"wait (init container) for the loader's marker of load {models.load_id}.",
        "",
    ]
    lines += _reach_k8s(recipe, lch, ns, api) + _fit(recipe, lch, sizing)
    return lines + _k8s_security_lines(recipe, lch, options) + _canary_lines(lch)


def _reach_k8s(recipe: Recipe, lch: Launch, ns: str, service: str) -> list[str]:
    ports = " ".join(f"{p}:{p}" for n, p in lch.ports.items() if n != "metrics")
    return [
        "## Reaching the server",
        "",
        "The server binds 0.0.0.0 inside its pod (its own network namespace); clients never "
        f"address the pod but Service {service}: `{service}.{ns}.svc.cluster.local` from pods the "
        "NetworkPolicy admits (below), e.g. "
        f"`{_bench_line(recipe, lch, f'{service}.{ns}.svc.cluster.local')}` in such a pod. From a "
        "workstation, through the kubelet:",
        "",
        "```bash",
        f"kubectl -n {q(ns)} port-forward {q('service/' + service)} {ports}",
        _bench_line(recipe, lch, "127.0.0.1"),
        "```",
        "",
    ]


def _fit(recipe: Recipe, lch: Launch, sizing: Sizing) -> list[str]:
    res = resources.server_resources(sizing, lch.shm_gib, lch.host_tier_gib)
    budget = resources.startup_budget_s(recipe, sizing, SSH_WAIT_S if lch.multi_node else 0)
    canary = resources.canary_timeout_s(recipe, sizing)
    if lch.multi_node:
        roll = (
            "the LeaderWorkerSet's rolling update, one group at a time (maxUnavailable 1, maxSurge "
            "0: no spare GPUs needed; a group restarts whole)"
        )
    elif sizing.replicas == 1:
        roll = (
            "Recreate (one replica: an update never needs spare GPUs; the replica is down while "
            "it reloads)"
        )
    else:
        roll = (
            "RollingUpdate with maxSurge 0, maxUnavailable 1 (no spare GPUs needed), replicas "
            "spread over nodes"
        )
    if sizing.replicas > 1:
        roll += "; a PodDisruptionBudget lets a drain take one replica at a time"
    return [
        "## Placement, resources, probes, rollout",
        "",
        f"- Nodes labelled `{pods.GFD_PRODUCT}={pods.gpu_product(recipe)}` (GPU feature discovery; "
        f"the GPU the plan sized for), tolerating the `nvidia.com/gpu` taint; {res.gpus} GPU(s) "
        "per pod.",
        *resources.lines(recipe, sizing, res, budget, canary),
        f"- Liveness: GET {lch.live_path} on port {lch.ports['http']} (the engine's own, cheap: a "
        f"saturated but healthy server answers it) every {pods.LIVE_PERIOD_S} s, restart after "
        f"{pods.LIVE_FAILURES} misses.",
        f"- Rollout: {roll}.",
        "",
    ]


def _k8s_security_lines(recipe: Recipe, lch: Launch, options: Options) -> list[str]:
    fence = options.fence
    clients = k8s.label_selector(fence.clients)
    where = (
        f"in namespaces labelled `{k8s.label_selector(fence.client_namespaces)}`"
        if fence.client_namespaces is not None
        else "in the deployment's own namespace"
    )
    lines = [
        "## Security",
        "",
        f"- NetworkPolicy {k8s.k8s_name(recipe, 'fence')} admits to the server ports "
        f"({', '.join(str(p) for n, p in lch.ports.items() if n != 'metrics')}) only pods labelled "
        f"`{clients}` {where} (`--allow-from KEY=VALUE`, `--allow-namespace KEY=VALUE`), any port "
        "only from the deployment's own pods (ssh, MPI, NCCL, Ray), and "
        + (
            f"the metrics port {lch.ports.get('metrics', lch.ports['http'])} to pods "
            f"`{k8s.label_selector(fence.prometheus)}` in namespaces "
            f"`{k8s.label_selector(fence.prometheus_namespace)}` (`--prometheus`, "
            "`--prometheus-namespace`)."
            if lch.metrics_path
            else "no metrics port (the server has no Prometheus endpoint)."
        ),
        "  It is enforced only by a CNI that implements NetworkPolicy (Calico, Cilium, Antrea, "
        "...). Egress is not restricted (DNS names differ per cluster). `kubectl port-forward` "
        "reaches the pod through the kubelet.",
        lch.key_note,
    ]
    if lch.keyed:
        lines.append(
            f"- The key is Secret {k8s.k8s_name(recipe, 'key')} (`{k8s.KEY_SECRET_FIELD}`) mounted "
            "as a file (never a Secret in an environment variable); the server's shell reads it "
            "and refuses to start with an empty key. " + _clients_line()
        )
    lines += [
        f"- Every container: uid {lch.uid}, never root, a read-only root filesystem (HOME, /tmp "
        "and /dev/shm are emptyDirs), no privilege escalation, every capability dropped, the "
        "runtime's default seccomp profile, no service-account token, no service links; the "
        "models volume read-only.",
        "- checkov: the files pass checkov 3.3.30 with zero failed checks; the skips in the "
        "manifests (`checkov.io/skipN` annotations, each with its reason) are the ones "
        "docs/deploy.md lists.",
    ]
    if lch.uses_ssh and lch.multi_node:  # one node: no ssh between pods
        lines.append(
            f"- ssh between the pods checks the host key: one host key for every pod (Secret "
            f"{k8s.k8s_name(recipe, 'ssh')}), pinned by a known_hosts line for the LWS pods' names "
            f"`{k8s.known_hosts_pattern(recipe)}` (`StrictHostKeyChecking=yes`); key login only."
        )
    return lines + [""]


def dynamo_body(
    recipe: Recipe, lch: Launch, sizing: Sizing, out: Path, models: Models, options: Options
) -> list[str]:
    ns = options.namespace
    lines = [
        "## Apply",
        "",
        "With the Dynamo platform (operator) installed in the namespace:",
        "",
        *_apply_lines(recipe, out, models, options, "# 3. the graph"),
        f"kubectl apply -f {q(str(out / 'agg.yaml'))}      # or disagg.yaml: prefill and decode "
        "workers",
        "```",
        "",
        f"Images: {dynamo.image(recipe)} (Dynamo {dynamo.DYNAMO_VERSION}). The disaggregated graph "
        f"starts as many prefill as decode workers ({sizing.replicas} each, so "
        f"{2 * sizing.total_gpus} GPUs: twice the sizing above); tune the split to your traffic "
        "(prefill-heavy: long prompts).",
        "",
        "## Reaching the server",
        "",
        "The Dynamo operator makes a Service for the frontend (OpenAI API on port "
        f"{dynamo.FRONTEND_PORT}); from a workstation: `kubectl -n {ns} port-forward service/<the "
        f"frontend Service> {dynamo.FRONTEND_PORT}`, then `trtkv bench {recipe.name} --protocol "
        f"openai --url 127.0.0.1:{dynamo.FRONTEND_PORT}`.",
        "",
    ]
    return lines + _fit(recipe, lch, sizing)[:-2] + [""]


def slurm_body(recipe: Recipe, lch: Launch, sizing: Sizing, out: Path) -> list[str]:
    pack = slurm.packing(sizing)
    job = shlex.quote(str(out / slurm.JOB_SCRIPT))
    lines = [
        "## Run",
        "",
        "The artifacts must sit on a filesystem every node sees, under `$TRTKV_ENGINES` and "
        "`$TRTKV_TRITON_REPO` (the same variables trtkv reads; default: this machine's paths), as "
        "must this folder (`$TRTKV_SLURM_DIR`). pyxis mounts each folder the server reads "
        f"read-only at its canonical container path under /models/{recipe.name}/.",
        "",
        "```bash",
        *([f"sbatch {job}"] * min(pack.jobs, 3)),
        "```",
        "",
    ]
    if pack.jobs > 3:
        lines += [f"... {pack.jobs} submissions in all.", ""]
    if pack.instances > 1:
        last = sizing.replicas - (pack.jobs - 1) * pack.instances
        lines += [
            f"Each job packs {pack.instances} replicas of {sizing.gpus_per_replica} GPUs on one "
            f"node (each its own job step, `srun --exact --gpus={sizing.gpus_per_replica}`) and "
            f"asks for exactly those {pack.gpus_per_node} GPUs, CPU and memory per GPU, no "
            "--exclusive (Slurm may place other jobs on GPUs it does not hold)"
            + f". Instance i serves on the recipe's ports + {slurm.PORT_STRIDE} x i.",
            "",
        ]
        if last != pack.instances:
            lines += [
                f"The last submission runs {last}: `TRTKV_INSTANCES={last} sbatch "
                f"--gpus-per-node={last * sizing.gpus_per_replica} {job}` (the job refuses to hold "
                "a GPU it does not use).",
                "",
            ]
    else:
        lines += [
            f"Each job holds {pack.nodes} whole node(s) (--exclusive; every GPU runs a rank).",
            "",
        ]
    lines += [
        "Each job runs `srun --mpi=pmix` with one task per rank (vLLM across nodes: one per node, "
        f"Ray) in `{lch.image}` (pyxis/enroot `--container-image`; `TRTKV_IMAGE=...` overrides "
        f"it). Server: {lch.server}.",
        "",
        "## Reaching the server",
        "",
        "The server binds every interface of its node; the job prints each instance's URL "
        f"(`http://<node>:<port>`). From a login node: `{_bench_line(recipe, lch, '<node>')}`.",
        "",
    ]
    return lines + _slurm_security_lines(lch) + _canary_lines(lch)


def _slurm_security_lines(lch: Launch) -> list[str]:
    lines = [
        "## Security",
        "",
        "- The server binds every interface of its nodes: anyone on the cluster network reaches "
        "it. Slurm fences nothing; use your site's firewall or a gateway.",
        lch.key_note,
    ]
    if lch.keyed:
        lines.append(
            f"- `{slurm.JOB_SCRIPT}` refuses to start without `${API_KEY_ENV}` (export it before "
            "`sbatch`; `--export=ALL` hands it to the tasks). " + _clients_line()
        )
    lines.append(
        "- The artifacts and this folder are mounted read-only (`:ro`) into the container."
    )
    return lines + [""]


def _canary_lines(lch: Launch) -> list[str]:
    return [
        "## Health check (the readiness probe's canary)",
        "",
        "```python",
        lch.canary.rstrip(),
        "```",
        "",
    ]


def readme_text(
    recipe: Recipe, target: str, sizing: Sizing, body: list[str], checked: list[str]
) -> str:
    from trtkv.deploy.check import CRD_SCHEMAS, KUBERNETES_VERSION, crd_schema_info

    lines = [
        f"# {recipe.name} on {target}",
        "",
        f"{recipe.description} (the recipe file's description; the "
        f"sizing below is this run's, overrides included: TP{recipe.build.tp_size} x "
        f"PP{recipe.build.pp_size} on {recipe.hardware.count} x {recipe.hardware.gpu.value})",
        "",
        f"Generated by `trtkv deploy {recipe.name} --target {target}`; regenerate instead of "
        "editing.",
        "",
        "## Sizing (trtkv plan)",
        "",
        *sizing.lines(),
        "",
        *body,
        "## What was checked here",
        "",
    ]
    lines += [f"- {c}" for c in checked]
    if target != "slurm":
        lines += [
            "- core objects and every object's metadata: kubernetes-validate, Kubernetes "
            f"{KUBERNETES_VERSION}, strict (unknown fields are errors); the container scripts "
            "(`bash -c`, `sh -c`) with `bash -n`",
            "- not evaluated: the CRDs' CEL rules (x-kubernetes-validations) and the controllers' "
            "admission webhooks",
        ]
        for (api, kind), file in CRD_SCHEMAS.items():
            lines.append(f"- {kind} ({api}): {crd_schema_info(file)['source']}")
    lines += [
        "",
        "Never run: no cluster, no GPU and no scheduler were available where these files were "
        "written; the loader Job, the probes' timings, the non-root read-only containers and the "
        "launches follow the upstream projects' documented behaviour and sources (docs/deploy.md "
        "says which).",
        "",
    ]
    return "\n".join(lines)
