"""The formats x engines table (trtkv/data/kv_formats.json), loaded and checked in one place:
numerics per format, the value each engine version selects it with, and which attention backends
implement it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from trtkv.core.errors import TrtkvError

TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "kv_formats.json"
NUMERIC_FIELDS = (
    "element",
    "scale_granularity",
    "scale_dtype",
    "scale",
    "rounding",
    "zero_point",
    "rotation",
    "scale_source",
)
ROW_FIELDS = ("engine", "version", "config", "value", "checkpoint_scales", "source")


@dataclass(frozen=True)
class EngineRow:
    """One engine version's way to select a format, and what it does with a checkpoint's scales."""

    engine: str
    version: str
    config: str
    value: str
    checkpoint_scales: str
    source_file: str
    source_at: str
    note: str = ""


@dataclass(frozen=True)
class FormatRow:
    """One format: its numerics, its name in trtkv's probe (or why it is not there) and the engines
    that serve it."""

    name: str
    numerics: dict
    engines: tuple[EngineRow, ...]
    probe: str | None
    aliases: tuple[str, ...]
    why_not_in_probe: str
    verified: dict
    note: str

    def numerics_key(self) -> str:
        """A short hash of the numerics: cached probe results made under another definition no
        longer match."""
        return hashlib.sha256(json.dumps(self.numerics, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FormatTable:
    """The whole table; `implementations` is per engine (vLLM: backends by cache dtype, read from
    its sources)."""

    formats: dict[str, FormatRow]
    implementations: dict

    def for_probe(self, name: str) -> FormatRow | None:
        """The row of a probe format name or alias (None for names the table does not list)."""
        for row in self.formats.values():
            if row.probe == name or name in row.aliases:
                return row
        return None

    def row(self, name: str) -> FormatRow | None:
        """The row of a table name, a probe name or an alias (recipe `quantization.kv_cache` values:
        fp8_cast, ...)."""
        return self.formats.get(name) or self.for_probe(name)

    def engine_rows(self, name: str, engine: str, version_prefix: str = "") -> list[EngineRow]:
        """The rows of `engine` (whose version starts with `version_prefix`) that select format
        `name`."""
        row = self.row(name)
        return (
            [e for e in row.engines if e.engine == engine and e.version.startswith(version_prefix)]
            if row
            else []
        )

    def backends(self, engine: str, value: str) -> list[dict]:
        """The attention backends of `engine` whose sources list `value` (vLLM's and SGLang's; []
        when none)."""
        return list(self.implementations.get(engine, {}).get("backends", {}).get(value, []))


def _fail(path: Path, where: str, problem: str) -> TrtkvError:
    return TrtkvError(
        f"{path}: {where}: {problem}. Next: fix the row (python scripts/refresh_kv_formats.py "
        "rewrites implementations.vllm from vLLM's sources)."
    )


def _engine_row(path: Path, where: str, raw: dict) -> EngineRow:
    missing = [f for f in ROW_FIELDS if f not in raw]
    if missing:
        raise _fail(
            path, where, f"missing {', '.join(missing)} (each row needs {', '.join(ROW_FIELDS)})"
        )
    src = raw["source"]
    if not isinstance(src, dict) or not src.get("file") or not src.get("at"):
        raise _fail(
            path,
            where,
            f"source {src!r} must name the upstream file and the commit or release it was read at",
        )
    return EngineRow(
        engine=str(raw["engine"]),
        version=str(raw["version"]),
        config=str(raw["config"]),
        value=str(raw["value"]),
        checkpoint_scales=str(raw["checkpoint_scales"]),
        source_file=str(src["file"]),
        source_at=str(src["at"]),
        note=str(raw.get("note", "")),
    )


def parse_table(doc: dict, path: Path = TABLE_PATH) -> FormatTable:
    """Check and type a table document (every format's numerics complete, every engine row
    sourced)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("formats"), dict):
        raise _fail(path, "top level", "expected an object with 'formats'")
    rows = {}
    for name, raw in doc["formats"].items():
        numerics = raw.get("numerics", {})
        missing = [f for f in NUMERIC_FIELDS if f not in numerics]
        if missing:
            raise _fail(path, f"formats.{name}.numerics", f"missing {', '.join(missing)}")
        if raw.get("probe") is None and not raw.get("why_not_in_probe"):
            raise _fail(
                path, f"formats.{name}", "not in the probe, so it must say why_not_in_probe"
            )
        engines = tuple(
            _engine_row(path, f"formats.{name}.engines[{i}]", e)
            for i, e in enumerate(raw.get("engines", []))
        )
        rows[name] = FormatRow(
            name=name,
            numerics=dict(numerics),
            engines=engines,
            probe=raw.get("probe"),
            aliases=tuple(raw.get("aliases", ())),
            why_not_in_probe=str(raw.get("why_not_in_probe", "")),
            verified=dict(raw.get("verified", {})),
            note=str(raw.get("note", "")),
        )
    return FormatTable(formats=rows, implementations=dict(doc.get("implementations", {})))


@lru_cache(maxsize=1)
def load_table(path: Path = TABLE_PATH) -> FormatTable:
    """The shipped table (read once)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TrtkvError(
            f"{path}: cannot read the KV format table ({exc}). Next: reinstall trtkv."
        ) from None
    return parse_table(doc, path)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _backend(b: dict) -> str:
    cap = b["capability"]
    return (
        b["backend"] if cap == "True" or cap.startswith("inherited") else f"{b['backend']} ({cap})"
    )


def _listed(table: FormatTable, row: FormatRow) -> set[tuple[str, str]]:
    """The (engine, value) pairs of a row with a backend list: every value of an engine whose list
    is complete (`backends_complete`: an empty list says none implements it), others' where the
    table lists backends."""
    impl = table.implementations
    return {
        (e.engine, e.value)
        for e in row.engines
        if impl.get(e.engine, {}).get("backends")
        and (impl[e.engine].get("backends_complete") or table.backends(e.engine, e.value))
    }


def _backends_cell(table: FormatTable, engine: str, value: str) -> str:
    """Unnamed for the first engine of the table's implementations (the column header names it),
    named otherwise."""
    named = "" if engine == next(iter(table.implementations), None) else f"{engine} "
    return f"{named}`{value}`: " + (
        ", ".join(_backend(b) for b in table.backends(engine, value)) or "none listed"
    )


def table_markdown(table: FormatTable | None = None) -> str:
    """docs/kv-formats.md's generated section: per format its numerics, per engine the value that
    selects it and what happens to checkpoint scales, vLLM's attention backends for that value, and
    each row's upstream file@commit."""
    table = table or load_table()
    lines = [
        "| format (probe name) | numerics | engine: value (checkpoint scales) | attention backends "
        "(vLLM's unless named) | read from |",
        "|---|---|---|---|---|",
    ]
    for row in table.formats.values():
        n = row.numerics
        numerics = (
            f"{n['element']}; scale {n['scale']} ({n['scale_granularity']}, {n['scale_dtype']}); "
            f"rounding {n['rounding']}; zero point {n['zero_point']}; rotation {n['rotation']}; "
            f"scales from {n['scale_source']}"
        )
        probe = row.probe or f"not in the probe: {row.why_not_in_probe}"
        aliases = f"; alias {', '.join(row.aliases)}" if row.aliases else ""
        engs = "<br>".join(
            f"{e.engine} {e.version}: `{e.config} {e.value}` ({e.checkpoint_scales})"
            for e in row.engines
        )
        backends = (
            "<br>".join(_backends_cell(table, eng, v) for eng, v in sorted(_listed(table, row)))
            or "-"
        )
        sources = (
            "<br>".join(sorted({f"{e.source_file} @ {e.source_at}" for e in row.engines})) or "-"
        )
        lines.append(
            f"| **{row.name}** ({_cell(probe)}{aliases}) | {_cell(numerics)} | "
            f"{_cell(engs) or '-'} | {_cell(backends)} | {_cell(sources)} |"
        )
    notes = [
        f"- {engine}: {note}"
        for engine, impl in table.implementations.items()
        for note in impl.get("notes", [])
    ]
    return "\n".join(lines + ([""] + notes if notes else []))
