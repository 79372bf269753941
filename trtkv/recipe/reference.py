"""The recipe reference in docs/recipes.md, generated from the schema (a test checks it is
current)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel

from trtkv.kvcache.engines import load_table
from trtkv.recipe.limits import RANGES
from trtkv.recipe.schema import Recipe

# ---------------------------------------------------------------------------------------------
# The recipe reference in docs/recipes.md is generated from the schema (a test checks it is
# current).


def _type_name(ann: Any) -> str:
    if isinstance(ann, type) and issubclass(ann, Enum):
        return " \\| ".join(f"`{e.value}`" for e in ann)
    args = getattr(ann, "__args__", None)
    origin = getattr(ann, "__origin__", None)
    if origin is list and args:
        return f"list of {_type_name(args[0])}"
    if args:
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" (optional)" if type(None) in args else "")
    return getattr(ann, "__name__", str(ann))


def reference_markdown() -> str:
    lines = ["| field | type / allowed | default | meaning |", "|---|---|---|---|"]
    for section, field in Recipe.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            lines += _section_rows(section, ann)
        else:
            lines.append(
                f"| `{section}` | {_type_name(ann)} | {_show_default(field.default)} | "
                f"{field.description or ''} |"
            )
    return "\n".join(lines) + "\n\n" + kv_cache_markdown()


def _section_rows(prefix: str, model: type[BaseModel]) -> list[str]:
    """One row per field of a section; a sub-section (bench.prefix) gives one row per field of
    its own."""
    rows = []
    for name, sub in model.model_fields.items():
        ann = sub.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _section_rows(f"{prefix}.{name}", ann)
            continue
        default = "required" if sub.is_required() else _show_default(sub.default)
        rows.append(
            f"| `{prefix}.{name}` | {_type_name(ann)}{_range(sub)} | {default} "
            f"| {sub.description or ''} |"
        )
    return rows


def kv_cache_markdown() -> str:
    """quantization.kv_cache's values, one per KV-format registry row (trtkv/data/kv_formats.json):
    kind, checkpoint algo, storage and help."""
    lines = [
        "| `quantization.kv_cache` | kind | checkpoint `kv_cache_quant_algo` | stored as | meaning "
        "|",
        "|---|---|---|---|---|",
    ]
    for row in load_table().recipe_rows():
        c = row.choice
        aliases = f" (alias {', '.join(f'`{a}`' for a in c.aliases)})" if c.aliases else ""
        lines.append(
            f"| `{c.name}`{aliases} | {c.kind} | {c.checkpoint_algo or 'null'} | "
            f"{'the model dtype' if c.kind == 'unquantized' else f'`{c.storage}`'} | {c.help} |"
        )
    lines.append(
        "\nKinds: *calibrated*, trtkv's calibrate computes static scales and the checkpoint "
        "records the algo; *calibrated_engine*, calibrated too, in the form one engine reads; "
        "*engine*, deployable where docs/kv-formats.md gives the backend's engine a row "
        "(trtkv.recipe.engine_formats.engine_format_problems), nothing to calibrate (scales "
        "computed by the engine from the data, or 1.0 for fp8_cast); *unquantized*, the model "
        "dtype."
    )
    return "\n".join(lines)


def _range(field: Any) -> str:
    """`, 1..1,024` for a field bounded by trtkv.recipe.limits (the table below the reference says
    why)."""
    extra = field.json_schema_extra
    name = extra.get("range") if isinstance(extra, dict) else None
    if not isinstance(name, str) or name not in RANGES:
        return ""
    r = RANGES[name]
    return f", {r.text().split(' (')[0]}"


def limits_markdown() -> str:
    """The ranges of trtkv.recipe.limits, each with the largest published value it admits."""
    lines = ["| range | allowed | the largest published value it admits |", "|---|---|---|"]
    for name, r in RANGES.items():
        lines.append(f"| `{name}` | {r.text().split(' (')[0]} | {r.largest} |")
    return "\n".join(lines)


def _show_default(value: Any) -> str:
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, list):
        return "`[" + ", ".join(str(v.value if isinstance(v, Enum) else v) for v in value) + "]`"
    if value is None:
        return "—"
    if isinstance(value, BaseModel):
        return ""
    return f"`{value}`"
