"""Triton model repository generation and validation (`trtkv repo`)."""

from trtkv.repo.generate import generate_repo, plan_repo
from trtkv.repo.validate import RepoError, validate_repo

__all__ = ["RepoError", "generate_repo", "plan_repo", "validate_repo"]
