"""results.json of `trtkv bench` (BenchResults) and its parts, typed throughout, with the request
record the client measures (RequestRecord; in results.json, RequestRecordDoc): trtkv.bench writes
through these models, trtkv.measures and the report read through them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Annotated

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, JsonValue
from pydantic.dataclasses import dataclass as typed_dataclass

from trtkv.contracts.artifacts import Artifact, Kept
from trtkv.contracts.prefix import PrefixLevel
from trtkv.contracts.probe_doc import RulerLength

Interval = list[float | None]  # [low, high]; null ends: nothing measured (written NaN)


class BenchEndpoint(Kept):
    """Where `trtkv bench` measured: results.json's "endpoint"."""

    url: str
    protocol: str  # a trtkv.recipe.Protocol value: grpc, http or openai
    model: str
    source: str = ""  # where the URL came from (--url, server.json, the recipe)
    endpoint_type: str | None = None  # protocol openai only: completions or chat


class BenchWorkload(Kept):
    """What `trtkv bench` sent: results.json's "workload" (the recipe's bench section, and how the
    levels are run)."""

    input_tokens: int
    output_tokens: int
    num_requests: int
    warmup_requests: int
    concurrency: list[int]
    request_rate: float | None
    accuracy_concurrency: int | None = None  # absent before 2026-12-01's files
    request_timeout_s: float
    mode: str  # "concurrency sweep [...]" or "request rate R/s"
    sampling: str


class SLOVerdict(Kept):
    """One SLO checked (trtkv.bench.outputs.slo.SLOResult.to_json)."""

    slo: str  # as written: "time_to_first_token.p99<=500"
    source: str = ""  # where it was set: the recipe, --slo, the default
    where: str = ""  # the level ("concurrency=4") or task it was checked on
    measured: float | None = None
    passed: bool


class BenchSLOs(Kept):
    """results.json's "slo": the verdict and one entry per SLO (trtkv.bench.outputs.slo)."""

    passed: bool
    results: list[SLOVerdict] = []


class MetricStats(Kept):
    """One metric of a level in GenAI-Perf's shape (trtkv.measures.stats.summarize): a request
    metric has every stat, a run metric (throughput, duration) its unit and avg. NaN: no value
    measured."""

    unit: str = ""
    count: int | None = None
    avg: float | None = None
    min: float | None = None
    max: float | None = None
    std: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


class ClientLag(Kept):
    """How long bytes already received waited for the client to read them
    (trtkv.bench.load.levels)."""

    unit: str = "ms"
    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    count: int = 0


class ClientWorker(Kept):
    """One client process of a level (trtkv.bench.load.levels.client_summary)."""

    worker: int
    pid: int | None = None
    streams: int = 0
    requests: int = 0
    output_tokens: int = 0
    cpu_seconds: float | None = None
    cpu_cores: float | None = None
    cpu_us_per_token: float | None = None
    lag_ms: ClientLag | None = None


class ClientSummary(Kept):
    """A level's client: its processes, their CPU per streamed token, its own lag, and a warning
    when the client may have held the level back (trtkv.bench.load.levels.client_summary)."""

    workers: int
    decided: str = ""
    core_share: float | None = None
    warmup_load_cores: float | None = None
    cpu_cores: float | None = None
    cpu_us_per_token: float | None = None
    lag_ms: ClientLag | None = None
    per_worker: list[ClientWorker] = []
    warning: str | None = None


class BenchLevel(Kept):
    """One level of results.json's "levels" (trtkv.measures.metrics.summarize_level): GenAI-Perf's
    metric names in the order written; an absent metric is None (files of older versions)."""

    time_to_first_token: MetricStats | None = None
    inter_token_latency: MetricStats | None = None
    request_latency: MetricStats | None = None
    output_sequence_length: MetricStats | None = None
    input_sequence_length: MetricStats | None = None
    output_token_throughput: MetricStats | None = None
    request_throughput: MetricStats | None = None
    # total, ok, failed, one count per request status, delayed (an open loop's late sends)
    request_count: dict[str, int] = {}
    benchmark_duration: MetricStats | None = None
    client_cpu_per_token: MetricStats | None = None
    client: ClientSummary | None = None
    # --goodput: AIPerf's goodput (requests/sec) and its good_request_count
    goodput: MetricStats | None = None


class TimeOrigin(BaseModel):
    """The wall-clock instant results.json's record times count from."""

    unix_ns: int
    note: str = ""


class KVPoolCheck(Kept):
    """results.json's "kv_pool": the served KV pool per GPU beside the planned one
    (trtkv.serving.pool.compare); served_* None when the engine reported nothing readable, and
    `source` says why."""

    planned_bytes_per_gpu: float | None = None  # None: the read-back failed before the plan
    rule: str | None = None  # the engine and release whose pool rule the plan follows
    served_bytes_per_gpu: float | None = None
    served_tokens: int | None = None
    source: str | None = None
    served_over_planned: float | None = None
    warning: str | None = None  # served more than 10% below the plan


class FidelityFigure(Kept):
    """A fidelity figure over a length's documents: its point value and bootstrap interval."""

    value: float
    ci: Interval


class FidelityMetric(Kept):
    """A metric at one length: served and predicted against the reference, the gap, the verdict."""

    served: FidelityFigure
    predicted: FidelityFigure
    gap: FidelityFigure
    margin: float
    worse: bool


class FidelityLength(Kept):
    """A length of the fidelity table (fidelity_verdict.length_summary); None: not measurable."""

    length: int
    documents: int
    failed: int | None = None
    not_aligned: int | None = None
    tokens: int | None = None
    top1_agreement: FidelityMetric | None = None
    mean_abs_dlogp: FidelityMetric | None = None
    kl_topk: FidelityMetric | None = None
    verdict: str
    worse_metrics: list[str]
    note: str | None = None


class FidelitySettings(Kept):
    """How the fidelity task ran: lengths, documents, tokens, top-k, bootstrap and verdict rule."""

    lengths: list[int]
    documents_per_length: int
    tokens: int
    top_k: int
    confidence: float
    bootstrap_resamples: int
    rule: str
    concurrency: int


class TaskScore(Kept):
    """One task of results.json's "accuracy" (trtkv.bench.tasks): its score, interval and counts in
    the order the tasks write them, then its own figures, items and notes; or `error` alone."""

    error: str | None = None  # the task did not run: why
    verdict: str | None = None  # fidelity: served against predicted, and the lengths judged worse
    worse_lengths: int | None = None
    lengths_judged_worse: list[int] | None = None
    agreement: float | None = None  # golden: the golden tokens reproduced
    agreement_ci: Interval | None = None
    exact_match: float | None = None  # golden
    exact_match_ci: Interval | None = None
    accuracy: float | None = None  # the fraction right (fidelity: top-1 agreement)
    # ruler's is `interval` in files of trtkv before 2026-12-08 (its by_length cells keep theirs)
    accuracy_ci: Interval | None = Field(
        None, validation_alias=AliasChoices("accuracy_ci", "interval")
    )
    confidence: float | None = None  # of the intervals
    correct: int | None = None
    total: int | None = None  # items (fidelity: tokens judged)
    requests: int | None = None  # fidelity
    failed: int | None = None  # failed requests, counted wrong
    by_context_length: dict[str, float] | None = None  # needle
    by_context_length_ci: dict[str, Interval] | None = None
    # a task's own figures, typed, declared in the order written (declared fields dump first)
    golden_file: str | None = None  # golden: the stored outputs and their producer
    producer: str | None = None
    metric: str | None = None  # ruler: RULER's metric and commit, the figures per length
    ruler_commit: str | None = None
    by_length: dict[str, RulerLength] | None = None
    table: list[FidelityLength] | None = None  # fidelity: per length; scorers, settings, times
    reference: dict[str, str] | None = None  # producer, model dir ...
    prediction: dict[str, str] | None = None  # weights, KV format, engine, scales, attention ...
    settings: FidelitySettings | None = None
    seconds: dict[str, int | float] | None = None  # each step's, with the documents computed
    errors: list[str] | None = None
    items: list[dict[str, JsonValue]] | None = None  # each item as scored: its task's own keys
    notes: list[str] = []  # how it ran, for results.md


@dataclass
class RequestFields:
    """What a RequestRecord (times in ns) and its RequestRecordDoc (times in ms) share."""

    request_id: str
    phase: str  # "warmup", "latency", or an accuracy task name
    level: str  # "concurrency=2", "rate=4.0/s", or the task name
    prompt_index: int
    input_tokens: int
    max_tokens: int
    response_texts: list[str] = field(default_factory=list)
    response_tokens: list[int] = field(default_factory=list)
    status: str = "pending"
    error: str = ""
    client_cpu_ns: int = 0  # the client's own CPU time (OpenAI/HTTP sessions; 0: not measured)
    server_tokens: int | None = None  # output tokens the server reported (OpenAI usage)
    client_lag_us: list[int] = field(default_factory=list)  # sampled reads: the client's own lag
    client_worker: int = 0  # the client process that carried it (0: the only or the first one)
    delayed: bool = False  # open loop: sent late, no worker free (perf_analyzer's "delayed")
    # bench.prefix: the session's turn (1: its first) and prefix group; else None, not written
    turn: Annotated[int | None, Field(exclude_if=lambda v: v is None)] = None
    prefix_group: Annotated[int | None, Field(exclude_if=lambda v: v is None)] = None


@typed_dataclass(kw_only=True)
class RequestRecordDoc(RequestFields):
    """One request of results.json's "records" (RequestRecord.to_doc): ms after the run started."""

    send_time_ms: float
    response_times_ms: list[float]
    first_token_time_ms: float | None = None
    end_time_ms: float | None = None
    output_tokens: int = 0


# a request's status
OK = "ok"
ERROR = "error"
TIMEOUT = "timeout"
CANCELLED = "cancelled"
NOT_SENT = "not_sent"


def now_ns() -> int:
    """The clock of every *_ns time in a RequestRecord: perf_counter_ns (monotonic, the finest)."""
    return time.perf_counter_ns()


@dataclass
class RequestRecord(RequestFields):
    """A request as the client measures it: times in ns since the run's start (perf_counter_ns)."""

    send_ns: int = 0
    response_ns: list[int] = field(default_factory=list)
    end_ns: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def text(self) -> str:
        return "".join(self.response_texts)

    def content_indices(self) -> list[int]:
        """Responses that carried at least one token (an empty final response carries none)."""
        return [i for i, n in enumerate(self.response_tokens) if n > 0]

    def output_tokens(self) -> int:
        return sum(self.response_tokens)

    def ttft_ms(self) -> float | None:
        idx = self.content_indices()
        return (self.response_ns[idx[0]] - self.send_ns) / 1e6 if idx else None

    def request_latency_ms(self) -> float | None:
        if not self.response_ns:
            return None
        return (self.response_ns[-1] - self.send_ns) / 1e6

    def itl_ms(self) -> float | None:
        """Gaps between content responses, each divided by the tokens in the later one,
        token-weighted per request."""
        idx = self.content_indices()
        if len(idx) < 2:
            return None
        gap_ns = self.response_ns[idx[-1]] - self.response_ns[idx[0]]
        later_tokens = sum(self.response_tokens[i] for i in idx[1:])
        return gap_ns / later_tokens / 1e6

    def to_doc(self) -> RequestRecordDoc:
        """The raw record as written to results.json (times in ms since the run started)."""
        idx = self.content_indices()
        return RequestRecordDoc(
            **{f.name: getattr(self, f.name) for f in fields(RequestFields)},
            send_time_ms=self.send_ns / 1e6,
            response_times_ms=[t / 1e6 for t in self.response_ns],
            first_token_time_ms=self.response_ns[idx[0]] / 1e6 if idx else None,
            end_time_ms=None if self.end_ns is None else self.end_ns / 1e6,
            output_tokens=self.output_tokens(),
        )

    @classmethod
    def from_doc(cls, doc: RequestRecordDoc) -> RequestRecord:
        """A record read back from results.json, to recompute its figures."""
        return cls(
            **{f.name: getattr(doc, f.name) for f in fields(RequestFields)},
            send_ns=round(doc.send_time_ms * 1e6),
            response_ns=[round(t * 1e6) for t in doc.response_times_ms],
            end_ns=None if doc.end_time_ms is None else round(doc.end_time_ms * 1e6),
        )


class SweepSamples(BaseModel):
    """One length's successful requests: each one's TTFT and mean ITL (ms)."""

    ttft_ms: list[float]
    itl_ms: list[float]


class SweepLevel(BaseModel):
    """One level of "sweep": per input length its samples and client, then medians and fits."""

    samples: dict[str, SweepSamples] = {}  # by input length ("512")
    client: dict[str, ClientSummary] = {}  # by input length: its processes, CPU, lag, warning
    input_tokens: list[float] = []
    itl_p50_ms: list[float] = []
    itl_fit: dict[str, float] | None = None  # slope, intercept, r2; None: under two lengths
    ttft_input_tokens: list[float] = []
    ttft_p50_ms: list[float] = []
    ttft_fit: dict[str, float] | None = None
    ttft_quadratic_fit: dict[str, float] | None = None  # a, b, c; None: under three lengths


class BenchSweep(BaseModel):
    """results.json's "sweep" (trtkv.measures.sweep.summarize of `bench --sweep-input`)."""

    input_tokens: list[int] = []
    levels: dict[str, SweepLevel] = {}
    fit: str = ""


class BenchResults(Artifact):
    """results.json of `trtkv bench` (trtkv.bench.runner builds it). Per level, GenAI-Perf's metric
    names with their stats; per accuracy task its score; every request's raw record. Every field has
    a default so files of older versions still load; a run writes them all (goodput_slos only with
    --goodput)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    FILE = "results.json"
    WRITTEN_BY = "`trtkv bench`"
    WRITE_DEFAULTS = False

    schema_id: str = Field("", alias="schema")  # "trtkv.bench/1"
    recipe: str = ""
    kv_cache: str = ""  # the recipe's quantization.kv_cache
    endpoint: BenchEndpoint | None = None
    started_at: str = ""
    wall_seconds: float | None = None
    partial: bool = False  # interrupted: the levels and tasks that finished
    interrupted_during: str | None = None
    workload: BenchWorkload | None = None
    token_counting: str = ""  # how tokens are counted (trtkv.bench.outputs.results.TOKEN_COUNTING)
    token_count_check: dict[str, int] = {}  # {"requests", "equal", ...}: counts of requests
    levels: dict[str, BenchLevel] = {}  # "concurrency=N" / "rate=R/s" -> its metrics
    accuracy: dict[str, TaskScore] = {}  # task -> its score, or why it did not run
    slo: BenchSLOs | None = None
    records: list[RequestRecordDoc] = []  # every request, as sent and answered
    time_origin: TimeOrigin | None = None
    goodput_slos: dict[str, float] | None = None  # --goodput's thresholds (ms)
    tool_versions: dict[str, str | None] | None = None
    sweep: BenchSweep | None = None  # --sweep-input: per level, samples and fits against length
    kv_pool: KVPoolCheck | None = None  # planned against served (trtkv.serving.pool.compare)
    # bench.prefix's workload: per level, the server's prefix-cache hit rates and the shape
    prefix: dict[str, PrefixLevel] | None = None
    warnings: list[str] = []  # e.g. a served KV pool more than 10% short of the plan
