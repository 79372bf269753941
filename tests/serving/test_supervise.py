"""The supervisor's decisions (trtkv.serving.supervise) with a scripted probe and a recording serve: a dead instance
restarts at once, a slow canary only twice in a row, restarts are bounded per window with growing back-off, and
every step is an event. The real thing (a killed stub on the real tritonserver) is the soak test in
tests/e2e/test_serve.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trtkv.core import sessions
from trtkv.recipe import load_recipe
from trtkv.serving import launch, readiness, serve, supervise, supervisor_state, teardown
from trtkv.serving.teardown import Stopped


class Script:
    def __init__(self, states: list[tuple[str, str]]) -> None:
        self.states = list(states)

    def __call__(self) -> tuple[str, str]:
        return self.states.pop(0) if self.states else ("healthy", "")


@pytest.fixture()
def sup(engines_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[supervise.Supervisor, list[str]]:
    recipe = load_recipe("smollm2_fp8kv")
    calls: list[str] = []
    ended = sessions.Cleanup(ended=[11, 12, 13])
    monkeypatch.setattr(teardown, "stop_server", lambda r, **kw: calls.append("stop") or Stopped(True, ended))
    monkeypatch.setattr(serve, "start", lambda r, **kw: calls.append("start") or None)
    s = supervise.Supervisor(recipe, interval_s=0.0, failures=2, max_restarts=2, backoff_s=0.01, log=lambda _m: None)
    (engines_tmp / recipe.name / "serve").mkdir(parents=True)
    return s, calls


def events(s: supervise.Supervisor) -> list[dict[str, Any]]:
    return supervisor_state.read_events(s.recipe, last=100)


def test_dead_instance_restarts_at_once_slow_canary_only_twice(sup: tuple[supervise.Supervisor, list[str]],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    s, calls = sup
    dead = ("dead", "Stub process 'tensorrt_llm_0_0' is not healthy.")
    slow = ("degraded", "TimeoutError: timed out")
    monkeypatch.setattr(s, "probe", Script([dead, ("healthy", ""), slow, ("healthy", ""), slow, slow]))
    assert s.run(rounds=6) == 0
    assert calls == ["stop", "start", "stop", "start"]  # the dead one at once; the slow one on its second miss
    kinds = [e["event"] for e in events(s)]
    assert kinds.count("restarting") == 2 and kinds.count("restarted") == 2
    restarting = [e for e in events(s) if e["event"] == "restarting"]
    assert [e["backoff_s"] for e in restarting] == [0.01, 0.02]  # doubling
    assert "is not healthy" in restarting[0]["cause"]
    record = json.loads(supervisor_state.record_path(s.recipe).read_text())
    assert record["state"] == "healthy" and record["restarts"] == 2


def test_it_restarts_only_after_the_old_session_is_empty_and_says_so(sup: tuple[supervise.Supervisor, list[str]],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    s, calls = sup
    monkeypatch.setattr(s, "probe", Script([("down", "the server process exited")]))
    assert s.run(rounds=1) == 0
    kinds = [e["event"] for e in events(s)]
    assert kinds[kinds.index("restarting"):] == ["restarting", "cleaned", "restarted"]
    cleaned = next(e for e in events(s) if e["event"] == "cleaned")
    assert cleaned["processes"] == 3 and cleaned["note"] == "cleaned: 3 processes"


def test_a_session_that_cannot_be_emptied_gives_up_instead_of_looping(
        sup: tuple[supervise.Supervisor, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    s, calls = sup
    stuck = sessions.Cleanup(ended=[11], left=["pid 12 (state D)"])
    monkeypatch.setattr(teardown, "stop_server", lambda r, **kw: calls.append("stop") or Stopped(False, stuck))
    monkeypatch.setattr(s, "probe", Script([("down", "the server process exited")] * 3))
    assert s.run(rounds=3) == 1
    assert calls == ["stop"]  # no start beside a process it could not end, and no second try
    kinds = [e["event"] for e in events(s)]
    assert kinds[-2:] == ["cleanup_failed", "gave_up"] and events(s)[-2]["left"] == ["pid 12 (state D)"]
    assert json.loads(supervisor_state.record_path(s.recipe).read_text())["state"] == "failed"


def test_restarts_are_bounded_then_it_gives_up(sup: tuple[supervise.Supervisor, list[str]],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    s, calls = sup
    monkeypatch.setattr(s, "probe", Script([("down", "the server process exited")] * 5))
    assert s.run(rounds=5) == 1
    assert calls.count("start") == 2
    last = events(s)[-1]
    assert last["event"] == "gave_up" and last["restarts_in_window"] == 2
    assert json.loads(supervisor_state.record_path(s.recipe).read_text())["state"] == "failed"


class _OpenAIServer:
    """A loopback HTTP server that answers /health and one-token /v1/completions, counting the completions."""

    def __init__(self) -> None:
        import http.server
        import threading

        owner = self
        self.completions = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._send(b"")

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.completions += 1
                self._send(json.dumps({"choices": [{"text": " Hi"}]}).encode())

            def log_message(self, *_a: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_quiet_while_measured_no_canaries_alive_and_ready_only(engines_tmp: Path) -> None:
    """A benchmark of the supervised server holds `supervise.quiet`: the supervisor's probes then send no inference
    (on vLLM CPU a canary step delays a measured first token by a whole step) and say so in the events; another
    server's address asks nothing; a holder that died is forgotten."""
    import os
    import subprocess
    import sys

    from trtkv.contracts.artifacts import ServerRecord
    from trtkv.recipe.layout import serve_dir

    recipe = load_recipe("smollm2_fp8kv_vllm")
    server = _OpenAIServer()
    try:
        folder = serve_dir(recipe)
        folder.mkdir(parents=True)
        ServerRecord(pid=os.getpid(), host="127.0.0.1", http_port=server.port, grpc_port=server.port, metrics_port=0,
                     command=[sys.executable], log="-", model_repository="-", started_at="now",
                     frontend="vllm", served_model_name=recipe.name, session_id=os.getpid(),
                     session_start=sessions.start_time(os.getpid())).save(folder)
        s = supervise.Supervisor(recipe, interval_s=0.0, log=lambda _m: None)
        s.save("healthy")  # this process stands in for the supervisor: alive() finds it
        assert s.probe() == ("healthy", "") and server.completions == 1  # one engine: one canary
        with supervise.quiet(recipe, "other bench", "127.0.0.1:1") as asked:
            assert not asked and not supervisor_state.quiet_holders(recipe)
        with supervise.quiet(recipe, "trtkv bench", f"127.0.0.1:{server.port}") as asked:
            assert asked
            assert s.probe() == ("healthy", "") and server.completions == 1  # alive and ready only
            assert s.probe() == ("healthy", "")
        assert s.probe() == ("healthy", "") and server.completions == 2
        kinds = [(e["event"], e.get("holders")) for e in events(s)]
        assert kinds == [("quiet", [f"trtkv bench (pid {os.getpid()})"]), ("canaries_resumed", None)]
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        stale = supervisor_state.quiet_dir(recipe) / f"{gone.stdout.strip()}.json"
        stale.write_text(json.dumps({"pid": int(gone.stdout), "command": [sys.executable], "who": "killed bench"}))
        assert supervisor_state.quiet_holders(recipe) == [] and not stale.exists()
    finally:
        server.httpd.shutdown()


OPENAI_STUB = r"""
import http.server, json, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._send(b"")
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(json.dumps({"choices": [{"text": " Hi"}]}).encode())
    def log_message(self, *a):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_killed_supervisor_leaves_the_server_unsupervised_then_attach_and_stop(
        engines_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fault: SIGKILL of the supervisor. Expected: the server keeps serving; `trtkv status` says "unsupervised";
    `trtkv serve` refuses with the command that re-attaches one; `--attach` does; `trtkv stop` ends both."""
    import os
    import signal
    import sys
    import time

    from trtkv.cli import main
    from trtkv.core.process import free_ports, port_in_use

    ports = free_ports(3)
    overrides = [f"triton.http_port={ports[0]}", f"triton.grpc_port={ports[1]}", f"triton.metrics_port={ports[2]}"]
    name = "smollm2_fp8kv_vllm"
    recipe = load_recipe(name, overrides)
    info = launch.start_server(recipe, [sys.executable, "-c", OPENAI_STUB, str(ports[0])], Path("hf"), dict(os.environ), 60,
                         lambda _m: None, name=readiness.VLLM, served_model=name)
    try:
        first = supervise.spawn(recipe, [name, *overrides], log=lambda _m: None)
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while supervisor_state.alive(recipe) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert supervisor_state.alive(recipe) is None and supervisor_state.orphaned(recipe) is not None
        capsys.readouterr()
        assert main(["status", name, *overrides]) == 0  # still serving
        out = capsys.readouterr().out
        assert f"{name}: healthy, unsupervised (pid {info.pid}" in out and f"supervisor (pid {first.pid}) is gone" in out
        assert main(["serve", name, *overrides]) != 0
        out = capsys.readouterr()
        assert f"trtkv serve {name} {' '.join(overrides)} --attach" in out.out + out.err
        assert main(["serve", name, *overrides, "--attach"]) == 0
        second = supervisor_state.alive(recipe)
        assert second is not None and second.pid != first.pid
        assert main(["stop", name, *overrides]) == 0
        assert supervisor_state.alive(recipe) is None and not supervisor_state.record_path(recipe).exists()
        assert not serve.running(info) and not port_in_use("127.0.0.1", ports[0])
    finally:
        serve.stop(recipe, timeout_s=5, log=lambda _m: None)
        supervisor_state.stop(recipe, timeout_s=5, log=lambda _m: None)


def test_events_are_never_written_through_a_planted_link(sup: tuple[supervise.Supervisor, list[str]],
                                                          tmp_path: Path) -> None:
    """events.jsonl is appended like the logs of serve/: a symbolic link at its name is refused, and the file it
    names is left as it was (an open("a") followed the link and appended to it)."""
    from trtkv.core.errors import StageError

    s, _ = sup
    victim = tmp_path / "victim.txt"
    victim.write_text("kept\n")
    supervisor_state.events_path(s.recipe).symlink_to(victim)
    with pytest.raises(StageError, match="symbolic link"):
        s.event("started")
    assert victim.read_text() == "kept\n"
