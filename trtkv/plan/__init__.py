"""`trtkv plan`: the KV memory planner (trtkv.plan.planner)."""

__all__ = ["Estimate", "estimate", "kv_format_for_recipe", "Plan", "plan"]
