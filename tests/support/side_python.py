"""`run` is `subprocess.run([side_python, ...], capture_output=True, text=True)` for scripts run in a side venv
(vLLM's, SGLang's), served by one fork server per venv (tests/support/forkserver.py) that imported the engine once:
importing vLLM costs ~12 CPU-s, and eight test files each paid it. Every script still runs in a process of its own,
forked from an interpreter that has only imported modules; an environment that changes what an import does
(TRITON_INTERPRET) gets a plain subprocess instead."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("forkserver.py")
# what each side venv's scripts import: loaded once by the server (names its own tests use)
PRELOAD = {"vllm": ["torch", "vllm.engine.arg_utils", "vllm.entrypoints.launchers.cli_args",
                    "vllm.model_executor.model_loader.weight_utils",
                    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
                    "vllm.model_executor.layers.quantization.modelopt"],
           "sglang": ["sglang.srt.server_args", "pydantic"]}
IMPORT_TIME_ENV = ("TRITON_INTERPRET",)  # read when a module is imported: such a run needs a fresh interpreter
_servers: dict[str, _Server] = {}
_lock = threading.Lock()


class _Server:
    def __init__(self, python: str, preload: list[str]) -> None:
        self.proc = subprocess.Popen([python, "-u", str(SERVER), *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self.pending = b""
        self.reply(600.0, "ready")

    def reply(self, timeout: float, key: str) -> Any:
        """The next reply line (read unbuffered, so a line already in hand is never waited for)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            if not select.select([fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.proc.args, timeout)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the fork server {self.proc.args} ended (exit {self.proc.poll()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)[key]

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _server(python: str, preload: list[str]) -> _Server:
    server = _servers.get(python)
    if server is None or server.proc.poll() is not None:
        server = _servers[python] = _Server(python, preload)
    return server


def run(args: list[str], *, input: str | None = None, env: dict[str, str] | None = None,  # noqa: A002
        cwd: str | Path | None = None, timeout: float = 600.0,
        preload: str | list[str] = "vllm") -> subprocess.CompletedProcess[str]:
    """args = [side python, "-c", code, *argv] or [side python, script, *argv]; captured as text."""
    if any(k in (env if env is not None else os.environ) for k in IMPORT_TIME_ENV):
        return subprocess.run(args, input=input, env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True)
    with _lock, tempfile.TemporaryDirectory(prefix="side-python-") as tmp:
        paths = {name: Path(tmp) / name for name in ("stdin", "stdout", "stderr")}
        paths["stdin"].write_text(input or "")
        server = _server(args[0], PRELOAD[preload] if isinstance(preload, str) else preload)
        server.send({"argv": args[1:], "env": env, "cwd": str(cwd) if cwd else None,
                     **{k: str(p) for k, p in paths.items()}})
        pid = server.reply(60.0, "pid")
        try:
            rc = server.reply(timeout, "rc")
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            server.reply(60.0, "rc")
            raise subprocess.TimeoutExpired(args, timeout) from None
        return subprocess.CompletedProcess(args, rc, paths["stdout"].read_text(errors="replace"),
                                           paths["stderr"].read_text(errors="replace"))


@atexit.register
def _stop_all() -> None:
    for server in _servers.values():
        server.stop()
