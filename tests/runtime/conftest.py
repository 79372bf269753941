"""One torch thread for the tiny-model tests here (see the `one_torch_thread` fixture in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(one_torch_thread: None) -> None:
    """Applies the shared fixture to every test here."""
