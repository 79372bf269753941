"""`numerics_key` (what a cached probe result is keyed by: a format's registry row and the source of
its codecs) and `fake_quantize`. The semantics of each format, and the runtime each one follows, are
in trtkv.kvcache.numerics' docstring."""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from trtkv.kvcache.codecs import layer_codecs
from trtkv.kvcache.formats import KVFormat
from trtkv.kvcache.names import FormatChoice, parse_format
from trtkv.kvcache.numerics import AffineScale, HeadScale, KVScale


def numerics_key(fmt: KVFormat | str | FormatChoice) -> str:
    """A hash of a format's definition: its row in trtkv/data/kv_formats.json and the source of its
    codecs, so a cached probe result made under another definition (a changed table row or codec) no
    longer matches."""

    from trtkv.kvcache.engines import load_table

    choice = parse_format(fmt)
    table = load_table()
    row = table.for_probe(choice.name) or table.for_probe(choice.base.value)
    unit: KVScale = AffineScale(1.0, torch.zeros(1, 1)) if choice.affine else 1.0
    if choice.variant == "fp8_attn_head":
        unit = HeadScale((1.0,))
    codecs = layer_codecs(choice, unit, unit)
    parts = [
        row.numerics if row else None,
        choice.base.value,
        choice.split_scales,
        codecs.residual,
        *_definition_sources(type(codecs.key)),
        *_definition_sources(type(codecs.value)),
    ]
    if choice.variant:  # two variants may share codec classes (nvfp4_cast, nvfp4_rotate)
        parts.append(choice.variant)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


# The modules a codec's definition spans: its source and every function, class or constant of these
# it reaches by name.
NUMERICS_MODULES = (
    "trtkv.kvcache.names",
    "trtkv.kvcache.numerics",
    "trtkv.kvcache.turboquant",
    "trtkv.kvcache.codecs",
    "trtkv.kvcache.codec_base",
    "trtkv.kvcache.variants",
)


def _definition_sources(cls: type) -> list[str]:
    """The source of a codec class and of every function, class or constant of the numerics modules
    it reaches by name (transitively), each name resolved in the namespace of the module whose
    source names it: a change to turboquant_value_quantize changes the key of the formats whose
    codecs call it, wherever it lives."""
    import inspect
    import re

    seen: dict[str, str] = {}
    todo = [(inspect.getsource(cls), cls.__module__)]
    while todo:
        text, where = todo.pop()
        namespace = vars(sys.modules[where])
        for name in sorted(set(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", text))):
            obj = namespace.get(name)
            if name in seen or obj is None:
                continue
            if isinstance(obj, (int, float, str, tuple)):
                # its own constants and those it imports (FP8_MAX, ...)
                if where in NUMERICS_MODULES:
                    seen[name] = repr(obj)
                continue
            owner = getattr(obj, "__module__", None)
            if owner not in NUMERICS_MODULES:
                continue
            obj = inspect.unwrap(obj) if callable(obj) else obj  # lru_cache-wrapped functions too
            if inspect.isfunction(obj) or inspect.isclass(obj):
                seen[name] = inspect.getsource(obj)
                todo.append((seen[name], owner))
    return [inspect.getsource(cls), *(f"{k}={v}" for k, v in sorted(seen.items()))]


def fake_quantize(
    x: torch.Tensor, fmt: KVFormat | str, scale: KVScale | None = None, role: str = "key"
) -> torch.Tensor:
    """Quantize then dequantize x ([B, H, T, D]) as the cache would store it (no residual
    window)."""
    codecs = layer_codecs(fmt, scale, scale)
    return (codecs.key if role == "key" else codecs.value).roundtrip(x)
