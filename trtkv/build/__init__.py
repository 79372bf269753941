"""`trtkv build`: the build stage (trtkv.build.stage); what a backend builds is the backend's."""

__all__ = ["stage"]
