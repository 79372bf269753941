"""`trtkv bench`: a streaming client for the Triton ensemble, a load generator, accuracy tasks and
result files, one sub-package each (transport, load, tasks, outputs); runner, phases and options
drive them.

Metric names follow GenAI-Perf (time_to_first_token, inter_token_latency, request_latency,
output_sequence_length, input_sequence_length, output_token_throughput, request_throughput) so
figures compare with what users already run.
"""

from trtkv.core.lazy import attach

TYPE_CHECKING = False  # typing's, without loading typing (see trtkv.core.lazy)

if TYPE_CHECKING:
    from trtkv.bench.options import BenchOptions
    from trtkv.bench.runner import ServedSide, run_bench
    from trtkv.bench.tasks.ruler import probe_plan

# each name's module is imported on first use (the runner loads httpx)
__getattr__, __dir__ = attach(__name__, stub=__file__)

__all__ = [
    "BenchOptions",
    "probe_plan",
    "run_bench",
    "ServedSide",
]
