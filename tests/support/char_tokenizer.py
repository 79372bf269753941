"""A stand-in tokenizer for the accuracy tasks' unit tests: one token per character."""

from __future__ import annotations

from typing import Any


class Chars:
    """One token per character (enough for prompt_tokens, agreement and the scores)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def decode(self, ids: list[int], **_: Any) -> str:
        return "".join(chr(i) for i in ids)
