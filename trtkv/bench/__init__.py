"""`trtkv bench`: a streaming client for the Triton ensemble, a load generator, accuracy tasks and
result files.

Metric names follow GenAI-Perf (time_to_first_token, inter_token_latency, request_latency,
output_sequence_length, input_sequence_length, output_token_throughput, request_throughput) so
figures compare with what users already run.
"""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.bench.options import BenchOptions
    from trtkv.bench.plots import itl_vs_input
    from trtkv.bench.results import interval_text
    from trtkv.bench.ruler import probe_plan
    from trtkv.bench.runner import run_bench
    from trtkv.bench.stats import separated
    from trtkv.bench.sweep import break_even, break_even_text, fits

# each name's module is imported on first use (the runner and the plots load httpx and matplotlib)
__getattr__, __dir__ = attach(
    __name__,
    submod_attrs={
        "options": ["BenchOptions"],
        "plots": ["itl_vs_input"],
        "results": ["interval_text"],
        "ruler": ["probe_plan"],
        "runner": ["run_bench"],
        "stats": ["separated"],
        "sweep": ["break_even", "break_even_text", "fits"],
    },
)

__all__ = [
    "BenchOptions",
    "break_even",
    "break_even_text",
    "fits",
    "interval_text",
    "itl_vs_input",
    "probe_plan",
    "run_bench",
    "separated",
]
