"""What the stages measure, below them so that each stage reads another's results from its folder
and never imports it: the one request-metric table over trtkv.contracts.RequestRecord, statistics
and intervals, the input-length sweep's fits, the result plots, and probe.json read back through
its typed model (probe_results, probe_attention: the planner's and the report's advice). Light:
numpy and matplotlib load inside the functions that plot or fit."""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.measures.metrics import (
        LEVEL_METRICS,
        REQUEST_METRICS,
        SYSTEM_METRICS,
        measured_duration_s,
        summarize_level,
    )
    from trtkv.measures.plots import itl_vs_input
    from trtkv.measures.probe_attention import markdown_section
    from trtkv.measures.probe_results import (
        classify,
        engine_format_notes,
        load_probe,
        needle_by_format,
        per_layer_advice,
        probe_advice,
        summary_lines,
    )
    from trtkv.measures.stats import (
        CONFIDENCE,
        STATS,
        bootstrap_interval,
        interval_text,
        separated,
        summarize,
        wilson_interval,
    )
    from trtkv.measures.sweep import break_even, break_even_text, fits

# each name's module is imported on first use (the plots load matplotlib)
__getattr__, __dir__ = attach(__name__, submodules=["plots", "sweep"], stub=__file__)

__all__ = [
    "bootstrap_interval",
    "break_even",
    "break_even_text",
    "classify",
    "CONFIDENCE",
    "engine_format_notes",
    "fits",
    "interval_text",
    "itl_vs_input",
    "LEVEL_METRICS",
    "load_probe",
    "markdown_section",
    "measured_duration_s",
    "needle_by_format",
    "per_layer_advice",
    "plots",
    "probe_advice",
    "REQUEST_METRICS",
    "separated",
    "STATS",
    "summarize",
    "summarize_level",
    "summary_lines",
    "sweep",
    "SYSTEM_METRICS",
    "wilson_interval",
]
