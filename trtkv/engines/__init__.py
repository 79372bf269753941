"""Each engine's memory in one place: its KV-pool rule, the recipe knobs it reads, their defaults at
trtkv's pinned release, the flags its served command carries, and how the pool a running server
reports is read back. One module per engine (vllm and vllm_cpu, sglang, trtllm for the LLM API and
the engine path, reference), with what they share in pool (the estimate, the knobs, the rule's
signature), sizing (the recipe's model as the engines size it) and activation (the profiling /
warm-up forward).

The layer of the backends (tests/test_imports.py): a backend names its engine's rule object in its
`memory` (trtkv.backends.seam.MemoryRule), the planner calls it (trtkv.plan.engine_pool), and
tests/engines/test_memory_home.py fails on an engine memory flag or knob read outside this package.
"""
