"""The request interface of a served model: which tensors carry the prompt, the output length,
streaming and sampling, and what a streamed response holds. Two exist: the inflight_batcher_llm
`ensemble` (TensorRT-LLM <= 1.2's Triton layout, and trtkv's reference backend) and TensorRT-LLM's
`llmapi` model (`sampling_param_*` inputs; each streamed response carries the whole text so far).
The bench clients and the health canary read it from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelInterface:
    layout: str  # the repository layout that serves it (trtkv.backends.seam.RepoLayout.name)
    model: str  # the model a client talks to
    max_tokens: str
    stream: str
    temperature: str
    top_k: str
    top_p: str
    cumulative: bool  # streamed responses carry the text so far (True) or only the new text (False)
    # `return_log_probs` answers one log-prob per generated token (output_log_probs)
    per_token_log_probs: bool = False

    def body(
        self, prompt: str, max_tokens: int, *, stream: bool | None = None, **sampling: Any
    ) -> dict[str, Any]:
        """An HTTP generate / generate_stream JSON body (sampling: temperature, top_k, top_p)."""
        out: dict[str, Any] = {"text_input": prompt, self.max_tokens: max_tokens}
        if stream is not None:
            out[self.stream] = stream
        for key, value in sampling.items():
            out[getattr(self, key)] = value
        return out

    def new_text(self, text: str, so_far: str) -> str:
        """The new part of a streamed response's text, given the text received so far."""
        if not self.cumulative:
            return text
        return text[len(so_far) :] if text.startswith(so_far) else text


ENSEMBLE = ModelInterface(
    "ensemble",
    "ensemble",
    "max_tokens",
    "stream",
    "temperature",
    "top_k",
    "top_p",
    False,
    per_token_log_probs=True,
)
LLMAPI = ModelInterface(
    "llmapi",
    "tensorrt_llm",
    "sampling_param_max_tokens",
    "streaming",
    "sampling_param_temperature",
    "sampling_param_top_k",
    "sampling_param_top_p",
    True,
)
INTERFACES = {i.layout: i for i in (ENSEMBLE, LLMAPI)}


def detect(inputs: Iterable[str]) -> ModelInterface | None:
    """The interface whose length input the model declares (None: neither)."""
    names = set(inputs)
    for interface in INTERFACES.values():
        if {"text_input", interface.max_tokens} <= names:
            return interface
    return None
