"""The runtime's request error (shared by the engine and the sampling controls)."""

from __future__ import annotations

from trtkv.core.errors import TrtkvError


class RequestError(TrtkvError, ValueError):
    """A generate() call with arguments the runtime cannot serve (too long, empty, bad sampling
    values)."""
