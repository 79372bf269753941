"""`trtkv probe`: KV-cache precision vs context length, measured on the recipe's real model.

Modules: setup (settings, the loaded model), placement (dtype, the device map over GPUs, --dry-run),
measure (the passes), metrics (KL, top-1 and the records of a pass), attention (engine attention
modes and the prefill-vs-decode drift), sweep (the driver), sweep_cache (its cache), outputs
(probe.json, probe.md, plots; read back for the planner and the report by
trtkv.measures.probe_results and trtkv.measures.probe_attention), layers (--per-layer) and
layers_search (its sensitivity, verified sets and fronts). Importing this package stays light too:
the torch-side names load on first use.

For each format and context length, on long natural text (calibration_data/eval, never used for
calibration): KL divergence of next-token distributions to the unquantized model (mean and last
quarter of positions), perplexity and its change, top-1 agreement, measured KV bytes per token,
clipping rate of static scales; needle retrieval (a random passkey at several depths); and the
scale-reuse experiment (scales from short prompts applied at long context and through decode steps).
Writes probe.json, probe.md and PNG plots; per-(format, length) results are cached under cache/ so
an interrupted sweep resumes.

Method (also written into probe.md):
- Reference: the model (float32 compute) with K/V stored as float16 (`fp16`); its own KL is 0 by
  construction.
- Every format runs through QuantizedKVCache, where each query attends to the quantized K/V of all
  positions up to and including its own: the view of a decode step. Per-token formats quantize each
  token independently, so one causal pass over the text equals token-by-token decoding exactly.
  KIVI's fp16 window depends on the query position, so KIVI text is fed in 128-token chunks aligned
  with its window flushes: each token sees the quantized history plus the full-precision window, as
  in decoding.
- One pass at the longest length serves every shorter length: the first L positions of a causal pass
  are the pass over the first L tokens. Metrics at length L use the predictions of tokens 1..L-1.
- Needles are scored teacher-forced: retrieval counts when the greedy prediction of every passkey
  digit is right (exactly what greedy generation would produce). Seeds share the haystack before the
  needle (one prefix pass).
"""

from typing import TYPE_CHECKING

from trtkv.core.lazy import attach

if TYPE_CHECKING:
    from trtkv.probe.layers import PerLayerOptions, run_per_layer
    from trtkv.probe.placement import dry_run
    from trtkv.probe.ruler import summary_lines
    from trtkv.probe.setup import ProbeSettings, default_settings
    from trtkv.probe.sweep import run_probe

# each name's module is imported on first use (they import torch; `trtkv plan` must not)
__getattr__, __dir__ = attach(__name__, stub=__file__)


__all__ = [
    "default_settings",
    "dry_run",
    "PerLayerOptions",
    "ProbeSettings",
    "run_per_layer",
    "run_probe",
    "summary_lines",
]
