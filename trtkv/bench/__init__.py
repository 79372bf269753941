"""`trtkv bench`: a streaming client for the Triton ensemble, a load generator, accuracy tasks and
result files.

Metric names follow GenAI-Perf (time_to_first_token, inter_token_latency, request_latency,
output_sequence_length, input_sequence_length, output_token_throughput, request_throughput) so
figures compare with what users already run.
"""

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
