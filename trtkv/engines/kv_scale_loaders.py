"""What each engine does with a checkpoint's KV scale tensors (trtkv/data/kv_scale_loaders.json),
loaded and checked strictly in one place: per engine and pinned version, the loader's name rules per
architecture (first match wins) and the pairing table that turns a layer's loaded K and V into the
scales the kernel uses. Every rule carries the engine source file and lines it was read from.

Assumptions (said where they are made): the engine runs an FP8 KV cache and accepts the checkpoint's
quantization config (vLLM and SGLang create their k/v scale parameters only then); SGLang's loader
is its default legacy path (SGLANG_ENABLE_WEIGHT_LOADER_V2 off); a value's class is what the
engines' own `> 0.0` / `< 0.0` tests see, so inf and subnormals are `positive`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from trtkv.core.errors import TrtkvError

TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "kv_scale_loaders.json"
CLASSES = ("positive", "zero", "negative", "nan", "absent")
OUTCOMES = ("load", "drop_warn", "drop_silent", "crash", "unused", "not_modelled")
USES = ("separate", "unity", "k_for_both", "shared", "crash")
FORMATS = ("hf", "tensorrt_llm_checkpoint")


@dataclass(frozen=True)
class Source:
    """Where a rule was read: file, lines (or the function), version or commit."""

    file: str
    lines: str
    at: str


@dataclass(frozen=True)
class NameRule:
    """One loader rule: a checkpoint name it matches and what the loader then does with it."""

    match: re.Pattern[str]
    then: str  # OUTCOMES
    source: Source
    as_kind: str | None = None  # the kind it loads as; None: the name's own (or the match's)
    warning: str | None = None
    error: str | None = None
    note: str | None = None

    def kind_for(self, name: str, stored_kind: str) -> str:
        if self.as_kind:
            return self.as_kind
        m = self.match.search(name)
        return m.group("kind") if m and "kind" in self.match.groupindex else stored_kind


@dataclass(frozen=True)
class Loader:
    """An engine's loader for some architectures ("*": all) and its name rules."""

    architectures: tuple[str, ...]
    description: str
    source: Source
    rules: tuple[NameRule, ...]

    def rule_for(self, name: str) -> NameRule:
        return next(r for r in self.rules if r.match.search(name))


@dataclass(frozen=True)
class PairCase:
    """One pairing case: the classes of a layer's loaded K and V (or shared KV), what is used."""

    uses: str  # USES
    source: Source
    k: tuple[str, ...] = ()
    v: tuple[str, ...] = ()
    kv: tuple[str, ...] = ()
    warning: str | None = None
    error: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class EngineScales:
    """One engine version's KV scale handling."""

    engine: str
    version: str
    reads: str  # the checkpoint format it loads: FORMATS
    kv_cache_dtype: str
    kv_algos: tuple[str | None, ...]  # the checkpoint KV algorithms the rows were read for
    pairing: tuple[PairCase, ...]
    loaders: tuple[Loader, ...]
    unknown_architecture: str  # "not_modelled", or "rules" when a "*" loader covers every one

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}"

    def loader_for(self, architecture: str | None) -> Loader | None:
        for loader in self.loaders:
            if "*" in loader.architectures or architecture in loader.architectures:
                return loader
        return None

    def pair(self, k: str, v: str, kv: str) -> PairCase:
        """The case for a layer whose loaded K, V and shared KV scales have these classes."""
        for case in self.pairing:
            if case.kv and kv in case.kv:
                return case
            if case.k and k in case.k and v in case.v:
                return case
        raise TrtkvError(
            f"{TABLE_PATH}: {self.label} pairing has no case for k={k}, v={v}, kv={kv}"
        )


@lru_cache(maxsize=1)
def engine_scales() -> tuple[EngineScales, ...]:
    """Every engine's rows from trtkv/data/kv_scale_loaders.json, checked."""
    doc = json.loads(TABLE_PATH.read_text())
    if doc.get("schema") != 1 or not isinstance(doc.get("engines"), list):
        raise TrtkvError(f"{TABLE_PATH}: schema 1 with an engines list expected")
    return tuple(_engine(row) for row in doc["engines"])


def _engine(row: dict) -> EngineScales:
    where = f"{TABLE_PATH}: engine {row.get('engine')!r}"
    if row.get("reads") not in FORMATS:
        raise TrtkvError(f"{where}: reads {row.get('reads')!r}, allowed: {', '.join(FORMATS)}")
    pairing = tuple(_case(c, where) for c in row["pairing"])
    loaders = tuple(
        Loader(
            architectures=tuple(lo["architectures"]),
            description=lo["loader"],
            source=_source(lo["source"], where),
            rules=tuple(_rule(r, where) for r in lo["rules"]),
        )
        for lo in row["loaders"]
    )
    for loader in loaders:
        if not loader.rules or loader.rules[-1].match.pattern != ".":
            raise TrtkvError(f"{where}: a loader's last rule must match every name ('.')")
    return EngineScales(
        engine=row["engine"],
        version=row["version"],
        reads=row["reads"],
        kv_cache_dtype=row["kv_cache_dtype"],
        kv_algos=tuple(row["kv_algos"]),
        pairing=pairing,
        loaders=loaders,
        unknown_architecture=row["unknown_architecture"],
    )


def _rule(r: dict, where: str) -> NameRule:
    if r.get("then") not in OUTCOMES:
        raise TrtkvError(f"{where}: rule then {r.get('then')!r}, allowed: {', '.join(OUTCOMES)}")
    return NameRule(
        match=re.compile(r["match"]),
        then=r["then"],
        source=_source(r["source"], where),
        as_kind=r.get("as"),
        warning=r.get("warning"),
        error=r.get("error"),
        note=r.get("note"),
    )


def _case(c: dict, where: str) -> PairCase:
    if c.get("uses") not in USES:
        raise TrtkvError(f"{where}: pairing uses {c.get('uses')!r}, allowed: {', '.join(USES)}")
    sides = {key: tuple(c.get(key, ())) for key in ("k", "v", "kv")}
    bad = sorted({x for side in sides.values() for x in side} - set(CLASSES))
    if bad:
        raise TrtkvError(f"{where}: pairing class {bad[0]!r}, allowed: {', '.join(CLASSES)}")
    return PairCase(
        uses=c["uses"],
        source=_source(c["source"], where),
        warning=c.get("warning"),
        error=c.get("error"),
        note=c.get("note"),
        **sides,
    )


def _source(s: dict, where: str) -> Source:
    if not all(isinstance(s.get(k), str) and s[k] for k in ("file", "lines", "at")):
        raise TrtkvError(f"{where}: every source names file, lines and at")
    return Source(s["file"], s["lines"], s["at"])
