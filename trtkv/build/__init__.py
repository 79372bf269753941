"""`trtkv build`: the build stage (trtkv.build.stage); what a backend builds is the backend's."""

from trtkv.core.lazy import attach

# the stage module is imported on first use (it loads the recipe schema and the backends)
__getattr__, __dir__ = attach(__name__, submodules=["stage"])

__all__ = ["stage"]
