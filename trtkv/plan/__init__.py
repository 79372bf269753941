"""`trtkv plan`: the KV memory planner (trtkv.plan.planner)."""
