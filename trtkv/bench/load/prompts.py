"""The model's tokenizer and prompts cut from the evaluation text to exact token counts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtkv.core.errors import StageError
from trtkv.recipe.layout import checkpoint_tokenizer_dir

if TYPE_CHECKING:
    from trtkv.recipe import Recipe


def tokenizer_dir(recipe: Recipe) -> Path:
    """engines/<recipe>/checkpoint/tokenizer/ when calibrate wrote it, else the recipe's model
    folder."""
    local = checkpoint_tokenizer_dir(recipe)
    if (local / "tokenizer_config.json").is_file() or (local / "tokenizer.json").is_file():
        return local
    from trtkv.checkpoints.models import resolve_model_dir

    return resolve_model_dir(recipe)


class FastTokenizer:
    """The `tokenizers` library on tokenizer.json: the same encoding as the HF fast tokenizer,
    without importing transformers (which costs seconds per start). Only encode/decode, as the
    benchmark uses them."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(
        self,
        ids: list[int],
        skip_special_tokens: bool = True,
        clean_up_tokenization_spaces: bool = False,
    ) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))


def load_tokenizer(folder: Path) -> Any:
    """tokenizer.json through `tokenizers` when present, else a Hugging Face AutoTokenizer (local
    files only)."""
    if (folder / "tokenizer.json").is_file():
        return FastTokenizer(folder / "tokenizer.json")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise StageError(
            f"bench: cannot load a tokenizer from {folder} ({exc}). "
            f"Next: run `trtkv calibrate` (it copies the tokenizer) or fix model.source."
        ) from exc


def count_tokens(tokenizer: Any, text: str) -> int:
    """Tokens in a streamed response's text (no special tokens)."""
    return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0


def prompt_tokens(tokenizer: Any, text: str) -> int:
    """Tokens the server's preprocessing makes of a prompt (special tokens added, as trtkv's repo
    does)."""
    return len(tokenizer.encode(text, add_special_tokens=True))


def cut_to_tokens(tokenizer: Any, text: str, n_tokens: int) -> str:
    """A prefix of `text` that re-tokenizes to exactly `n_tokens` tokens (errors when the text is
    too short)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < n_tokens:
        raise StageError(
            f"bench: the evaluation text has {len(ids)} tokens, fewer than the {n_tokens} asked."
        )
    for k in (
        n_tokens,
        n_tokens - 1,
        n_tokens + 1,
        n_tokens - 2,
        n_tokens + 2,
        n_tokens - 3,
        n_tokens + 3,
    ):
        if k <= 0 or k > len(ids):
            continue
        candidate = tokenizer.decode(
            ids[:k], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        if prompt_tokens(tokenizer, candidate) == n_tokens:
            return candidate
    raise StageError(
        f"bench: could not cut a prompt of exactly {n_tokens} tokens from the evaluation text."
    )


def long_text() -> str:
    """All evaluation records joined (New Testament text, never used for calibration)."""
    from trtkv.core.texts import eval_long_text

    return "\n\n".join(eval_long_text())


MAX_DISTINCT_PROMPTS = 512


def latency_prompts(
    tokenizer: Any, count: int, n_tokens: int, source: str | None = None
) -> list[str]:
    """Up to `count` (at most 512; callers cycle) distinct prompts of exactly `n_tokens` tokens, cut
    from consecutive stretches of the evaluation text; a stretch that cannot be cut exactly is
    skipped for the next one."""
    text = source if source is not None else long_text()
    ids = tokenizer.encode(text, add_special_tokens=False)
    count = min(count, MAX_DISTINCT_PROMPTS)
    stride = n_tokens + 8
    if len(ids) < stride + 8:
        raise StageError(
            f"bench: the evaluation text has {len(ids)} tokens, too few for {n_tokens}-token "
            "prompts."
        )
    prompts: list[str] = []
    start, tries = 0, 0
    while len(prompts) < count and tries < 4 * count + 16:
        tries += 1
        start = start % (len(ids) - stride - 8)
        chunk = tokenizer.decode(
            ids[start : start + stride],
            skip_special_tokens=True,
            clean_up_tokenization_spaces=False,
        )
        try:
            prompt = cut_to_tokens(tokenizer, chunk.lstrip(), n_tokens)
        except StageError:
            start += 1
            continue
        if prompt not in prompts:
            prompts.append(prompt)
        start += stride
    if not prompts:
        raise StageError(
            f"bench: could not cut any prompt of exactly {n_tokens} tokens from the evaluation "
            "text."
        )
    return prompts
