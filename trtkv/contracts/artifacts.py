"""One typed model per file a stage writes, with where it lives, `load` and `save`; every reader
goes through these.

    ServerRecord   engines/<recipe>/serve/server.json        trtkv serve (pid, ports, command, log, container)
    Manifest       <stage folder>/manifest.json             every stage (calibrate, build, repo, bench, serve, probe)
    KVScalesFile   engines/<recipe>/checkpoint/kv_scales.json trtkv calibrate (trtkv.kvcache.scales writes it)
    BenchResults   engines/<recipe>/bench/results.json      trtkv bench (trtkv.bench.runner builds it)
    ProbeDoc       engines/<recipe>/probe/probe.json        trtkv probe (trtkv.contracts.probe_doc)
    (Sizing        deploy/<recipe>/<target>/sizing.json     trtkv deploy: trtkv.deploy.sizing, an Artifact too)

Writers build these models with keywords and `save` them; readers `load` them. The big documents
(results, probe) type their top level and keep what is below as written (extra="allow"), so a reader
never rebuilds a path or parses a file by hand. Light: pydantic and json only.
"""  # noqa: E501

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from trtkv.contracts.prefix import PrefixLevel
from trtkv.core.errors import StageError
from trtkv.core.files import NotReadable, naming, read_json
from trtkv.core.paths import temp_sibling

T = TypeVar("T", bound="Artifact")
PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no pid is larger


class Artifact(BaseModel):
    """A JSON file in a stage folder: `path(folder)`, `load(folder)` (None when absent),
    `save(folder)` (atomic)."""

    model_config = ConfigDict(extra="allow")
    FILE: ClassVar[str]
    WRITTEN_BY: ClassVar[str]
    # False: `save` writes only the fields its writer set (optional fields appear in the files whose
    # writer gives them)
    WRITE_DEFAULTS: ClassVar[bool] = True
    # results and probe documents of long sweeps; records are far smaller
    MAX_BYTES: ClassVar[int] = 256 << 20

    @classmethod
    def path(cls, folder: Path) -> Path:
        return Path(folder) / cls.FILE

    @classmethod
    def load(cls: type[T], folder: Path) -> T | None:
        path = cls.path(folder)
        if not path.exists() and not path.is_symlink():
            return None
        # bounded, a regular file only, strict JSON (trtkv.core.files): a damaged record is one
        # error line
        try:
            return cls.model_validate(read_json(path, cls.MAX_BYTES, cls.FILE))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(part) for part in err["loc"]) or "(top level)"
            more = f" and {exc.error_count() - 1} more" if exc.error_count() > 1 else ""
            raise StageError(
                f"{path} is not a valid {cls.FILE}: {where}: {err['msg']}{more}. Next: rerun "
                f"{cls.WRITTEN_BY}."
            ) from exc
        except NotReadable as exc:
            raise StageError(f"{path}: {exc.problem}. Next: rerun {cls.WRITTEN_BY}.") from None

    def document(self) -> dict[str, Any]:
        """What `save` writes: the fields in declaration order, then the extra ones in the order
        given."""
        return self.model_dump(exclude_unset=not self.WRITE_DEFAULTS, by_alias=True)

    def save(self, folder: Path) -> Path:
        path = self.path(folder)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_sibling(path, "tmp")
        try:
            with naming(tmp):
                tmp.write_text(json.dumps(self.document(), indent=2, default=str) + "\n")
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)  # a full disk leaves no half-written sibling
        return path


class ServerRecord(Artifact):
    """What `trtkv serve` records about the server it started
    (engines/<recipe>/serve/server.json)."""

    model_config = ConfigDict(extra="forbid")
    FILE = "server.json"
    WRITTEN_BY = "`trtkv serve` after stopping the recorded server by hand and deleting the file"
    MAX_BYTES = 1 << 20

    pid: int = Field(ge=1, le=PID_MAX)
    host: str
    http_port: int = Field(ge=1, le=65535)
    grpc_port: int = Field(ge=0, le=65535)  # 0: the server has none (an OpenAI server: HTTP only)
    metrics_port: int = Field(ge=0, le=65535)
    command: list[str]
    log: str
    model_repository: str
    started_at: str
    recipe: str = ""
    backend: str = ""
    ready_seconds: float | None = None
    # docker container name (GPU path through docker), stopped and removed by `stop`
    container: str | None = None
    # `docker run --cidfile`: the container id, which `stop` stops (not just the client)
    cidfile: str | None = None
    # the server's process session (trtkv.core.sessions)
    session_id: int | None = Field(None, ge=1, le=PID_MAX)
    # the session leader's start time (/proc/PID/stat field 22)
    session_start: int | None = Field(None, ge=0)
    # TRTKV_SERVER_SESSION in its environment, for children that call setsid
    session_marker: str | None = None
    extra: dict[str, Any] = {}  # free-form: what one server kind adds (an OpenAI frontend's name)

    @field_validator("host")
    @classmethod
    def _address(cls, value: str) -> str:
        """An address a client connects to (it lands in URLs): IP or host-name characters only."""
        if not re.fullmatch(r"[A-Za-z0-9.:\-]{1,253}", value):
            raise ValueError("not an IP address or host name")
        return value

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def client_host(self) -> str:
        """Where a client on this machine connects (a wildcard bind answers on loopback)."""
        return self.host if self.host not in ("0.0.0.0", "") else "127.0.0.1"


class SupervisorRecord(Artifact):
    """What the supervisor of `trtkv serve` records about itself
    (engines/<recipe>/serve/supervisor.json); rewritten on every state change, read by `trtkv
    status` and `trtkv stop`."""

    FILE = "supervisor.json"
    WRITTEN_BY = "`trtkv stop RECIPE` then `trtkv serve RECIPE` (the supervisor rewrites it)"
    MAX_BYTES = 1 << 20

    pid: int = Field(ge=1, le=PID_MAX)
    command: list[str] = []
    # /proc/PID/stat field 22, against pid reuse (absent in old records)
    start_time: int | None = Field(None, ge=0)
    state: str = "unknown"
    interval_s: float = 0.0
    failures: int = 0
    max_restarts: int = 0
    window_s: float = 0.0
    restarts: int = 0
    updated_at: str = ""


class ListedFile(BaseModel):
    """A file as its manifest lists it (contents.list_files): size, sha256, mtime, or link."""

    bytes: int | None = None
    sha256: str | None = None
    mtime_ns: int | None = None
    link: str | None = None


class Manifest(Artifact):
    """A stage folder's manifest.json: the recipe, the input, the key that says "up to date", the
    wall time; then the stage's own fields (extra). trtkv.contracts.stage.run_stage writes every
    field below; the stages that write their manifest themselves (serve, probe, report) write the
    ones they set."""

    FILE = "manifest.json"
    WRITTEN_BY = "the stage that writes this folder (`trtkv <stage> RECIPE --force`)"
    WRITE_DEFAULTS = False

    stage: str
    recipe: str | None = None
    recipe_path: str | None = None
    # the up-to-date key (run_stage compares it whole); None: always redone. Each stage keys on its
    # own inputs
    key: dict[str, JsonValue] | None = None
    recipe_hash: str | None = None
    input_dir: str | None = None
    input_manifest_hash: str | None = None
    resolved_recipe: dict[str, JsonValue] | None = None  # the recipe as trtkv.recipe dumps it
    tool_versions: dict[str, str | None] | None = None
    wall_seconds: float | None = None
    finished_at: str | None = None
    # every other file (trtkv.contracts.contents): "up to date" and "a valid input" both need the
    # folder to hold exactly these; None in manifests of older trtkv (checked by key only, and said
    # so). Written as read: the manifest's hash covers its exact bytes
    files: dict[str, ListedFile] | None = None


class LayerAmax(BaseModel):
    """One layer's K/V |max|: probe.json's scales.layers; kv_scales.json's add the scales."""

    layer: int
    k_amax: float
    v_amax: float


class KVScaleLayer(LayerAmax):
    """One layer of kv_scales.json: its K/V amax and both scale conventions
    (trtkv.kvcache.scales.layer_scales)."""

    kv_cache_scaling_factor: float
    k_scale: float
    v_scale: float


class KVScalesFile(Artifact):
    """kv_scales.json (written by `trtkv calibrate`): per layer K/V amax and both scale conventions
    (trtkv.kvcache.scales builds it: kv_scales_document)."""

    FILE = "kv_scales.json"
    WRITTEN_BY = "`trtkv calibrate`"
    WRITE_DEFAULTS = False

    # "FP8", "INT8", "NVFP4"; None: an unquantized KV cache (no layers)
    kv_cache_quant_algo: str | None
    num_layers: int
    convention: str
    # where the amaxes came from, when not a calibrate run (trtkv.kvcache.scales.KVScales)
    source: str | None = None
    layers: list[KVScaleLayer]


class BenchEndpoint(BaseModel):
    """Where `trtkv bench` measured: results.json's "endpoint"."""

    model_config = ConfigDict(extra="allow")

    url: str
    protocol: str  # a trtkv.recipe.Protocol value: grpc, http or openai
    model: str
    source: str = ""  # where the URL came from (--url, server.json, the recipe)
    endpoint_type: str | None = None  # protocol openai only: completions or chat


class BenchWorkload(BaseModel):
    """What `trtkv bench` sent: results.json's "workload" (the recipe's bench section, and how the
    levels are run)."""

    model_config = ConfigDict(extra="allow")

    input_tokens: int
    output_tokens: int
    num_requests: int
    warmup_requests: int
    concurrency: list[int]
    request_rate: float | None
    accuracy_concurrency: int
    request_timeout_s: float
    mode: str  # "concurrency sweep [...]" or "request rate R/s"
    sampling: str


class SLOVerdict(BaseModel):
    """One SLO checked (trtkv.bench.outputs.slo.SLOResult.to_json)."""

    model_config = ConfigDict(extra="allow")

    slo: str  # as written: "time_to_first_token.p99<=500"
    source: str = ""  # where it was set: the recipe, --slo, the default
    where: str = ""  # the level ("concurrency=4") or task it was checked on
    measured: float | None = None
    passed: bool


class BenchSLOs(BaseModel):
    """results.json's "slo": the verdict and one entry per SLO (trtkv.bench.outputs.slo)."""

    model_config = ConfigDict(extra="allow")

    passed: bool
    results: list[SLOVerdict] = []


class MetricStats(BaseModel):
    """One metric of a level in GenAI-Perf's shape (trtkv.measures.stats.summarize): a request
    metric has every stat, a run metric (throughput, duration) its unit and avg. NaN: no value
    measured."""

    model_config = ConfigDict(extra="allow")

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


class ClientLag(BaseModel):
    """How long bytes already received waited for the client to read them
    (trtkv.bench.load.levels)."""

    model_config = ConfigDict(extra="allow")

    unit: str = "ms"
    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    count: int = 0


class ClientWorker(BaseModel):
    """One client process of a level (trtkv.bench.load.levels.client_summary)."""

    model_config = ConfigDict(extra="allow")

    worker: int
    pid: int | None = None
    streams: int = 0
    requests: int = 0
    output_tokens: int = 0
    cpu_seconds: float | None = None
    cpu_cores: float | None = None
    cpu_us_per_token: float | None = None
    lag_ms: ClientLag | None = None


class ClientSummary(BaseModel):
    """A level's client: its processes, their CPU per streamed token, its own lag, and a warning
    when the client may have held the level back (trtkv.bench.load.levels.client_summary)."""

    model_config = ConfigDict(extra="allow")

    workers: int
    decided: str = ""
    core_share: float | None = None
    warmup_load_cores: float | None = None
    cpu_cores: float | None = None
    cpu_us_per_token: float | None = None
    lag_ms: ClientLag | None = None
    per_worker: list[ClientWorker] = []
    warning: str | None = None


class BenchLevel(BaseModel):
    """One level of results.json's "levels" (trtkv.measures.metrics.summarize_level): GenAI-Perf's
    metric names in the order written; an absent metric is None (files of older versions)."""

    model_config = ConfigDict(extra="allow")

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


class KVPoolCheck(BaseModel):
    """results.json's "kv_pool": the served KV pool per GPU beside the planned one
    (trtkv.serving.pool.compare); served_* None when the engine reported nothing readable, and
    `source` says why."""

    model_config = ConfigDict(extra="allow")

    planned_bytes_per_gpu: float | None = None  # None: the read-back failed before the plan
    rule: str | None = None  # the engine and release whose pool rule the plan follows
    served_bytes_per_gpu: float | None = None
    served_tokens: int | None = None
    source: str | None = None
    served_over_planned: float | None = None
    warning: str | None = None  # served more than 10% below the plan


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
    # task -> its score, or why it did not run; free-form: each task scores in its own figures
    accuracy: dict[str, dict[str, Any]] = {}
    slo: BenchSLOs | None = None
    # RequestRecord.to_json per request: trtkv.measures.records types and reads them (above this)
    records: list[dict[str, Any]] = []
    time_origin: TimeOrigin | None = None
    goodput_slos: dict[str, float] | None = None  # --goodput's thresholds (ms)
    tool_versions: dict[str, str | None] | None = None
    # --sweep-input: per level, samples and fits against input length (trtkv.measures.sweep reads)
    sweep: dict[str, Any] | None = None
    kv_pool: KVPoolCheck | None = None  # planned against served (trtkv.serving.pool.compare)
    # bench.prefix's workload: per level, the server's prefix-cache hit rates and the shape
    prefix: dict[str, PrefixLevel] | None = None
    warnings: list[str] = []  # e.g. a served KV pool more than 10% short of the plan
