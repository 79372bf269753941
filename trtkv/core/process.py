"""Processes trtkv starts and stops: is it alive, stop it (by its own pid and process group), wait
until it serves.

One home for what the external-tool runner (trtkv.core.tools) and the test/cross-check server
(tests/support/localserver.py) need; no `pkill`, everything by pid. A served model's processes are
ended by session instead (trtkv.core.sessions: its leader may be dead already, and some children
leave the process group).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from trtkv.core.httpcall import Target, request


def _exists(send: Callable[[int, int], None], ident: int) -> bool:
    """Signal 0 to a pid (os.kill) or a process group (os.killpg): True when it exists (EPERM:
    someone else's)."""
    try:
        send(ident, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (EPERM: it exists, owned by someone else)."""
    return pid > 0 and _exists(os.kill, pid)


def is_running(pid: int, command: list[str] | None = None) -> bool:
    """True while `pid` is alive (not a zombie) and, when given, runs `command[0]` (guards against
    pid reuse)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our own child
        if done == pid:
            return False
    except ChildProcessError:
        pass
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return pid_alive(pid) and not Path("/proc/self").exists()
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except (OSError, IndexError):
        return False
    if state in ("Z", "X"):
        return False
    # an exiting process has released its memory (empty cmdline) but is not a zombie yet
    if not argv0:
        return True
    return command is None or not command or Path(argv0).name == Path(command[0]).name


def group_alive(pgid: int) -> bool:
    """True while any process of the process group `pgid` exists."""
    return _exists(os.killpg, pgid)


def stop_process_group(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """End the child and every process of its group: SIGTERM, up to `grace_s` to exit, then SIGKILL.

    A no-op when the child has exited and its group is empty. The child leads its own session (pgid
    = its pid).
    """
    if proc.poll() is not None and not group_alive(proc.pid):
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            if proc.poll() is None:
                proc.send_signal(sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not group_alive(proc.pid):
                return
            time.sleep(0.05)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct ports that are free right now (all held open together, so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def wait_http_ready(
    url: str, alive: Callable[[], bool], timeout_s: float, poll_s: float = 0.25
) -> float | None:
    """Seconds until GET `url` answers 200 (a server's readiness endpoint); None when `alive()`
    turned False first (the process died) or `timeout_s` passed. The callers say which, with their
    own log."""
    Target.parse(url)  # a malformed URL is an error now (HttpError), not a wait until timeout_s
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if not alive():
            return None
        try:
            if request(url, timeout_s=2.0).status == 200 and alive():
                return time.monotonic() - start
        except OSError:  # not listening yet, reset, no whole answer within 2 s
            pass
        time.sleep(poll_s)
    return None
