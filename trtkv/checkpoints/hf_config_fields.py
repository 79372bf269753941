"""config.json as trtkv reads it: untrusted text (a regular file, at most MAX_CONFIG_BYTES, strict
JSON) whose fields are checked before any is used (numbers within trtkv.recipe.limits' ranges, words
as identifiers, flags as booleans, layer lists as lists), and ModelConfigError, which names the
file, the field and the next step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtkv.core.errors import RecipeError
from trtkv.core.files import NotReadable, read_json
from trtkv.recipe.limits import CONFIG_FIELDS, MAX_LIST, WORD, check_config_field

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config.json is a few KB; refuse anything that is not one
# Fields read as words, flags and lists (the numbers' ranges are trtkv.recipe.limits.CONFIG_FIELDS).
# Every word that reaches a recipe, a comment or a command is one of these, so it cannot carry a
# newline or a quote.
WORD_FIELDS = (
    "model_type",
    "torch_dtype",
    "dtype",
    "quant_method",
    "quant_algo",
    "mamba_ssm_cache_dtype",
)
FLAG_FIELDS = ("use_sliding_window", "tie_word_embeddings", "attention_k_eq_v")
LIST_FIELDS = (
    "layer_types",
    "no_rope_layers",
    "moe_layers",
    "mlp_only_layers",
    "layers_block_type",
)


class ModelConfigError(RecipeError):
    """A config.json trtkv cannot read: names the file, the field and the next step."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems, header="Model config not readable")


def config_file(path: Path) -> Path:
    """The config.json in `path` (a folder) or `path` itself."""
    return path / "config.json" if path.is_dir() else path


def load_config(path: Path) -> dict[str, Any]:
    """The parsed config.json (read_object); ModelConfigError naming the file and the next step."""
    return read_object(
        config_file(path),
        MAX_CONFIG_BYTES,
        "model config",
        "pass a model folder holding config.json, or the model's config.json itself as published "
        "with its weights",
    )


def read_object(file: Path, max_bytes: int, what: str, next_step: str) -> dict[str, Any]:
    """The JSON object in `file`, read as untrusted text (trtkv.core.files: a regular file, at most
    `max_bytes`, strict JSON); ModelConfigError naming the file and `next_step`."""
    try:
        data = read_json(file, max_bytes, what)
    except NotReadable as exc:
        raise ModelConfigError([f"{file}: {exc.problem}. Next: {next_step}."]) from None
    if not isinstance(data, dict):
        raise ModelConfigError(
            [f"{file}: the top level is {type(data).__name__}, not an object. Next: {next_step}."]
        )
    return data


def check_fields(cfg: dict[str, Any], prefix: str = "") -> list[str]:
    """Every problem with the fields trtkv reads: numbers within trtkv.recipe.limits' ranges
    (CONFIG_FIELDS), words (model_type, dtype, architectures, quant_method) as identifiers, flags as
    booleans, layer lists as lists. A problem names the field (with `prefix`, e.g.
    "text_config.")."""
    problems: list[str] = []
    for name, value in cfg.items():
        if name in CONFIG_FIELDS:
            problems += check_config_field(name, value)
        elif name in WORD_FIELDS and value is not None and not _word(value):
            problems.append(
                f"{name}: {_shown(value)} is not a name (letters, digits, '_', '-', '.'; 1-128)"
            )
        elif name in FLAG_FIELDS and value is not None and not isinstance(value, bool):
            problems.append(f"{name}: {_shown(value)} is not true or false")
        elif (
            name in LIST_FIELDS
            and value is not None
            and (not isinstance(value, list) or len(value) > MAX_LIST)
        ):
            problems.append(f"{name}: {_shown(value)} is not a list of at most {MAX_LIST} entries")
    archs = cfg.get("architectures")
    if archs is not None and not (
        isinstance(archs, list) and len(archs) <= 16 and all(_word(a) for a in archs)
    ):
        problems.append(f"architectures: {_shown(archs)} is not a list of class names")
    types = cfg.get("layer_types")
    if isinstance(types, list) and not all(isinstance(t, str) and _word(t) for t in types):
        problems.append(f"layer_types: {_shown(types)} holds entries that are not layer-type words")
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        problems.append(f"text_config: {_shown(text)} is not an object")
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is not None and not (isinstance(pattern, str) and 0 < len(pattern) <= MAX_LIST):
        problems.append(
            f"hybrid_override_pattern: {_shown(pattern)} is not a string of 1-{MAX_LIST} layer "
            "letters"
        )
    quant = cfg.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        problems.append(f"quantization_config: {_shown(quant)} is not an object")
    elif isinstance(quant, dict):
        problems += [f"quantization_config.{p}" for p in check_fields(quant)]
    return [f"{prefix}{p}" for p in problems]


def _word(value: Any) -> bool:
    return isinstance(value, str) and WORD.fullmatch(value) is not None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
