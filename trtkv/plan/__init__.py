"""`trtkv plan`: the KV memory planner (trtkv.plan.planner)."""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.plan.estimate_model import Estimate
    from trtkv.plan.handoff import figures
    from trtkv.plan.planner import plan
    from trtkv.plan.prefix_reuse import reuse_lines
    from trtkv.plan.result import Plan
    from trtkv.plan.tiers import tier_lines

# each name's module is imported on first use: `trtkv plan --help` loads none of them
__getattr__, __dir__ = attach(__name__, submodules=["estimate"], stub=__file__)

__all__ = ["Estimate", "estimate", "figures", "Plan", "plan", "reuse_lines", "tier_lines"]
