"""Triton model repository generation and validation (`trtkv repo`)."""

from trtkv.repo.generate import generate_repo
from trtkv.repo.validate import validate_repo

__all__ = ["generate_repo", "validate_repo"]
