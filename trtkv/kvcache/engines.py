"""The KV-format registry (trtkv/data/kv_formats.json), loaded and checked strictly in one place:
one typed row per format with its numerics, its storage cost (bits, scales, dequantization work),
the recipe choice it is (name, kind, checkpoint kv_cache_quant_algo, help), the value each engine
version selects it with, and which attention backends implement it. Every other module derives its
view from these rows (the KVFormat and KVCacheQuant enums, the checkpoint algo maps, the planner's
bytes and costs, the engines' flags). Light: json and dataclasses only (the CLI reads it at
start-up)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from trtkv.core.errors import TrtkvError

TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "kv_formats.json"
# Another registry file in place of the shipped one (tests add a format from a fixture row with it)
TABLE_ENV = "TRTKV_KV_FORMATS"
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
# Each object's keys: name -> (allowed types, required). str | None is (str, type(None)).
Keys = Mapping[str, tuple[tuple[type, ...], bool]]
_S: tuple[type, ...] = (str,)
_N: tuple[type, ...] = (str, type(None))
ROW_KEYS: Keys = {
    "probe": (_N, True),
    "aliases": ((list,), False),
    "numerics": ((dict,), True),
    "engines": ((list,), True),
    "verified": ((dict,), False),
    "note": (_S, False),
    "why_not_in_probe": (_S, False),
    "readers": ((dict,), False),
    "storage": ((dict,), False),
    "recipe": ((dict,), False),
}
NUMERIC_KEYS: Keys = {
    **{f: (_S, True) for f in NUMERIC_FIELDS},
    "scale_bytes_per_token_head": ((int,), False),
    "boundary_layers_kept": (_S, False),
    "norm_correction": ((bool,), False),
}
ENGINE_KEYS: Keys = {
    **{f: (_S, True) for f in ROW_FIELDS},
    "source": ((dict,), True),
    "note": (_S, False),
}
SOURCE_KEYS: Keys = {"file": (_S, True), "at": (_S, True)}
VERIFIED_KEYS: Keys = {
    **{k: (_S, False) for k in ("against", "test", "at", "not_modelled", "result")},
    "files": ((str, list), False),
}
STORAGE_KEYS: Keys = {
    "bits": ((int,), True),
    "static_scale": ((bool,), True),
    "group_size": ((int, type(None)), True),
    "asymmetric": ((bool,), True),
    "dequant_ops": ((int,), True),
    "description": (_S, True),
    "help": (_S, True),
    "codec": (_S, False),
}
RECIPE_KEYS: Keys = {
    "name": (_S, True),
    "kind": (_S, True),
    "checkpoint_algo": (_N, True),
    "storage": (_S, True),
    "aliases": ((list,), True),
    "help": (_S, True),
}
# calibrated: trtkv computes the scales and the checkpoint records checkpoint_algo;
# calibrated_engine: calibrated too, in the form one engine reads; engine: the engine computes the
# scales (or uses 1.0) from its own flag, the export carries no KV quantization; unquantized: the
# model dtype.
RECIPE_KINDS = ("calibrated", "calibrated_engine", "engine", "unquantized")


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
class Storage:
    """How a format stores K and V: what the planner prices and the probe's codec implements."""

    bits: int
    static_scale: bool  # calibrated once (can clip) vs computed from the data (dynamic)
    group_size: int | None  # channels (or tokens for KIVI's K) that share a scale/zero point
    asymmetric: bool
    dequant_ops: int  # operations per K/V element read to turn it back into 16-bit (plan.speed)
    description: str
    help: str
    codec: str  # the probe's and the cache's codec (trtkv.kvcache.codecs.CODECS); default: the row


@dataclass(frozen=True)
class RecipeChoice:
    """A format as a recipe's quantization.kv_cache value."""

    name: str
    kind: str  # one of RECIPE_KINDS
    checkpoint_algo: str | None  # the checkpoint's quantization.kv_cache_quant_algo (None: null)
    storage: str  # the storage row it costs as (fp8_attn_head: fp8); the model dtype if unquantized
    aliases: tuple[str, ...]  # familiar spellings accepted in recipes
    help: str


@dataclass(frozen=True)
class FormatRow:
    """One format: its numerics, its name in trtkv's probe (or why it is not there), its storage and
    recipe choice where it is one, and the engines that serve it."""

    name: str
    numerics: dict
    engines: tuple[EngineRow, ...]
    probe: str | None
    aliases: tuple[str, ...]
    why_not_in_probe: str
    verified: dict
    note: str
    storage: Storage | None = None
    recipe: RecipeChoice | None = None

    def numerics_key(self) -> str:
        """A short hash of the numerics: cached probe results made under another definition no
        longer match."""
        return hashlib.sha256(json.dumps(self.numerics, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def choice(self) -> RecipeChoice:
        """The recipe choice this row is (an error for a row that is none)."""
        if self.recipe is None:
            raise TrtkvError(f"KV format {self.name} is no recipe quantization.kv_cache value.")
        return self.recipe

    def engine_rows(self, engine: str, version_prefix: str = "") -> list[EngineRow]:
        """The rows of `engine` (whose version starts with `version_prefix`) that select it."""
        return [
            e for e in self.engines if e.engine == engine and e.version.startswith(version_prefix)
        ]

    def engine_value(self, engine: str, version_prefix: str = "") -> str | None:
        """The value `engine`'s first row selects this format with (None: no row)."""
        rows = self.engine_rows(engine, version_prefix)
        return rows[0].value if rows else None


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
        """The row of a table name, a probe name, an alias or a recipe choice (fp8_cast, none)."""
        return self.formats.get(name) or self.for_probe(name) or self.for_recipe(name)

    def for_recipe(self, name: str) -> FormatRow | None:
        """The row of a recipe quantization.kv_cache value (None for names that are not one)."""
        return next((r for r in self.recipe_rows() if r.recipe and r.recipe.name == name), None)

    def storage_rows(self) -> list[FormatRow]:
        """The storage formats (trtkv.kvcache.formats.KVFormat), in table order."""
        return [r for r in self.formats.values() if r.storage is not None]

    def recipe_rows(self) -> list[FormatRow]:
        """The recipe's quantization.kv_cache choices (trtkv.recipe.enums.KVCacheQuant), in table
        order."""
        return [r for r in self.formats.values() if r.recipe is not None]

    def for_checkpoint_algo(self, algo: str | None) -> FormatRow | None:
        """The format a checkpoint's kv_cache_quant_algo stores (FP8 -> fp8, null -> none): the
        calibrated (or unquantized) row that writes it."""
        kind = "unquantized" if algo is None else "calibrated"
        return next(
            (
                r
                for r in self.recipe_rows()
                if r.recipe and r.recipe.kind == kind and r.recipe.checkpoint_algo == algo
            ),
            None,
        )

    def engine_rows(self, name: str, engine: str, version_prefix: str = "") -> list[EngineRow]:
        """The rows of `engine` (whose version starts with `version_prefix`) that select format
        `name`."""
        row = self.row(name)
        return row.engine_rows(engine, version_prefix) if row else []

    def backends(self, engine: str, value: str) -> list[dict]:
        """The attention backends of `engine` whose sources list `value` (vLLM's and SGLang's; []
        when none)."""
        return list(self.implementations.get(engine, {}).get("backends", {}).get(value, []))


def _fail(path: Path, where: str, problem: str) -> TrtkvError:
    return TrtkvError(
        f"{path}: {where}: {problem}. Next: fix the row (python scripts/refresh_kv_formats.py "
        "rewrites implementations.vllm from vLLM's sources)."
    )


def _checked(path: Path, where: str, raw: Any, keys: Keys) -> dict:
    """`raw` as an object with exactly these keys: each required one present, none unknown, every
    value of its type (a bool is not an int)."""
    if not isinstance(raw, dict):
        raise _fail(path, where, f"expected an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise _fail(path, where, f"unknown field {', '.join(unknown)} (allowed: {', '.join(keys)})")
    missing = [k for k, (_t, required) in keys.items() if required and k not in raw]
    if missing:
        raise _fail(path, where, f"missing {', '.join(missing)}")
    for key, value in raw.items():
        types = keys[key][0]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            allowed = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise _fail(
                path, f"{where}.{key}", f"{value!r} is a {type(value).__name__}, not {allowed}"
            )
    return raw


def _strings(path: Path, where: str, raw: list) -> tuple[str, ...]:
    bad = [v for v in raw if not isinstance(v, str)]
    if bad:
        raise _fail(path, where, f"{bad[0]!r} is not a string")
    return tuple(raw)


def _engine_row(path: Path, where: str, raw: Any) -> EngineRow:
    raw = _checked(path, where, raw, ENGINE_KEYS)
    src = raw["source"]
    if not isinstance(src, dict) or not src.get("file") or not src.get("at"):
        raise _fail(
            path,
            where,
            f"source {src!r} must name the upstream file and the commit or release it was read at",
        )
    _checked(path, f"{where}.source", src, SOURCE_KEYS)
    return EngineRow(
        engine=raw["engine"],
        version=raw["version"],
        config=raw["config"],
        value=raw["value"],
        checkpoint_scales=raw["checkpoint_scales"],
        source_file=src["file"],
        source_at=src["at"],
        note=raw.get("note", ""),
    )


def _recipe(path: Path, where: str, raw: Any, names: set[str]) -> RecipeChoice:
    raw = _checked(path, where, raw, RECIPE_KEYS)
    if raw["kind"] not in RECIPE_KINDS:
        raise _fail(
            path, f"{where}.kind", f"{raw['kind']!r} is not one of {', '.join(RECIPE_KINDS)}"
        )
    if raw["storage"] not in names:
        raise _fail(path, f"{where}.storage", f"{raw['storage']!r} is no row with a storage block")
    if (raw["checkpoint_algo"] is None) != (raw["kind"] in ("engine", "unquantized")):
        raise _fail(
            path, f"{where}.checkpoint_algo", "calibrated kinds name one, the others have null"
        )
    return RecipeChoice(**{**raw, "aliases": _strings(path, f"{where}.aliases", raw["aliases"])})


def parse_table(doc: dict, path: Path = TABLE_PATH) -> FormatTable:
    """Check and type a table document strictly: unknown keys and wrong types are errors naming the
    file, the row and the field; every format's numerics complete, every engine row sourced."""
    if not isinstance(doc, dict) or not isinstance(doc.get("formats"), dict):
        raise _fail(path, "top level", "expected an object with 'formats'")
    raws = {n: _checked(path, f"formats.{n}", r, ROW_KEYS) for n, r in doc["formats"].items()}
    storages = {n for n, r in raws.items() if "storage" in r}
    rows = {}
    for name, raw in raws.items():
        where = f"formats.{name}"
        numerics = _checked(path, f"{where}.numerics", raw["numerics"], NUMERIC_KEYS)
        if raw["probe"] is None and not raw.get("why_not_in_probe"):
            raise _fail(path, where, "not in the probe, so it must say why_not_in_probe")
        storage = raw.get("storage")
        if storage and storage.get("codec", name) not in storages:
            raise _fail(path, f"{where}.storage.codec", f"{storage['codec']!r} is no storage row")
        recipe = raw.get("recipe")
        rows[name] = FormatRow(
            name=name,
            numerics=dict(numerics),
            engines=tuple(
                _engine_row(path, f"{where}.engines[{i}]", e) for i, e in enumerate(raw["engines"])
            ),
            probe=raw["probe"],
            aliases=_strings(path, f"{where}.aliases", raw.get("aliases", [])),
            why_not_in_probe=raw.get("why_not_in_probe", ""),
            verified=dict(
                _checked(path, f"{where}.verified", raw.get("verified", {}), VERIFIED_KEYS)
            ),
            note=raw.get("note", ""),
            storage=None
            if storage is None
            else Storage(
                **{"codec": name, **_checked(path, f"{where}.storage", storage, STORAGE_KEYS)}
            ),
            recipe=None if recipe is None else _recipe(path, f"{where}.recipe", recipe, storages),
        )
    table = FormatTable(formats=rows, implementations=dict(doc.get("implementations", {})))
    for algo in {r.recipe.checkpoint_algo for r in rows.values() if r.recipe}:
        if table.for_checkpoint_algo(algo) is None:
            raise _fail(path, "formats", f"no calibrated row stores kv_cache_quant_algo {algo}")
    return table


def table_path() -> Path:
    """The registry file: the shipped one, or $TRTKV_KV_FORMATS."""
    return Path(os.environ.get(TABLE_ENV) or TABLE_PATH)


def load_table(path: Path | None = None) -> FormatTable:
    """The registry (read once): the shipped file, or the one $TRTKV_KV_FORMATS names."""
    return _load(path or table_path())


@lru_cache(maxsize=4)
def _load(path: Path) -> FormatTable:
    return parse_table(read_table_doc(path), path)


def read_table_doc(path: Path) -> Any:
    """The KV format table file's JSON; a TrtkvError naming it when it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TrtkvError(
            f"{path}: cannot read the KV format table ({exc}). Next: reinstall trtkv."
        ) from None


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
