"""One typed model per file a stage writes, with where it lives, `load` and `save`; every reader
goes through these.

    ServerRecord   engines/<recipe>/serve/server.json        trtkv serve (pid, ports, command, log, container)
    Manifest       <stage folder>/manifest.json             every stage (calibrate, build, repo, bench, serve, probe)
    KVScalesFile   engines/<recipe>/checkpoint/kv_scales.json trtkv calibrate (trtkv.kvcache.scales writes it)
    BenchResults   engines/<recipe>/bench/results.json      trtkv bench (trtkv.contracts.bench_doc)
    ProbeDoc       engines/<recipe>/probe/probe.json        trtkv probe (trtkv.contracts.probe_doc)
    (Sizing        deploy/<recipe>/<target>/sizing.json     trtkv deploy: trtkv.deploy.sizing, an Artifact too)

Writers build these models with keywords and `save` them; readers `load` them, so a reader never
rebuilds a path or parses a file by hand; what a reader reads by key is a declared field, and only
what each writer adds of its own stays as written (extra="allow"). Light: pydantic and json only.
"""  # noqa: E501

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from trtkv.core.errors import StageError
from trtkv.core.files import NotReadable, naming, read_json
from trtkv.core.paths import temp_sibling

T = TypeVar("T", bound="Artifact")
PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no pid is larger


class Kept(BaseModel):
    """A part of a document that keeps a key of another trtkv version as written."""

    model_config = ConfigDict(extra="allow")


class Artifact(Kept):
    """A JSON file in a stage folder: `path(folder)`, `load(folder)` (None when absent),
    `save(folder)` (atomic)."""

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
    # the server answering (tritonserver, or an OpenAI frontend: trtllm-serve, vllm, sglang) and the
    # model name an OpenAI frontend serves
    frontend: str = "tritonserver"
    served_model_name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _older(cls, data: Any) -> Any:
        """server.json of trtkv before 2026-12-08 held the frontend and its model under "extra"."""
        if isinstance(data, dict) and isinstance(data.get("extra"), dict):
            data = {**data["extra"], **{k: v for k, v in data.items() if k != "extra"}}
        return data

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
