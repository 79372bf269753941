"""Fixtures for the end-to-end tests: the trivial model served by the bundled tritonserver (one per module)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtkv.core import paths

TRIVIAL_REPO = paths.project_root() / "benchmarks" / "trivial_repo"


class _TrivialServers:
    """One trivial server per module, checked before every test that uses it: alive and answering readiness, else
    stopped (by its pid) and started again on fresh ports, so a test never meets a dead or refusing server."""

    def __init__(self, work: Path) -> None:
        self.work, self.server, self.starts = work, None, 0

    def ready(self):  # noqa: ANN201 - a tests.support.localserver.LocalServer
        from tests.support import localserver
        from trtkv.core.process import wait_http_ready

        server = self.server
        if server is not None and server.proc.poll() is None and wait_http_ready(
                f"http://{server.http_url}/v2/health/ready", lambda: server.proc.poll() is None, 10.0) is not None:
            return server
        if server is not None:
            server.stop()
        self.starts += 1
        self.server = localserver.start(TRIVIAL_REPO, self.work / f"start{self.starts}")
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@pytest.fixture(scope="module")
def _trivial_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_TrivialServers]:
    servers = _TrivialServers(tmp_path_factory.mktemp("trivial-server"))
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture()
def trivial_server(_trivial_servers: _TrivialServers):  # noqa: ANN201
    """tritonserver on benchmarks/trivial_repo on free 127.0.0.1 ports, alive and ready when the test starts."""
    return _trivial_servers.ready()


def read_results(folder: Path) -> dict:
    import json

    return json.loads((folder / "results.json").read_text())


@contextlib.contextmanager
def served_chain_recipe(root: Path, recipe: str, engine: Path, overrides: list[str]) -> Iterator[tuple[list[str], Path]]:
    """`trtkv repo` + `trtkv serve` of `recipe` into `root` (the session chain's calibrated checkpoint and engine
    linked in), on free ports, with `overrides`; yields (the overrides with the ports, the engines folder); always
    stopped, TRTKV_ENGINES / TRTKV_TRITON_REPO restored."""
    from trtkv.cli import main
    from trtkv.core.process import free_ports

    engines = root / "engines"
    (engines / recipe).mkdir(parents=True)
    for part in ("checkpoint", "engine"):
        (engines / recipe / part).symlink_to(engine / part)
    saved = {k: os.environ.get(k) for k in ("TRTKV_ENGINES", "TRTKV_TRITON_REPO")}
    os.environ["TRTKV_ENGINES"], os.environ["TRTKV_TRITON_REPO"] = str(engines), str(root / "triton_repo")
    http, grpc, metrics = free_ports(3)
    overrides = [*overrides, f"triton.http_port={http}", f"triton.grpc_port={grpc}", f"triton.metrics_port={metrics}"]
    try:
        assert main(["repo", recipe, *overrides]) == 0
        assert main(["serve", recipe, *overrides]) == 0
        yield overrides, engines
    finally:
        main(["stop", recipe, *overrides])
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
