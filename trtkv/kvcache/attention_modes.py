"""Attention numerics per engine kernel (trtkv/data/kv_formats.json, section `attention`): which
tensors an engine's attention kernel holds in which precision when the KV cache is quantized, and
which mode a deployment runs.

A mode has a prefill (context) and a decode (generation) kernel; each kernel says
- Q: `none` (16/32-bit) or `fp8_e4m3`, quantized with `q_scale`: `checkpoint_q_scale` (vLLM: the
  checkpoint's q_scale, 1.0 when absent), `kv_scale` (TensorRT-LLM: the layer's shared KV-cache
  scale), `unit_cast` (SGLang: a cast, no scale);
- K/V: `cache` (the stored format, dequantized exactly) or `fresh` (the prompt's own 16-bit K/V:
  TensorRT-LLM's context FMHA without paged context FMHA);
- P, the softmax probabilities: `none` or `fp8_e4m3`: exp(s - running max) x `p_scale` cast to E4M3
  per KV tile of `kv_tile` tokens (by head_dim; `kv_tile_sliding` for sliding-window layers), tiles
  processed `first_to_last` or `last_to_first`, the row sum taken from the unquantized P;
- the accumulation precision, as text, and the upstream files (and commits) every fact was read
  from.

Light (no torch): `trtkv plan`, the recipe rules and the CLI read it. The numerics live in
trtkv.kvcache.attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from trtkv.core.errors import TrtkvError
from trtkv.kvcache.engines import TABLE_PATH, read_table_doc

CACHE_ONLY = "cache_only"
AUTO = "auto"
Q_MODES = ("none", "fp8_e4m3")
Q_SCALES = ("none", "checkpoint_q_scale", "kv_scale", "unit_cast")
KV_SOURCES = ("cache", "fresh")
P_MODES = ("none", "fp8_e4m3")
ORDERS = ("first_to_last", "last_to_first")


@dataclass(frozen=True)
class Source:
    """Where a fact was read: the upstream file, the commit (or release) and what it says."""

    file: str
    at: str
    says: str


@dataclass(frozen=True)
class KernelNumerics:
    """One attention kernel's numerics (prefill or decode)."""

    kernel: str
    q: str
    q_scale: str
    kv: str
    p: str
    p_scale: float
    kv_tile: tuple[tuple[int, int], ...]
    kv_tile_sliding: tuple[tuple[int, int], ...]
    tile_order: str
    accumulation: str
    sources: tuple[Source, ...]

    @property
    def quantizes(self) -> bool:
        """Whether the kernel computes anything but dequantize-on-read attention."""
        return self.q != "none" or self.p != "none" or self.kv == "fresh"

    def tile(self, head_dim: int, sliding: bool = False) -> int | None:
        """The KV tile (tokens) P is quantized per, for a head_dim (None when P is not
        quantized)."""
        table = self.kv_tile_sliding if sliding and self.kv_tile_sliding else self.kv_tile
        if self.p == "none" or not table:
            return None
        for limit, tokens in table:
            if head_dim <= limit:
                return tokens
        raise TrtkvError(
            f"attention kernel {self.kernel!r}: no KV tile for head_dim {head_dim} (the table goes "
            f"to {table[-1][0]}). Next: probe with --attention cache_only, or add the row to "
            f"trtkv/data/kv_formats.json."
        )


@dataclass(frozen=True)
class AttentionMode:
    """A named engine attention path: its prefill and decode kernels and the probe formats it
    reads."""

    name: str
    engine: str
    description: str
    prefill: KernelNumerics
    decode: KernelNumerics
    probe_formats: tuple[str, ...]

    @property
    def quantizes(self) -> bool:
        return self.prefill.quantizes or self.decode.quantizes

    def drifts(self, head_dim: int, sliding: bool = False) -> bool:
        """Whether prefill and decode compute differently (different numerics or KV tiles)."""
        a, b = self.prefill, self.decode
        return (a.q, a.q_scale, a.kv, a.p, a.p_scale, a.tile_order, a.tile(head_dim, sliding)) != (
            b.q,
            b.q_scale,
            b.kv,
            b.p,
            b.p_scale,
            b.tile_order,
            b.tile(head_dim, sliding),
        )


@dataclass(frozen=True)
class Selection:
    """One rule of `selection`: an engine, KV dtypes, GPU compute capabilities and recipe flags -> a
    mode."""

    engine: str
    kv: tuple[str, ...]
    sm: tuple[str, ...]
    when: dict[str, Any]
    mode: str
    why: str
    source: Source | None

    def matches(
        self, engine: str, kv: str, sm: tuple[int, int] | None, flags: dict[str, Any]
    ) -> bool:
        sm_text = f"{sm[0]}.{sm[1]}" if sm else "cpu"
        return (
            self.engine == engine
            and ("*" in self.kv or kv in self.kv)
            and ("*" in self.sm or sm_text in self.sm)
            and all(flags.get(k) == v for k, v in self.when.items())
        )


@dataclass(frozen=True)
class AttentionTable:
    modes: dict[str, AttentionMode]
    selection: tuple[Selection, ...]
    not_modelled: tuple[str, ...]

    def mode(self, name: str) -> AttentionMode:
        if name not in self.modes:
            raise TrtkvError(
                f"unknown attention mode {name!r}. Allowed: {AUTO}, {', '.join(self.modes)}. Next: "
                "pick one (trtkv/data/kv_formats.json, section attention, lists each mode's "
                "kernels)."
            )
        return self.modes[name]


def _fail(where: str, problem: str) -> TrtkvError:
    return TrtkvError(f"{TABLE_PATH}: attention.{where}: {problem}. Next: fix the row.")


def _source(raw: dict, where: str) -> Source:
    if not isinstance(raw, dict) or not all(raw.get(k) for k in ("file", "at", "says")):
        raise _fail(where, f"a source needs file, at and says, got {raw!r}")
    return Source(str(raw["file"]), str(raw["at"]), str(raw["says"]))


def _choice(raw: dict, key: str, allowed: tuple[str, ...], where: str) -> str:
    value = raw.get(key)
    if value not in allowed:
        raise _fail(where, f"{key} {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _tiles(raw: Any, where: str) -> tuple[tuple[int, int], ...]:
    pairs = tuple((int(a), int(b)) for a, b in (raw or ()))
    if any(b <= 0 for _, b in pairs) or [a for a, _ in pairs] != sorted(a for a, _ in pairs):
        raise _fail(
            where, f"kv_tile {raw!r} must be [max head_dim, tokens] pairs in rising head_dim"
        )
    return pairs


def _kernel(raw: Any, modes_raw: dict, where: str, seen: tuple[str, ...] = ()) -> KernelNumerics:
    if isinstance(raw, str):  # "other_mode.prefill": the same kernel as another mode's
        name, _, phase = raw.partition(".")
        if raw in seen or name not in modes_raw or phase not in ("prefill", "decode"):
            raise _fail(where, f"reference {raw!r} names no other mode's prefill or decode")
        return _kernel(modes_raw[name][phase], modes_raw, f"modes.{raw}", (*seen, raw))
    numerics = KernelNumerics(
        kernel=str(raw.get("kernel", "")),
        q=_choice(raw, "q", Q_MODES, where),
        q_scale=_choice(raw, "q_scale", Q_SCALES, where),
        kv=_choice(raw, "kv", KV_SOURCES, where),
        p=_choice(raw, "p", P_MODES, where),
        p_scale=float(raw.get("p_scale", 1.0)),
        kv_tile=_tiles(raw.get("kv_tile"), where),
        kv_tile_sliding=_tiles(raw.get("kv_tile_sliding"), where),
        tile_order=_choice(raw, "tile_order", ORDERS, where),
        accumulation=str(raw.get("accumulation", "")),
        sources=tuple(
            _source(s, f"{where}.sources[{i}]") for i, s in enumerate(raw.get("sources", []))
        ),
    )
    if numerics.p != "none" and not numerics.kv_tile:
        raise _fail(where, "P is quantized, so the kernel needs its kv_tile")
    if numerics.quantizes and not numerics.sources:
        raise _fail(
            where, "an engine kernel must name the upstream file and commit it was read from"
        )
    return numerics


def parse_attention(doc: dict) -> AttentionTable:
    """Check and type the `attention` section of a kv_formats.json document."""
    raw = doc.get("attention")
    if not isinstance(raw, dict) or not isinstance(raw.get("modes"), dict):
        raise _fail("modes", "missing")
    modes = {}
    for name, m in raw["modes"].items():
        modes[name] = AttentionMode(
            name=name,
            engine=str(m.get("engine", "")),
            description=str(m.get("description", "")),
            prefill=_kernel(m.get("prefill"), raw["modes"], f"modes.{name}.prefill"),
            decode=_kernel(m.get("decode"), raw["modes"], f"modes.{name}.decode"),
            probe_formats=tuple(m.get("probe_formats", ())),
        )
    if CACHE_ONLY not in modes or modes[CACHE_ONLY].quantizes:
        raise _fail("modes.cache_only", "the cache-only mode must exist and quantize nothing")
    rules = []
    for i, r in enumerate(raw.get("selection", [])):
        if r.get("mode") not in modes:
            raise _fail(f"selection[{i}]", f"mode {r.get('mode')!r} is not a mode")
        rules.append(
            Selection(
                engine=str(r["engine"]),
                kv=tuple(r.get("kv", ["*"])),
                sm=tuple(r.get("sm", ["*"])),
                when=dict(r.get("when", {})),
                mode=str(r["mode"]),
                why=str(r.get("why", "")),
                source=_source(r["source"], f"selection[{i}].source") if r.get("source") else None,
            )
        )
    return AttentionTable(modes, tuple(rules), tuple(raw.get("not_modelled", ())))


@lru_cache(maxsize=1)
def load_attention(path: Path = TABLE_PATH) -> AttentionTable:
    """The shipped table's attention section (read once)."""
    return parse_attention(read_table_doc(path))


def mode_names() -> list[str]:
    return list(load_attention().modes)


def select_mode(
    engine: str, kv: str, sm: tuple[int, int] | None, flags: dict[str, Any] | None = None
) -> tuple[str, str]:
    """(mode, why) for an engine backend ("tensorrt", "llmapi", "vllm", "sglang", "reference"), a
    recipe KV dtype ("fp8", "int8", ...), a GPU compute capability (None: the CPU) and recipe flags
    (fp8_context_fmha); cache_only with the reason where no rule matches (an unquantized cache, a
    GPU whose kernels are not modelled)."""
    table = load_attention()
    if kv in ("none", "fp16", "bf16"):
        return CACHE_ONLY, "16-bit KV cache: the attention kernels compute in the model dtype"
    for rule in table.selection:
        if rule.matches(engine, kv, sm, flags or {}):
            return rule.mode, rule.why
    where = f"SM{sm[0]}{sm[1]}" if sm else "the CPU"
    note = next(
        (n for n in table.not_modelled if sm and sm[0] >= 10 and n.startswith("Blackwell")), ""
    )
    return CACHE_ONLY, (
        f"no engine attention rule for {engine} with {kv} KV on {where}: cache-only"
        + (f" ({note})" if note else "")
    )


def format_modes(modes: list[str], formats: list[str]) -> list[str]:
    """One line per asked format (the first, the reference, aside): the modes it is measured under,
    and for an engine mode that does not apply to it, why and which format that mode reads (e.g.
    TensorRT-LLM's FP8 kernels read ModelOpt's clamped scale, fp8_scale1, not calibrated fp8)."""
    from trtkv.kvcache.names import parse_format  # names imports no table: no cycle

    table = load_attention()
    engine = [table.mode(m) for m in modes if m != CACHE_ONLY]
    if not engine:
        return []
    out = []
    for name in formats[1:]:
        choice = parse_format(name)
        under = [m.name for m in engine if {"*", choice.name} & set(m.probe_formats)]
        line = f"probe: {name} is measured cache-only" + "".join(f" and under {m}" for m in under)
        for m in engine:
            if m.name not in under:
                line += (
                    f"; not under {m.name}: {m.engine}'s kernels read the cache as that engine "
                    f"stores it ({', '.join(m.probe_formats)}); add --formats "
                    f"{m.probe_formats[0]} to measure that under {m.name}"
                )
        out.append(line)
    return out


def table_markdown() -> str:
    """docs/kv-formats.md's generated attention section: per mode, prefill and decode numerics and
    their sources."""
    table = load_attention()
    lines = [
        "| mode | phase | kernel | Q | K/V | P (scale, KV tile by head_dim, order) | read from |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in table.modes.values():
        for phase, k in (("prefill", mode.prefill), ("decode", mode.decode)):
            q = "16/32-bit" if k.q == "none" else f"FP8 E4M3 ({k.q_scale})"
            tiles = ", ".join(f"<= {a}: {b}" for a, b in k.kv_tile)
            p = (
                "not quantized"
                if k.p == "none"
                else f"FP8 E4M3 x{k.p_scale:g}, tiles {tiles}, {k.tile_order}"
            )
            src = "<br>".join(f"{s.file} @ {s.at}" for s in dict.fromkeys(k.sources)) or "-"
            lines.append(
                f"| **{mode.name}** | {phase} | {_cell(k.kernel)} | {q} | {k.kv} | {_cell(p)} | "
                f"{_cell(src)} |"
            )
    rules = [
        f"- `{r.engine}`, KV {'/'.join(r.kv)}, SM {'/'.join(r.sm)}"
        + (f", {', '.join(f'{k}={v}' for k, v in r.when.items())}" if r.when else "")
        + f" -> `{r.mode}`: {r.why}"
        for r in table.selection
    ]
    missing = [f"- not modelled: {n}" for n in table.not_modelled]
    return "\n".join(
        lines
        + ["", "`probe.attention: auto` picks the first matching rule:", "", *rules, "", *missing]
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
