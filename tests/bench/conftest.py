"""Fixtures for the bench tests: the trivial model served by the bundled tritonserver (one per module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trtkv import paths

TRIVIAL_REPO = paths.project_root() / "benchmarks" / "trivial_repo"


@pytest.fixture(scope="module")
def trivial_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:  # noqa: ANN201
    """tritonserver on benchmarks/trivial_repo on free 127.0.0.1 ports; stopped by its pid afterwards."""
    from benchmarks import localserver

    server = localserver.start(TRIVIAL_REPO, tmp_path_factory.mktemp("trivial-server"))
    try:
        yield server
    finally:
        server.stop()


def read_results(folder: Path) -> dict:
    import json

    return json.loads((folder / "results.json").read_text())
