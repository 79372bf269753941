"""A server's whole process session ends with it (trtkv.core.sessions, trtkv.serving.teardown, `trtkv stop`), on real throwaway
processes: a Python "server" that spawns a child with a grandchild and one child that calls os.setsid() (as Ray or a
vLLM worker may) but keeps the environment marker. Killing the leader leaves them running; `stop` ends them all, and
a process of ANOTHER session with the very same command line survives. An interrupted start cleans up the same way;
a process that cannot be ended (EPERM) is reported, not waited on forever; GPU memory is waited on with nvidia-smi."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trtkv.core import sessions
from trtkv.core.errors import ToolError
from trtkv.core.process import port_in_use
from trtkv.recipe import load_recipe
from trtkv.serving import launch, serve, teardown

FAKE_SERVER = r"""
import http.server, json, os, subprocess, sys, time
port, ready, pidfile = int(sys.argv[1]), sys.argv[2] == "ready", sys.argv[3]
nap = [sys.executable, "-c", "import time; time.sleep(600)"]
code = "import subprocess, sys, time; g = subprocess.Popen(%r); print(g.pid, flush=True); time.sleep(600)" % (nap,)
child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
grandchild = int(child.stdout.readline())
escaped = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])
while int(open(f"/proc/{escaped.pid}/stat").read().rsplit(")", 1)[1].split()[3]) != escaped.pid:
    time.sleep(0.01)
with open(pidfile + ".tmp", "w") as fh:
    json.dump({"leader": os.getpid(), "child": child.pid, "grandchild": grandchild, "setsid": escaped.pid}, fh)
os.replace(pidfile + ".tmp", pidfile)

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass

if ready:
    http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
time.sleep(600)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _recipe():  # noqa: ANN202 - Recipe
    return load_recipe("smollm2_fp8kv", [f"triton.http_port={_free_port()}", f"triton.grpc_port={_free_port()}",
                                         f"triton.metrics_port={_free_port()}"])


def _pids(pidfile: Path, timeout_s: float = 60.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while not pidfile.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pidfile} never appeared")
        time.sleep(0.05)
    return dict(json.loads(pidfile.read_text()))


def _live(pid: int) -> bool:
    found = sessions.stat(pid)
    return found is not None and found[0] not in ("Z", "X")


def _wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not _live(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture()
def other_session(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The same fake server with the same command line, in a session of its own (not the recipe's server)."""
    pidfile = tmp_path / "other.json"
    marker = sessions.new_marker()
    proc = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, "0", "idle", str(pidfile)], start_new_session=True,
                            env={**os.environ, sessions.MARKER_ENV: marker})
    pids = _pids(pidfile)
    session = sessions.Session(proc.pid, sessions.start_time(proc.pid), marker)
    yield {"proc": proc, "pids": pids, "session": session}
    sessions.stop_session(session, grace_s=2)
    proc.wait(10)


def test_stop_after_the_leader_was_killed_ends_the_whole_session_and_nothing_else(
        engines_tmp: Path, tmp_path: Path, other_session: dict[str, Any]) -> None:
    """Fault: SIGKILL of the server's main process. Expected: its child, grandchild and the setsid child keep
    running (what the issue saw: EngineCore and friends beside the dead API server) until `trtkv stop`, which ends
    them all and frees the port; the other session, same command lines, runs on."""
    recipe = _recipe()
    pidfile = tmp_path / "server.json"
    cmd = [sys.executable, "-c", FAKE_SERVER, str(recipe.triton.http_port), "ready", str(pidfile)]
    info = launch.start_server(recipe, cmd, Path("repo"), dict(os.environ), 60, lambda _m: None)
    pids = _pids(pidfile)
    assert info.session_id == info.pid == pids["leader"] and info.session_start == sessions.start_time(info.pid)
    assert sessions.marker_of(pids["setsid"]) == info.session_marker  # left the session, kept the marker
    assert sessions.members(teardown.session_of(info)) == sorted(pids.values())
    os.kill(info.pid, signal.SIGKILL)
    assert _wait_dead(info.pid)
    survivors = [pids[k] for k in ("child", "grandchild", "setsid")]
    assert all(_live(p) for p in survivors)  # the leak: nothing ends them when the leader dies
    said: list[str] = []
    assert serve.stop(recipe, timeout_s=5, log=said.append)
    assert not [p for p in survivors if _live(p)], said
    assert any("cleaned: 3 processes" in line for line in said), said
    assert not launch.server_json(recipe).exists() and not port_in_use("127.0.0.1", recipe.triton.http_port)
    other = other_session["pids"]
    assert all(_live(p) for p in other.values())  # another session with the same command lines survives
    assert sessions.members(other_session["session"]) == sorted(other.values())


def test_stop_of_a_live_server_ends_every_process_of_its_session(engines_tmp: Path, tmp_path: Path,
                                                                 other_session: dict[str, Any]) -> None:
    recipe = _recipe()
    pidfile = tmp_path / "server.json"
    cmd = [sys.executable, "-c", FAKE_SERVER, str(recipe.triton.http_port), "ready", str(pidfile)]
    launch.start_server(recipe, cmd, Path("repo"), dict(os.environ), 60, lambda _m: None)
    pids = _pids(pidfile)
    result = serve.stop_server(recipe, timeout_s=5, log=lambda _m: None)
    assert result is not None and result.was_running and result.cleanup.done
    assert sorted(result.cleanup.ended) == sorted(pids.values())
    assert not [p for p in pids.values() if _live(p)]
    assert all(_live(p) for p in other_session["pids"].values())


def test_an_interrupted_start_leaves_nothing_behind(engines_tmp: Path, tmp_path: Path) -> None:
    """Fault: Ctrl-C while the server starts (it never becomes ready). Expected: the start raises, and no process
    of its session (the setsid one included) and no server.json remain."""
    recipe = _recipe()
    pidfile = tmp_path / "server.json"
    cmd = [sys.executable, "-c", FAKE_SERVER, str(recipe.triton.http_port), "never", str(pidfile)]

    def interrupt(_signum: int, _frame: Any) -> None:
        if not pidfile.exists():  # not all spawned yet: interrupt a little later
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            return
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            launch.start_server(recipe, cmd, Path("repo"), dict(os.environ), 120, lambda _m: None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    pids = _pids(pidfile)
    assert not [p for p in pids.values() if _live(p)], pids
    assert not launch.server_json(recipe).exists()


def test_a_reused_leader_pid_is_not_the_old_session(other_session: dict[str, Any]) -> None:
    """A leader pid that now has another start time: the recorded session emptied before the pid came back, so
    none of that pid's session members are taken for it (only processes carrying the old marker would be)."""
    s = other_session["session"]
    stale = sessions.Session(s.sid, (s.leader_start or 0) + 1, marker=sessions.new_marker())
    assert sessions.members(stale) == [] and not sessions.leader_alive(stale)
    assert sessions.leader_alive(s)


def test_a_process_that_cannot_be_ended_is_reported_not_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        real = sessions.KILL

        def deny(pid: int, sig: int) -> None:
            if pid == proc.pid and sig:
                raise PermissionError(1, "Operation not permitted")
            real(pid, sig)

        monkeypatch.setattr(sessions, "KILL", deny)
        monkeypatch.setattr(sessions, "KILL_WAIT_S", 0.5)
        start = time.monotonic()
        result = sessions.stop_session(sessions.Session(proc.pid, sessions.start_time(proc.pid)), grace_s=0.5)
        assert not result.done and result.left == [f"pid {proc.pid} (EPERM)"]
        assert time.monotonic() - start < 5
    finally:
        proc.kill()
        proc.wait()


def test_gpu_memory_of_the_dead_session_is_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi (a fake here: no GPU) lists the dead pids for a while; the wait ends once they are gone, and a
    pid that never lets go ends the wait after the bound, saying which."""
    counter = tmp_path / "calls"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!{sys.executable}\nimport sys, pathlib\np = pathlib.Path({str(counter)!r})\n"
                   "n = int(p.read_text()) if p.exists() else 0\np.write_text(str(n + 1))\n"
                   "assert sys.argv[1:] == ['--query-compute-apps=pid,used_memory', '--format=csv,noheader']\n"
                   "print('4242, 10240 MiB' if n < 2 else '')\nprint('777, 500 MiB')\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    assert sessions.gpu_pids() == {4242: 10240, 777: 500}
    released, note = sessions.wait_gpu_released([4242], timeout_s=30, poll_s=0.01)
    assert released and "GPU memory free" in note and int(counter.read_text()) == 3  # seen once more, then gone
    released, note = sessions.wait_gpu_released([777], timeout_s=0.2, poll_s=0.05)
    assert not released and "pid 777 (500 MiB)" in note
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert sessions.wait_gpu_released([4242]) == (True, "no nvidia-smi here")


def test_a_docker_start_records_the_container_id_and_stop_ends_that_container(
        tmp_path: Path, engines_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`docker run --cidfile`: a start that fails half-way stops the container by its id (not only the client)."""
    calls = tmp_path / "docker_calls.txt"
    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n"
                      f"open({str(calls)!r}, 'a').write(' '.join(args[:1] + args[-1:]) + '\\n')\n"
                      "if args[0] == 'run':\n    open(args[args.index('--cidfile') + 1], 'w').write('abc123')\n"
                      "    sys.exit(125)\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{docker.parent}{os.pathsep}{os.environ['PATH']}")
    recipe = _recipe()
    with pytest.raises(ToolError, match="exited with code 125"):
        launch.start_server(recipe, ["docker", "run", "--name", "trtkv-x", "image"], Path("repo"), dict(os.environ), 20,
                      lambda _m: None, container="trtkv-x")
    assert calls.read_text().splitlines() == ["run image", "top pid", "stop abc123", "rm abc123"]
    assert not launch.server_json(recipe).exists()
