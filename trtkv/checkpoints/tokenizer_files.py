"""Tokenizer folders that transformers 4.57 (TensorRT-LLM 1.x's pin) and 5.x load as the same
tokenizer.

transformers 5 saves `"tokenizer_class": "TokenizersBackend"`, a class 4.x does not have ("Tokenizer
class TokenizersBackend does not exist"), and drops what 4.x reads: special_tokens_map.json,
`additional_special_tokens` (5.x writes a list `extra_special_tokens`, which 4.x iterates as a dict)
and `add_bos_token`. It also writes loader state (`is_local`, `local_files_only`) and `*_token_id`
keys. Every trtkv save goes through `save_tokenizer`: tokenizer.json stays the one definition of the
ids, and tokenizer_config.json names the class both versions have (`PreTrainedTokenizerFast`:
tokenizer.json as is, no per-model rebuild), the special tokens as strings, and
`add_bos_token`/`add_eos_token` as tokenizer.json's post-processor really adds them (both versions
ignore the flags when a tokenizer.json is there; other readers do not).
`clean_up_tokenization_spaces` is written false for a BPE model: 5.x skips that clean-up for BPE,
4.x would apply it and decode "a , b" as "a, b".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError

# Bump when what save_tokenizer writes changes: converted models rewrite their tokenizer files,
# calibrate redoes.
TOKENIZER_FILES_VERSION = 1
TOKENIZER_CLASS = "PreTrainedTokenizerFast"
NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
LOADER_STATE = ("is_local", "local_files_only", "name_or_path", "_commit_hash")
# Texts the written folder is re-read with, to check it encodes as the tokenizer it was saved from
CHECK_TEXTS = (
    "Hello world",
    " leading space, a , b .",
    "line one\n\nline two\ttab",
    "caf\u00e9 \u00fcber \u6771\u4eac \U0001f600",
)


def save_tokenizer(
    tokenizer: Any,
    out_dir: Path,
    *,
    special: dict[str, str | None] | None = None,
    add_bos: bool | None = None,
    add_eos: bool | None = None,
    source: str | None = None,
) -> list[Path]:
    """Save `tokenizer` (a transformers fast tokenizer) into `out_dir` so that transformers 4.57 and
    5.x load it alike.

    `special`: the named special tokens as the model states them (a GGUF's ids, say), replacing the
    tokenizer's own (None removes one). `add_bos`/`add_eos`: what the model says about BOS/EOS;
    refused when tokenizer.json's post-processor does otherwise. `source`: recorded as
    `trtkv_source`. Returns the files written. A tokenizer without a tokenizer.json (sentencepiece
    only) is saved as transformers saves it.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    fast_path, config_path = out_dir / "tokenizer.json", out_dir / "tokenizer_config.json"
    # a sentencepiece-only tokenizer: its own class names, left as transformers wrote them
    if not fast_path.is_file():
        return sorted(p for p in out_dir.iterdir() if p.is_file())
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    stated = {key: _token_text(config.get(key)) for key in NAMED_TOKENS}
    stated.update(special or {})
    named = {key: value for key, value in stated.items() if value is not None}
    written_bos, written_eos = _template_adds(fast_path, named)
    for flag, wanted, actual in (
        ("add_bos_token", add_bos, written_bos),
        ("add_eos_token", add_eos, written_eos),
    ):
        if wanted is not None and wanted != actual:
            raise StageError(
                f"{fast_path}: the model says {flag} = {wanted}, but tokenizer.json's "
                f"post-processor {'adds' if actual else 'does not add'} that token. Next: fix the "
                f"tokenizer's post_processor (or the model's {flag}) so they agree."
            )
    config = _compatible_config(config, named, written_bos, written_eos, _model_type(fast_path))
    if source:
        config["trtkv_source"] = source
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    special_map: dict[str, Any] = dict(named)
    if config.get("additional_special_tokens"):
        special_map["additional_special_tokens"] = config["additional_special_tokens"]
    special_path = out_dir / "special_tokens_map.json"
    special_path.write_text(json.dumps(special_map, indent=2, ensure_ascii=False) + "\n")
    _check_reload(tokenizer, out_dir, named)
    return [
        fast_path,
        config_path,
        special_path,
        *sorted(p for p in out_dir.glob("chat_template.*") if p.is_file()),
    ]


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json holds it: a string, or an AddedToken dict with
    `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _model_type(fast_path: Path) -> str:
    return str(json.loads(fast_path.read_text()).get("model", {}).get("type", ""))


def _template_adds(fast_path: Path, named: dict[str, str]) -> tuple[bool, bool]:
    """(adds BOS, adds EOS): what tokenizer.json's post-processor puts around one sequence."""
    from tokenizers import Tokenizer

    fast = Tokenizer.from_file(str(fast_path))
    plain = fast.encode("a", add_special_tokens=False).ids
    full = fast.encode("a", add_special_tokens=True).ids
    at = next(
        (i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), None
    )
    if at is None:
        raise StageError(
            f"{fast_path}: the post-processor changes the text's own ids ({plain} -> {full}); "
            "trtkv writes only tokenizers that add tokens around the text."
        )
    head, tail = full[:at], full[at + len(plain) :]
    bos, eos = (
        fast.token_to_id(named[k]) if named.get(k) else None for k in ("bos_token", "eos_token")
    )
    adds_bos = bos is not None and bos in head
    adds_eos = eos is not None and eos in tail
    return adds_bos, adds_eos


def _compatible_config(
    config: dict[str, Any], named: dict[str, str], add_bos: bool, add_eos: bool, model_type: str
) -> dict[str, Any]:
    """tokenizer_config.json as both 4.57 and 5.x read it (see the module docstring)."""
    out = {
        key: value
        for key, value in config.items()
        if key not in LOADER_STATE
        and key not in NAMED_TOKENS
        and key != "extra_special_tokens"
        and not (key.endswith("_token_id") or key.endswith("_token_ids"))
    }
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):  # named model-specific tokens: the same dict in 4.57 and 5.x
        out["extra_special_tokens"] = extra
    elif extra:  # 5.x's list = 4.x's additional_special_tokens (5.x reads that name too)
        out["additional_special_tokens"] = [
            t for t in (_token_text(x) for x in extra) if t is not None
        ]
    out.update(named)
    out.update(
        {"tokenizer_class": TOKENIZER_CLASS, "add_bos_token": add_bos, "add_eos_token": add_eos}
    )
    if model_type == "BPE":  # 5.x never applies the clean-up to BPE; 4.57 would
        out["clean_up_tokenization_spaces"] = False
    return dict(sorted(out.items()))


def _check_reload(tokenizer: Any, out_dir: Path, named: dict[str, str]) -> None:
    """The written folder, read back by this transformers, encodes as `tokenizer` and names the
    special tokens."""
    from transformers import AutoTokenizer

    back = AutoTokenizer.from_pretrained(str(out_dir))
    for text in CHECK_TEXTS:
        for special in (True, False):
            want = tokenizer.encode(text, add_special_tokens=special)
            got = back.encode(text, add_special_tokens=special)
            if got != want:
                raise StageError(
                    f"{out_dir}: the saved tokenizer encodes {text!r} "
                    f"(add_special_tokens={special}) as {got[:12]}, the tokenizer it was saved "
                    f"from as {want[:12]}. This is a trtkv bug: report it with the folder."
                )
    for key, text in named.items():
        if getattr(back, key, None) != text:
            raise StageError(
                f"{out_dir}: the saved tokenizer's {key} is {getattr(back, key, None)!r}, expected "
                f"{text!r}. This is a trtkv bug: report it with the folder."
            )
