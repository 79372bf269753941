"""Choosing the next token: greedy / temperature / top-k / top-p, and TensorRT-LLM's logit
controls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from trtkv.runtime.errors import RequestError

# ---------------------------------------------------------------------------------------------
# Sampling


def pick_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> int:
    """Greedy when temperature == 0 or top_k == 1; else temperature, top-k, then top-p (nucleus)
    sampling."""
    import torch

    if temperature <= 0.0 or top_k == 1:
        return int(torch.argmax(logits))
    scores = logits.float() / temperature
    if 0 < top_k < scores.numel():
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # the top token is always kept
        drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


@dataclass
class LogitControls:
    """What TensorRT-LLM applies to the logits before sampling, per request (its SamplingConfig /
    Request fields).

    The order is TensorRT-LLM's (`batchApplyPenalty`): temperature scaling first (done by the
    caller), then the penalties. Penalties look at the whole sequence (prompt and generated tokens),
    as TensorRT-LLM 1.x does by default: repetition divides positive logits and multiplies negative
    ones by `repetition_penalty` for every token seen; presence subtracts `presence_penalty` once
    per seen token, frequency `frequency_penalty` per occurrence. The end ids are banned until
    `min_tokens` tokens were generated (all of the request's end ids; TensorRT-LLM has one); a bad
    word's last token is banned when the sequence ends with the rest of it; `embedding_bias`
    (exactly vocabulary-sized, as TensorRT-LLM requires) is added before the temperature
    (`add_bias`).
    """

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    bad_words: list[list[int]] = field(default_factory=list)
    embedding_bias: list[float] | None = None

    @property
    def active(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.min_tokens > 0
            or bool(self.bad_words)
            or bool(self.embedding_bias)
        )

    def add_bias(self, logits: torch.Tensor) -> torch.Tensor:
        import torch

        logits = logits.float()
        if not self.embedding_bias:
            return logits
        if len(self.embedding_bias) != logits.numel():
            raise RequestError(
                f"embedding_bias has {len(self.embedding_bias)} entries, the vocabulary "
                f"{logits.numel()}: it must have exactly one per token (as TensorRT-LLM requires)."
            )
        return logits + torch.tensor(self.embedding_bias, dtype=logits.dtype)

    def apply(
        self, logits: torch.Tensor, seq: list[int], generated: int, end_ids: set[int]
    ) -> torch.Tensor:
        """Penalties, min_tokens and bad words on (already biased and temperature-scaled) logits."""
        import torch

        logits = logits.float().clone()
        if seq and (
            self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty
        ):
            ids, counts = torch.unique(torch.tensor(seq, dtype=torch.long), return_counts=True)
            seen = logits[ids]
            if self.repetition_penalty != 1.0:
                seen = torch.where(
                    seen > 0, seen / self.repetition_penalty, seen * self.repetition_penalty
                )
            seen = seen - self.presence_penalty - self.frequency_penalty * counts.to(logits.dtype)
            logits[ids] = seen
        if generated < self.min_tokens:
            for end in end_ids:
                logits[end] = float("-inf")
        for word in self.bad_words:
            if word and (len(word) == 1 or seq[-(len(word) - 1) :] == word[:-1]):
                logits[word[-1]] = float("-inf")
        return logits


def ends_with(seq: list[int], stops: Sequence[Sequence[int]]) -> bool:
    return any(stop and len(seq) >= len(stop) and seq[-len(stop) :] == list(stop) for stop in stops)
