"""`trtkv stop`, `status` and the supervisor act only on what a record proves is trtkv's (issue 42, items 1, 2, 7, 8):
a pid whose start time or command line and marker do not match is never signalled, a record's files are trusted only
inside the serve/ folder, a container docker kept keeps its record, and `stop` returns only once every process of the
session is gone, with an error naming what is left. Real throwaway processes; docker is a fake script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtkv.cli import main
from trtkv.contracts.artifacts import ServerRecord, SupervisorRecord
from trtkv.core import sessions
from trtkv.core.errors import StageError
from trtkv.recipe import load_recipe
from trtkv.recipe.layout import serve_dir
from trtkv.serving import health, launch, serve, supervisor_state, teardown

RECIPE = "smollm2_fp8kv"


def _live(pid: int) -> bool:
    found = sessions.stat(pid)
    return found is not None and found[0] not in ("Z", "X")


@pytest.fixture()
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """Another program in a session of its own (another user's `sleep`): never trtkv's to end."""
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    deadline = time.monotonic() + 10
    while sessions.cmdline(proc.pid) != ["sleep", "120"] and time.monotonic() < deadline:
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def _record(pid: int, **fields: object) -> ServerRecord:
    return ServerRecord(pid=pid, host="127.0.0.1", http_port=18991, grpc_port=18992, metrics_port=18993,
                        command=["tritonserver", "--model-repository=x"], log="/dev/null", model_repository="x",
                        started_at="now", **fields)  # type: ignore[arg-type]


def test_a_record_without_start_time_never_ends_another_program(engines_tmp: Path, stranger: subprocess.Popen[bytes],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Before: session_id without session_start made `stop` end the whole session of whatever the pid now ran."""
    recipe = load_recipe(RECIPE)
    _record(stranger.pid, session_id=stranger.pid).save(serve_dir(recipe))
    checks = health.check(recipe, canaries=0).checks
    assert checks["alive"] is False and "runs `sleep 120`" in checks["seen"]  # status: not the server, and why
    assert main(["stop", RECIPE]) == 2
    err = capsys.readouterr().err
    assert stranger.poll() is None and _live(stranger.pid)
    assert f"pid {stranger.pid} runs `sleep 120`" in err and f"ps -o pid,lstart,cmd -s {stranger.pid}" in err
    assert launch.server_json(recipe).exists()  # kept: the user decides


def test_an_old_record_is_proven_by_its_command_line_and_marker(engines_tmp: Path) -> None:
    recipe = load_recipe(RECIPE)
    marker = sessions.new_marker()
    code = "import time; time.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                            env={**os.environ, sessions.MARKER_ENV: marker})
    try:
        deadline = time.monotonic() + 10
        while sessions.marker_of(proc.pid) != marker and time.monotonic() < deadline:
            time.sleep(0.01)
        record = _record(proc.pid, session_id=proc.pid, session_marker=marker)
        wrong = record.model_copy(update={"command": [sys.executable, "-c", "other"]})
        assert not teardown.running(wrong) and teardown.running(record.model_copy(update={
            "command": [sys.executable, "-c", code]}))
        record.model_copy(update={"command": [sys.executable, "-c", code]}).save(serve_dir(recipe))
        assert serve.stop(recipe, timeout_s=5, log=lambda _m: None)
        assert proc.wait(5) is not None and not launch.server_json(recipe).exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_supervisor_record_of_another_program_is_not_signalled(engines_tmp: Path,
                                                                 stranger: subprocess.Popen[bytes]) -> None:
    """Before: supervisor.json holding only {"pid": N} made `stop` end N's session."""
    recipe = load_recipe(RECIPE)
    folder = serve_dir(recipe)
    folder.mkdir(parents=True)
    (folder / supervisor_state.SUPERVISOR_JSON).write_text(json.dumps({"pid": stranger.pid}))
    said: list[str] = []
    assert supervisor_state.stop(recipe, timeout_s=2, log=said.append) is False
    assert _live(stranger.pid) and "not the supervisor: not signalled" in said[0]
    SupervisorRecord(pid=stranger.pid, start_time=(sessions.start_time(stranger.pid) or 0) + 1).save(folder)
    assert supervisor_state.alive(recipe) is None and supervisor_state.stop(recipe, timeout_s=2, log=said.append) is False
    assert _live(stranger.pid)


def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "docker_calls.txt"
    script = bin_dir / "docker"
    script.write_text(f"#!{sys.executable}\nimport sys\nopen({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + "
                      f"'\\n')\nif sys.argv[1] in ('stop', 'rm'):\n    print('daemon busy', file=sys.stderr)\n"
                      f"    sys.exit({code})\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_a_container_docker_kept_keeps_its_record_and_foreign_files_are_untouched(
        tmp_path: Path, engines_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the file `cidfile` named was deleted wherever it was, and server.json removed although `docker stop`
    failed (the running container could never be stopped by trtkv again)."""
    calls = fake_docker(tmp_path, monkeypatch, code=1)
    recipe = load_recipe(RECIPE)
    victim = tmp_path / "precious.txt"
    victim.write_text("abc123\n")
    folder = serve_dir(recipe)
    folder.mkdir(parents=True)
    os.mkfifo(folder / "container.cid")  # a FIFO where the id should be: never read (it would block)
    for cidfile in (str(victim), str(folder / "container.cid")):
        _record(os.getpid() + 10**6 % 7, container="trtkv-smollm2_fp8kv", cidfile=cidfile).save(folder)
        serve.stop(recipe, timeout_s=1, log=lambda _m: None)
        assert victim.read_text() == "abc123\n"
    # no id read: the container is found by name only, and nothing proves it this checkout's (issue 48): untouched
    assert [c for c in calls.read_text().splitlines() if c.split()[0] in ("stop", "rm")] == []
    (folder / "container.cid").unlink(missing_ok=True)
    (folder / "container.cid").write_text("a" * 64 + "\n")
    _record(os.getpid() + 10**6 % 7, container="trtkv-smollm2_fp8kv", cidfile=str(folder / "container.cid")).save(folder)
    with pytest.raises(StageError, match=r"container a{64}: .*daemon busy.*Kept .*server\.json"):
        serve.stop(recipe, timeout_s=1, log=lambda _m: None)
    assert launch.server_json(recipe).exists() and f"stop -t 1 {'a' * 64}" in calls.read_text()  # by its id
    _record(os.getpid(), container="--all", cidfile=None).save(folder)
    with pytest.raises(StageError, match="not a docker name or id"):
        serve.stop(recipe, timeout_s=1, log=lambda _m: None)
    assert "--all" not in calls.read_text()


API_SERVER = r"""
import os, signal, subprocess, sys, time
ready = "; print('ready', flush=True); time.sleep(600)"
slow = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(0)))" + ready
deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)" + ready
kids = [subprocess.Popen([sys.executable, "-c", c], stdout=subprocess.PIPE) for c in (slow, deaf)]
for k in kids:
    k.stdout.readline()  # it has set its handler (a fixed sleep was too short for two interpreters on a busy CPU)
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(600)
"""


def test_stop_returns_only_when_the_whole_session_is_gone(engines_tmp: Path, tmp_path: Path) -> None:
    """The API server is SIGKILLed alone; its engine (slow to exit on SIGTERM, as vLLM's EngineCore) and a worker
    that ignores SIGTERM stay in its session. `stop` returns only when both are gone: after the engine's 2 s
    shutdown, the worker SIGKILLed at the bound; then an error naming what cannot be ended (EPERM here)."""
    recipe = load_recipe(RECIPE)
    log = tmp_path / "server.out"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", API_SERVER], stdout=out, start_new_session=True,
                                env={**os.environ, sessions.MARKER_ENV: "m" * 32})
    deadline = time.monotonic() + 30
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    engine, worker = map(int, log.read_text().split())
    session = sessions.Session(proc.pid, sessions.start_time(proc.pid), "m" * 32)
    _record(proc.pid, session_id=proc.pid, session_start=session.leader_start,
            session_marker="m" * 32).save(serve_dir(recipe))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _live(engine) and _live(worker)
    start = time.monotonic()
    said: list[str] = []
    assert serve.stop(recipe, timeout_s=3, log=said.append)
    took = time.monotonic() - start
    assert not _live(engine) and not _live(worker), "stop returned while processes of the session still ran"
    assert not sessions.members(session)
    assert 2.0 <= took < 3 + sessions.KILL_WAIT_S + 2, took  # waited for the engine; SIGKILL at the bound
    assert any("cleaned: 2 processes" in line for line in said), said


def test_stop_of_a_container_waits_for_every_process_of_it(tmp_path: Path, engines_tmp: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`docker stop` returns once the container's first process (the API server) is gone, while its engine and
    worker are still exiting (before: `trtkv stop` returned then, and `stop && serve` raced the old engine for the
    GPU and its ports). Here a fake docker lists real processes (`docker top`) and `docker stop` kills only the
    first; `stop` returns once all are gone: the engine after its 2 s shutdown, the worker SIGKILLed at the bound."""
    log = tmp_path / "container.out"
    with log.open("wb") as out:
        api = subprocess.Popen([sys.executable, "-c", API_SERVER], stdout=out, start_new_session=True)
    deadline = time.monotonic() + 30
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    engine, worker = map(int, log.read_text().split())
    pids = tmp_path / "pids"
    pids.write_text(f"{api.pid} {engine} {worker}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        f"#!{sys.executable}\nimport os, signal, sys\npids = open({str(pids)!r}).read().split()\n"
        "if sys.argv[1] == 'top':\n    print('PID'); print('\\n'.join(pids))\n"
        "elif sys.argv[1] == 'stop':\n    os.kill(int(pids[0]), signal.SIGKILL)\n")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    recipe = load_recipe(RECIPE)
    client = subprocess.Popen(["sleep", "120"], start_new_session=True)  # the `docker run` client
    try:
        serve_dir(recipe).mkdir(parents=True)
        (serve_dir(recipe) / "container.cid").write_text("b" * 64)  # the id `docker run --cidfile` wrote
        _record(client.pid, session_id=client.pid, session_start=sessions.start_time(client.pid),
                container="trtkv-smollm2_fp8kv", cidfile=str(serve_dir(recipe) / "container.cid")
                ).save(serve_dir(recipe))
        start = time.monotonic()
        assert serve.stop(recipe, timeout_s=3, log=lambda _m: None)
        took = time.monotonic() - start
        api.wait(5)
        assert not _live(engine) and not _live(worker) and not _live(client.pid), "stop returned before the end"
        assert 2.0 <= took < 3 + 2 * sessions.KILL_WAIT_S + 5, took
    finally:
        for pid in (engine, worker):
            if _live(pid):
                os.kill(pid, signal.SIGKILL)
        client.kill()
        client.wait()


def test_stop_names_the_survivors_and_keeps_the_record(engines_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    recipe = load_recipe(RECIPE)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        _record(proc.pid, session_id=proc.pid, session_start=sessions.start_time(proc.pid)).save(serve_dir(recipe))
        real = sessions.KILL

        def deny(pid: int, sig: int) -> None:
            if pid == proc.pid and sig:
                raise PermissionError(1, "Operation not permitted")
            real(pid, sig)

        monkeypatch.setattr(sessions, "KILL", deny)
        monkeypatch.setattr(sessions, "KILL_WAIT_S", 0.3)
        assert main(["stop", RECIPE, "--timeout", "0.3"]) == 2
        err = capsys.readouterr().err
        assert f"pid {proc.pid} (EPERM)" in err and "Kept" in err and launch.server_json(recipe).exists()
    finally:
        proc.kill()
        proc.wait()


RECORD = b'"host": "h", "http_port": 1, "grpc_port": 1, "metrics_port": 1, "command": [], "log": "", ' \
         b'"model_repository": "", "started_at": ""'


@pytest.mark.parametrize("text", [b'{"pid": 100000000000000000000, ' + RECORD + b"}",
                                  b'{"pid": 1e20, ' + RECORD + b"}",
                                  b'{"pid": 12, "host": "\xff\xfe"}', b"[1, 2]", b'{"pid": NaN}'])
def test_a_damaged_server_record_is_one_error_line(engines_tmp: Path, capsys: pytest.CaptureFixture[str],
                                                   text: bytes) -> None:
    """Before: a pid of 1e20 (OverflowError) or a non-UTF-8 record (UnicodeDecodeError) crashed status and stop."""
    recipe = load_recipe(RECIPE)
    folder = serve_dir(recipe)
    folder.mkdir(parents=True)
    (folder / "server.json").write_bytes(text)
    for verb in ("status", "stop"):
        assert main([verb, RECIPE]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "server.json" in err and "Traceback" not in err


def test_events_that_are_not_objects_are_left_out(engines_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = load_recipe(RECIPE)
    folder = serve_dir(recipe)
    folder.mkdir(parents=True)
    good = {"time": "2026-12-02T10:00:00+0000", "event": "healthy"}
    (folder / supervisor_state.EVENTS).write_bytes(b'[1, 2]\n"text"\n\xff\xfe\n{"event": 3}\n' + json.dumps(good).encode()
                                            + b"\n{half")
    assert supervisor_state.read_events(recipe) == [good]
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        _record(proc.pid, session_id=proc.pid, session_start=sessions.start_time(proc.pid)).save(folder)
        assert main(["status", RECIPE]) == 1  # alive, not ready: degraded or down, said in lines, no traceback
        assert "healthy" in capsys.readouterr().out
    finally:
        proc.kill()
        proc.wait()
