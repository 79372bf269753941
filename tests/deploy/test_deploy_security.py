"""What the cluster files fence: a recipe name never runs in the Slurm scripts (executed here with srun stubbed), the
Kubernetes pods get a NetworkPolicy, no service-account token, never root, a read-only root filesystem, no privilege
escalation and no capabilities, Triton's admin APIs are keyed (checked against the real tritonserver), the key is a
Secret file and never written, and ssh pins the host key."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.planned import deploy, size
from trtkv.core.apikey import API_KEY_ENV, API_KEY_FILE_ENV, TRITON_KEY_HEADER, auth_headers
from trtkv.core.errors import StageError
from trtkv.deploy import Options, Target, k8s, k8s_commands, launch, pods, render, slurm
from trtkv.deploy.check import check_object
from trtkv.recipe import load_recipe

TP8_PP2 = ["build.tp_size=8", "build.pp_size=2", "hardware.count=16"]
OPTS = Options(model_source="s3://my-bucket/trtkv")
SENTINEL = "sentinel-9f86d081884c7d65"
HOSTILE = 'x\n$(touch PWNED1)\n`touch PWNED2`"; touch PWNED3; #\'$(touch PWNED4)'


def quiet(_m: str) -> None:
    pass


def docs(folder: Path) -> list[dict[str, Any]]:
    return [d for p in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "Pod":
        return [obj["spec"]]
    if obj["kind"] in ("Deployment", "Job"):
        return [obj["spec"]["template"]["spec"]]
    if obj["kind"] == "LeaderWorkerSet":
        t = obj["spec"]["leaderWorkerTemplate"]
        return [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]
    return []


@pytest.mark.parametrize("recipe_name,overrides", [("llama70b_fp8kv", TP8_PP2), ("llama70b_fp8kv_llmapi", []),
                                                   ("llama70b_fp8kv_llmapi", [*TP8_PP2, "build.backend=vllm"])])
def test_a_hostile_recipe_name_never_runs_in_the_slurm_scripts(tmp_path: Path, recipe_name: str, overrides: list[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader's name check and the folder check are bypassed on purpose (defence in depth): the scripts pass
    bash -n and, run with srun/scontrol stubbed and the server missing, create none of the payload's files."""
    from trtkv.core import paths

    monkeypatch.setattr(paths, "recipe_folder", lambda root, name: root / name)
    recipe = load_recipe(recipe_name, overrides)
    recipe._name = HOSTILE  # what a file of that stem gave before the loader checked names
    sizing = size(recipe)
    out = tmp_path / "slurm"
    files, _readme = render(recipe, Target.SLURM, sizing, out)
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
        subprocess.run(["bash", "-n", str(out / name)], check=True)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("srun", "scontrol"):
        (stubs / tool).write_text("#!/bin/sh\necho node1\n")
        (stubs / tool).chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", API_KEY_ENV: SENTINEL, "SLURM_JOB_NODELIST": "node1",
           "SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "TRTKV_HEAD": "node1"}
    job = subprocess.run(["bash", str(out / slurm.JOB_SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=30)
    assert job.returncode == 0, job.stderr
    assert "trtkv: x\n$(touch PWNED1)" in job.stdout  # the name is printed as text
    subprocess.run(["bash", str(out / slurm.RANK_SCRIPT)], cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert not list(tmp_path.glob("PWNED*"))
    assert "#SBATCH --job-name=trtkv-x--" in files[slurm.JOB_SCRIPT]  # folded to Slurm-safe characters


def test_slurm_mounts_are_read_only_and_the_key_is_required(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv", TP8_PP2)
    files, readme = render(recipe, Target.SLURM, size(recipe), tmp_path / "s")
    job, rank = files[slurm.JOB_SCRIPT], files[slurm.RANK_SCRIPT]
    assert '--container-mounts="$MOUNTS"' in job
    line = next(x for x in job.splitlines() if x.startswith("MOUNTS="))
    mounts = subprocess.run(["bash", "-c", line + '; echo "$MOUNTS"'], capture_output=True, text=True,
                            env={"ENGINES": "/e", "REPOSITORIES": "/r", "HERE": "/h"}, check=True).stdout.strip()
    assert all(m.endswith(":ro") and ":/models/llama70b_fp8kv/" in m for m in mounts.split(",")), mounts
    assert f': "${{{API_KEY_ENV}:?' in job
    assert f'--http-restricted-api={launch.RESTRICTED_APIS}:{TRITON_KEY_HEADER}="${API_KEY_ENV}"' in rank
    assert f'--grpc-restricted-protocol={launch.RESTRICTED_APIS}:{TRITON_KEY_HEADER}="${API_KEY_ENV}"' in rank
    assert rank.count("--http-restricted-api") == 2  # rank 0 and the others
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_NODELIST": "n"}
    proc = subprocess.run(["bash", "-c", job], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and f"export {API_KEY_ENV}" in proc.stderr


def test_docker_commands_mount_read_only_and_use_shm_size() -> None:
    from trtkv.backends import container

    recipe = load_recipe("llama70b_fp8kv")
    cmd = container.docker_command(recipe, Path("/r/triton_repo/x"))
    mounts = [cmd[i + 1] for i, t in enumerate(cmd) if t == "-v"]
    assert mounts and all(m.endswith(":ro") for m in mounts)
    assert "--shm-size=2g" in cmd and "--ipc=host" not in cmd
    serve = container.trtllm_serve_docker_command(load_recipe("llama70b_fp8kv_llmapi"))
    assert all(serve[i + 1].endswith(":ro") for i, t in enumerate(serve) if t == "-v") and "--ipc=host" not in serve


@pytest.mark.parametrize("recipe_name,overrides", [("llama70b_fp8kv", []), ("llama70b_fp8kv", TP8_PP2),
                                                   ("llama70b_fp8kv_llmapi", TP8_PP2),
                                                   ("llama70b_fp8kv_llmapi", ["build.backend=vllm"]),
                                                   ("llama70b_fp8kv_llmapi", [*TP8_PP2, "build.backend=vllm"])])
def test_every_pod_is_fenced_and_unprivileged(tmp_path: Path, recipe_name: str, overrides: list[str]) -> None:
    recipe = load_recipe(recipe_name, overrides)
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", log=quiet, options=OPTS)
    objs = docs(out)
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert check_object(policy) == []
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": k8s.k8s_name(recipe)}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"]["ingress"]
    assert rules[0]["from"] == [{"podSelector": {"matchLabels": {"trtkv-client": "true"}}}]  # the default clients
    assert rules[1] == {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": k8s.k8s_name(recipe)}}}]}
    specs = [s for o in objs for s in pod_specs(o)]
    assert len(specs) >= 2
    for spec in specs:
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        sec = spec["securityContext"]
        assert sec["seccompProfile"] == {"type": "RuntimeDefault"} and sec["runAsNonRoot"] is True
        assert sec["runAsUser"] > 0 and sec["runAsGroup"] > 0
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}  # none added
            assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
            assert "limits" in c["resources"] and "requests" in c["resources"]
            assert not any("valueFrom" in e for e in c.get("env", []))  # no Secret in an environment variable
            for m in c["volumeMounts"]:  # writable: the emptyDirs and, for the loader Job only, the models volume
                assert m.get("readOnly") or m["name"] in ("dshm", "home", "tmp") or c["name"] == "loader", m
    readme = (out / "README.md").read_text()
    assert "CNI that implements NetworkPolicy" in readme and "kubectl cp" not in readme
    assert "never root, a read-only root filesystem" in readme
    text = "\n".join(p.read_text() for p in out.iterdir())
    assert "StrictHostKeyChecking=no" not in text and "UserKnownHostsFile=/dev/null" not in text
    uid = 10001 if "build.backend=vllm" in overrides else 1000  # the NGC images' triton-server; any user for vLLM
    assert {s["securityContext"]["runAsUser"] for s in specs if s["containers"][0]["name"] != "loader"} == {uid}


def test_fence_inputs_and_their_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    out = tmp_path / "k8s"
    assert main(["deploy", "llama70b_fp8kv", "--target", "k8s", "--output", str(out), "--allow-from", "app=gateway",
                 "--model-source", "s3://my-bucket/trtkv",
                 "--allow-namespace", "team=web", "--prometheus-namespace", "kubernetes.io/metadata.name=obs"]) == 0
    (policy,) = [o for o in docs(out) if o["kind"] == "NetworkPolicy"]
    clients, own, prom = policy["spec"]["ingress"]
    assert clients["from"] == [{"podSelector": {"matchLabels": {"app": "gateway"}},
                                "namespaceSelector": {"matchLabels": {"team": "web"}}}]
    assert {p["port"] for p in clients["ports"]} == {8000, 8001}
    assert prom["ports"] == [{"protocol": "TCP", "port": 8002}]
    assert prom["from"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}
    assert prom["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    assert "`app=gateway` in namespaces labelled `team=web`" in (out / "README.md").read_text()
    capsys.readouterr()
    assert main(["deploy", "llama70b_fp8kv", "--target", "k8s", "--output", str(tmp_path / "b"),
                 "--model-source", "s3://my-bucket/trtkv", "--allow-from", "app=$(x)"]) == StageError.exit_code
    assert "--allow-from 'app=$(x)'" in capsys.readouterr().err and not (tmp_path / "b").exists()
    bad = k8s.objects(load_recipe("llama70b_fp8kv"), *_launch("llama70b_fp8kv"), "0123456789ab", "trtkv")[-1]
    bad["spec"]["ingres"] = bad["spec"].pop("ingress")  # the NetworkPolicy's schema is live, as the others'
    assert any("ingres" in p for p in check_object(bad))


def _launch(name: str, overrides: list[str] | None = None) -> tuple[launch.Launch, Any]:
    recipe = load_recipe(name, overrides or [])
    s = size(recipe)
    return launch.for_recipe(recipe, s), s


def test_the_key_comes_from_a_secret_and_is_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, SENTINEL)
    outs = [deploy(load_recipe("llama70b_fp8kv"), Target.K8S, tmp_path / "t", log=quiet, options=OPTS),
            deploy(load_recipe("llama70b_fp8kv", TP8_PP2), Target.K8S, tmp_path / "tm", log=quiet, options=OPTS),
            deploy(load_recipe("llama70b_fp8kv_llmapi", ["build.backend=vllm"]), Target.K8S, tmp_path / "v", log=quiet,
                   options=OPTS),
            deploy(load_recipe("llama70b_fp8kv", TP8_PP2), Target.SLURM, tmp_path / "s", log=quiet),
            deploy(load_recipe("llama70b_fp8kv_llmapi", TP8_PP2), Target.DYNAMO, tmp_path / "d", log=quiet,
                   options=OPTS)]
    for out in outs:
        for path in out.rglob("*"):
            if path.is_file():
                assert SENTINEL not in path.read_text(), path
    dep = next(o for o in docs(outs[0]) if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    triton = dep["containers"][0]
    # the key is a Secret mounted as a file (checkov CKV_K8S_35): the canary reads the file $TRTKV_API_KEY_FILE names
    assert {"name": "api-key", "secret": {"secretName": "trtkv-llama70b-fp8kv-key", "defaultMode": 0o440}} in dep["volumes"]
    assert {"name": API_KEY_FILE_ENV, "value": pods.KEY_FILE} in triton["env"]
    assert f'--http-restricted-api={launch.RESTRICTED_APIS}:{TRITON_KEY_HEADER}="${API_KEY_ENV}"' in triton["command"][2]
    assert triton["command"][2].startswith(f'{API_KEY_ENV}="$(cat {pods.KEY_FILE} 2>/dev/null)"; ')
    vllm = next(o for o in docs(outs[2]) if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert f'export VLLM_API_KEY="${API_KEY_ENV}"' in vllm["command"][2]
    assert "kubectl -n trtkv create secret generic trtkv-llama70b-fp8kv-key --from-file=api-key=trtkv-api-key" in \
        (outs[0] / "README.md").read_text()
    # no key file, or an empty one: the container refuses to start instead of serving unkeyed
    proc = subprocess.run(["bash", "-c", triton["command"][2]], env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and f"{API_KEY_ENV} is empty" in proc.stderr
    # with the Secret's file there (its path moved to a temporary folder), the key reaches the server's command line
    key = tmp_path / "api-key"
    key.write_text(SENTINEL + "\n")
    script = triton["command"][2].replace(pods.KEY_FILE, str(key)).replace("exec mpirun", "exec echo mpirun")
    ran = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and f"trtkv-api-key={SENTINEL}" in ran.stdout


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed")
def test_the_readme_known_hosts_line_pins_every_lws_pod(tmp_path: Path) -> None:
    """The README's secret step run as written (ssh-keygen, the known_hosts line) and OpenSSH's own matcher
    (`ssh-keygen -F`) on the names the leader hands mpirun."""
    recipe = load_recipe("llama70b_fp8kv", TP8_PP2)
    out = deploy(recipe, Target.K8S, tmp_path / "k8s", log=quiet, options=OPTS)
    readme = (out / "README.md").read_text().splitlines()
    steps = [line for line in readme if line.startswith(("ssh-keygen", "echo \"[", "umask"))]
    subprocess.run(["bash", "-ec", "\n".join(steps)], cwd=tmp_path, check=True, timeout=30)
    name = k8s.k8s_name(recipe)
    env = {"LWS_LEADER_ADDRESS": f"{name}-0.{name}.prod", "LWS_GROUP_SIZE": "2", "PATH": "/usr/bin:/bin"}
    hosts = subprocess.run(["bash", "-c", k8s_commands.WORKER_HOSTS.replace("{slots}", "8") + 'echo "$HOSTS"'], env=env,
                           capture_output=True, text=True, check=True).stdout.strip().split(",")
    for host in hosts:
        found = subprocess.run(["ssh-keygen", "-F", f"[{host.rsplit(':', 1)[0]}]:{launch.SSH_PORT}", "-f",
                                str(tmp_path / "trtkv-known_hosts")], capture_output=True)
        assert found.returncode == 0, host
    other = subprocess.run(["ssh-keygen", "-F", f"[evil-0.{name}x.prod]:{launch.SSH_PORT}", "-f",
                            str(tmp_path / "trtkv-known_hosts")], capture_output=True)
    assert other.returncode == 1
    lws = next(o for o in docs(out) if o["kind"] == "LeaderWorkerSet")
    script = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["command"][2]
    assert "StrictHostKeyChecking=yes" in script and f"UserKnownHostsFile={k8s_commands.SSH_KNOWN_HOSTS}" in script
    assert f"-h {k8s_commands.SSH_HOST_KEY}" in script and "ssh-keygen -A" not in script


def _tritonserver() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        return None
    exe = Path(spec.origin).parent / "tritonserver" / "bin" / "tritonserver"
    return exe if exe.is_file() else None


@pytest.mark.skipif(_tritonserver() is None, reason="the tritonserver bundled with nvidia-pytriton is not installed")
def test_real_tritonserver_keys_the_restricted_apis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags exactly as the deploy files write them, expanded by bash from $TRTKV_API_KEY: the model-repository
    and shared-memory APIs answer 403 without the key and 200 with trtkv's own headers; health stays open."""
    import socket

    exe = _tritonserver()
    assert exe is not None
    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    (tmp_path / "repo").mkdir()
    cmd = [str(exe), f"--model-repository={tmp_path / 'repo'}", "--http-address=127.0.0.1", f"--http-port={ports[0]}",
           "--grpc-address=127.0.0.1", f"--grpc-port={ports[1]}", "--allow-metrics=false", *launch.restricted_args()]
    libs = exe.parent.parent / "lib"
    env = {**os.environ, API_KEY_ENV: SENTINEL,
           "LD_LIBRARY_PATH": f"{libs}:{exe.parents[3] / 'nvidia_pytriton.libs'}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    log = tmp_path / "triton.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(["bash", "-c", "exec " + launch.shell_join(cmd)], env=env, stdout=fh,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{ports[0]}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/v2/health/live", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.3)

        def status(path: str, headers: dict[str, str]) -> int:
            req = urllib.request.Request(url + path, data=b"{}", headers=headers, method="POST")
            try:
                return int(urllib.request.urlopen(req, timeout=10).status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        assert status("/v2/repository/index", {}) == 403
        assert status("/v2/repository/index", {TRITON_KEY_HEADER: "wrong"}) == 403
        monkeypatch.setenv(API_KEY_ENV, SENTINEL)
        assert status("/v2/repository/index", auth_headers()) == 200
        assert status("/v2/systemsharedmemory/region/x/unregister", {}) == 403
        # the probes' endpoints (startup: ready, liveness: live) answer GET without the key
        for path in (launch.TRITON_READY, launch.TRITON_LIVE):
            assert urllib.request.urlopen(f"{url}{path}", timeout=5).status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert SENTINEL not in log.read_text()  # the server does not log the key
