"""`trtkv report` and `trtkv compare`: summaries read from the stage outputs (trtkv.report.summary),
several recipes side by side (trtkv.report.compare), and the whole chain of one or several recipes
(trtkv.report.chain, `make demo` / `make compare`)."""

__all__ = [
    "compare_output",
    "print_summary",
    "require_success",
    "run_chain",
    "write_compare_folder",
    "write_report",
]
