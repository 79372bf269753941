"""`trtkv report` and `trtkv compare`: summaries read from the stage outputs (trtkv.report.summary),
several recipes side by side (trtkv.report.compare), and the whole chain of one or several recipes
(trtkv.report.chain, `make demo` / `make compare`)."""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.report.chain import require_success, run_chain
    from trtkv.report.compare import compare_output, write_compare_folder
    from trtkv.report.summary import print_summary, write_report

# each name's module is imported on first use (the chain runs every stage)
__getattr__, __dir__ = attach(__name__, stub=__file__)

__all__ = [
    "compare_output",
    "print_summary",
    "require_success",
    "run_chain",
    "write_compare_folder",
    "write_report",
]
