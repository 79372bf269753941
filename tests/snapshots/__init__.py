"""Snapshots of the generated files users keep (issue #43)."""
