"""The recipe's bench section: the workload `trtkv bench` sends (protocol, concurrency or rate,
lengths, the input sweep, the prefix-sharing workload), the accuracy tasks and the SLOs.
trtkv.recipe.schema re-exports it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from trtkv.recipe.enums import SLO_PATTERN, BenchTask, Protocol
from trtkv.recipe.limits import RANGES, bounded
from trtkv.recipe.sections import Section

# A prompt length of the input sweep: each one within trtkv.recipe.limits' "positions" range
# (recipe.rules then holds it to build.max_input_len)
SweepLength = Annotated[int, Field(**RANGES["positions"].field())]
MAX_SWEEP_LENGTHS = 64  # a sweep runs every latency level once per length
# Every loop a user's value drives has a cap the error states (issue 48): a level runs a warm-up and
# its requests and `plan --estimate` estimates each one (3,000 levels kept it busy for hours); a
# closed-loop stream is one client thread and one connection; an accuracy length is a set of
# served requests.
MAX_LEVELS = 64
MAX_CONCURRENCY = 8192
MAX_TASK_LENGTHS = 64
MAX_THRESHOLDS = 256


class PrefixWorkload(Section):
    """The prefix-sharing workload (`bench.prefix`), after AIPerf's `--shared-system-prompt-length`,
    `--num-prefix-prompts` and `--conversation-turn-*` and vLLM's prefix_repetition dataset. The
    cross-field rules (shared_tokens <= input_tokens; the longest session within
    build.max_seq_len) are trtkv.recipe.rules'."""

    shared_tokens: int = bounded(
        0,
        "positions",
        ge=0,
        description="The first `shared_tokens` of each session's first prompt are a system prompt "
        "shared by every session of its prefix group (at most bench.input_tokens, which stays the "
        "first turn's exact prompt length); 0: no prefix workload.",
    )
    groups: int = bounded(
        1,
        "requests",
        description="Distinct shared prefixes; sessions take them round-robin.",
    )
    turns: int = bounded(
        1,
        "requests",
        description="Turns per session; a turn after the first sends the session's whole history "
        "(its previous prompt and the answer it got) plus `turn_tokens` new tokens. "
        "bench.num_requests counts turns.",
    )
    turn_tokens: int = bounded(64, "positions", description="New user tokens per later turn.")
    think_time_s: float = bounded(
        0.0,
        "timeout_s",
        ge=0,
        description="Pause between a session's turns; the session holds its concurrency slot "
        "while it thinks (AIPerf's closed loop does the same), so think time lowers the load.",
    )

    @property
    def enabled(self) -> bool:
        """A prefix workload is sent: a shared prefix, or sessions of more than one turn."""
        return self.shared_tokens > 0 or self.turns > 1

    def longest_tokens(self, input_tokens: int, output_tokens: int) -> int:
        """The last turn's prompt plus its answer: the longest sequence a session puts on the
        server."""
        return input_tokens + (self.turns - 1) * (self.turn_tokens + output_tokens) + output_tokens


class BenchConfig(Section):
    protocol: Protocol = Field(
        Protocol.GRPC,
        description="gRPC streaming, HTTP `generate_stream` (Triton), or "
        "`openai` (streaming /v1/completions of vLLM, trtllm-serve or Triton's OpenAI frontend).",
    )
    concurrency: list[int] = Field(
        [1, 2, 4],
        min_length=1,
        max_length=MAX_LEVELS,
        description=f"Concurrency sweep: at most {MAX_LEVELS} levels, each at most "
        f"{MAX_CONCURRENCY} streams (one client thread and connection each).",
    )
    request_rate: float | None = bounded(
        None, "rate", description="Requests/s (instead of a concurrency sweep)."
    )
    input_tokens: int = bounded(128, "positions", description="Prompt length in tokens (exact).")
    sweep_input_tokens: list[SweepLength] = Field(
        [],
        max_length=MAX_SWEEP_LENGTHS,
        json_schema_extra={"range": "positions"},
        description="Input lengths (tokens) to run the latency levels at (`trtkv bench "
        "--sweep-input`): ITL and TTFT fitted against context; `trtkv compare` gives the "
        "break-even length of two KV formats.",
    )
    output_tokens: int = bounded(32, "positions", description="`max_tokens` per request.")
    num_requests: int = bounded(
        16, "requests", description="Measured requests per concurrency level."
    )
    warmup_requests: int = bounded(
        2, "requests", ge=0, description="Requests sent first and left out of the figures."
    )
    warmup_output_tokens: int | None = bounded(
        None,
        "positions",
        description="`max_tokens` of a warm-up request (default: output_tokens). A few tokens "
        "open the level's sessions and run its batch's prefill and decode steps; the measured "
        "requests then meet a warm engine at less cost.",
    )
    prefix: PrefixWorkload = Field(
        PrefixWorkload(),
        description="The prefix-sharing workload: shared system prompts, multi-turn sessions "
        "and think time (docs/bench.md).",
    )
    tasks: list[BenchTask] = Field(
        [BenchTask.QUIZ, BenchTask.GOLDEN, BenchTask.NEEDLE],
        description="Accuracy tasks to run (a quantized KV "
        "cache adds `fidelity` when the recipe does not name them).",
    )
    quiz_items: int = bounded(40, "requests", description="Quiz questions asked.")
    accuracy_concurrency: int = bounded(
        1,
        "batch",
        description="Requests in flight during the accuracy tasks: 1 makes their figures "
        "reproducible on engines whose answers depend on the batch (TensorRT-LLM, vLLM by "
        "default).",
    )
    needle_context_lengths: list[int] = Field(
        [512],
        max_length=MAX_TASK_LENGTHS,
        description=f"Haystack lengths (tokens) for needle retrieval (at most {MAX_TASK_LENGTHS}).",
    )
    ruler_lengths: list[int] = Field(
        [4096],
        max_length=MAX_TASK_LENGTHS,
        description="RULER sequence lengths (tokens: prompt + tokens to generate; at most "
        f"{MAX_TASK_LENGTHS}).",
    )
    ruler_samples: int = bounded(
        20, "requests", description="RULER items per task and length (RULER itself uses 500)."
    )
    fidelity_lengths: list[int] | None = Field(
        None,
        max_length=MAX_TASK_LENGTHS,
        description="Fidelity task context lengths (tokens; at most "
        f"{MAX_TASK_LENGTHS}); None: the probe's lengths up to build.max_input_len.",
    )
    fidelity_documents: int = bounded(
        4, "requests", description="Fidelity task: documents per length."
    )
    fidelity_tokens: int = bounded(
        16, "positions", description="Fidelity task: greedy tokens served per document (G)."
    )
    request_timeout_s: float = bounded(
        120.0, "timeout_s", description="A request slower than this counts as failed."
    )
    thresholds: list[str] = Field(
        [],
        max_length=MAX_THRESHOLDS,
        description="SLOs `metric.stat<=value`, e.g. `time_to_first_token.p99<=500`, "
        f"`quiz.accuracy>=0.3` (at most {MAX_THRESHOLDS}).",
    )

    @field_validator("thresholds")
    @classmethod
    def _slo_form(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if not SLO_PATTERN.match(v.strip())]
        if bad:
            raise ValueError(f"{bad[0]!r} is not of the form metric.stat<=value (or >=, <, >)")
        return [v.strip() for v in values]

    @field_validator(
        "concurrency",
        "needle_context_lengths",
        "ruler_lengths",
        "fidelity_lengths",
        "sweep_input_tokens",
    )
    @classmethod
    def _positive(cls, values: list[int] | None) -> list[int] | None:
        if values is not None and any(v <= 0 for v in values):
            raise ValueError("every entry must be > 0")
        return values

    @field_validator("concurrency")
    @classmethod
    def _streams(cls, values: list[int]) -> list[int]:
        over = [v for v in values if v > MAX_CONCURRENCY]
        if over:
            raise ValueError(
                f"{over[0]} streams: at most {MAX_CONCURRENCY} per level (one client thread and "
                "connection each; run several clients for more)"
            )
        return values
