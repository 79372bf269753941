"""Start the tritonserver bundled in nvidia-pytriton on a given model repository (tests and the cross-check).
Dev-only: lives in tests/support/ (the tests and the benchmarks use it), not in the trtkv package.

`trtkv serve` is the user-facing launcher; this small helper only exists so the benchmark's own tests and the
cross-check can serve the trivial repository on 127.0.0.1 and stop it by its pid.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trtkv.backends.bundled import bundled_command, link_python_backend, server_env
from trtkv.core.errors import StageError
from trtkv.core.process import free_ports, port_in_use, wait_http_ready
from trtkv.core.tools import tail


@dataclass
class LocalServer:
    proc: subprocess.Popen
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM by pid, SIGKILL if it has not exited in time."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def free_port() -> int:
    return free_ports(1)[0]


def start(repository: Path, work: Path, *, ports: tuple[int, int, int] | None = None, host: str = "127.0.0.1",
          timeout_s: float = 120.0, extra_args: tuple[str, ...] = ()) -> LocalServer:
    """Start tritonserver on `repository` and wait until it is ready (a StageError with the log tail otherwise)."""
    work.mkdir(parents=True, exist_ok=True)
    http_port, grpc_port, metrics_port = ports or tuple(free_ports(3, host))
    busy = [p for p in (http_port, grpc_port, metrics_port) if port_in_use(host, p)]
    if busy:
        raise StageError(f"port(s) {busy} on {host} are already in use; another server may be running there. "
                         f"Next: stop it, or pick other ports.")
    backends = link_python_backend(work / "backends")
    cmd = bundled_command(repository, backends, host, (http_port, grpc_port, metrics_port),
                          ("--log-verbose=0", "--exit-timeout-secs=5", *extra_args))
    env = server_env()
    log = work / "tritonserver.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = LocalServer(proc, host, http_port, grpc_port, metrics_port, log)
    _wait_ready(server, timeout_s)
    return server


def _wait_ready(server: LocalServer, timeout_s: float) -> None:
    url = f"http://{server.http_url}/v2/health/ready"
    if wait_http_ready(url, lambda: server.proc.poll() is None, timeout_s) is not None:
        return
    if server.proc.poll() is not None:
        raise StageError(f"tritonserver exited with code {server.proc.returncode}; log {server.log}:\n{tail(server.log)}")
    server.stop()
    raise StageError(f"tritonserver not ready after {timeout_s:g} s; log {server.log}:\n{tail(server.log)}")


def main(argv: list[str] | None = None) -> int:
    """`python tests/support/localserver.py REPO [--ports H,G,M]`: serve in the foreground until Ctrl-C/SIGTERM."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("repository", type=Path)
    ap.add_argument("--ports", default="18000,18001,18002", help="HTTP,gRPC,metrics ports")
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtkv-localserver"))
    args = ap.parse_args(argv)
    http, grpc, metrics = (int(p) for p in args.ports.split(","))
    server = start(args.repository.resolve(), args.work, ports=(http, grpc, metrics))
    print(f"ready: pid {server.proc.pid}, grpc {server.grpc_url}, http {server.http_url}, log {server.log}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while server.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
