"""Helpers shared by trtkv's Triton Python models (copied next to each model.py; the stub puts that folder on
sys.path). Self-contained: numpy, plus `tokenizers` (or transformers when a folder has no tokenizer.json); the
request/response helpers import Triton's `triton_python_backend_utils` when called (so tests import this file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


class RequestError(ValueError):
    """A problem with one request's inputs; answered as an error response naming the field."""


def model_parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """`parameters {}` of a model config as plain strings."""
    return {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}


def model_dir_from_args(args: dict[str, str]) -> Path:
    """The model's own folder (Triton passes it as `model_repository`)."""
    path = Path(args["model_repository"])
    return path if (path / "config.pbtxt").is_file() else path / args["model_name"]


def resolve_dir(value: str, model_dir: Path) -> Path:
    """A path from the config: absolute as is, else relative to the model repository root."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (model_dir.parent / path).resolve()


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """tokenizer.json through the `tokenizers` library (starts in a fraction of a second); transformers'
    AutoTokenizer for folders without one. Decoding never applies `clean_up_tokenization_spaces`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        config_path = folder / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.fast: Any = None
        self.hf: Any = None
        if (folder / "tokenizer.json").is_file():
            from tokenizers import Tokenizer as FastTokenizer

            self.fast = FastTokenizer.from_file(str(folder / "tokenizer.json"))
        else:
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(str(folder))

    def token_id(self, key: str) -> int | None:
        """Id of the special token named in tokenizer_config.json (`eos_token`, `pad_token`, ...)."""
        if self.hf is not None:
            value = getattr(self.hf, f"{key}_id", None)
            return int(value) if value is not None else None
        text = _token_text(self.config.get(key))
        found = self.fast.token_to_id(text) if text else None
        return int(found) if found is not None else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.hf is not None:
            return [int(t) for t in self.hf.encode(text, add_special_tokens=add_special_tokens)]
        return list(self.fast.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self.hf is not None:
            return str(self.hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False))
        return str(self.fast.decode(ids, skip_special_tokens=skip_special_tokens))

    def vocab_size(self) -> int:
        """Token ids the tokenizer knows (added tokens included); a model's vocabulary may be padded beyond it."""
        if self.hf is not None:
            return int(len(self.hf))
        return int(self.fast.get_vocab_size(with_added_tokens=True))

    def end_id(self) -> int:
        """generation_config.json's eos_token_id (first when a list), else the tokenizer's eos token."""
        gen = self.folder / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            if isinstance(eos, list) and eos:
                return int(eos[0])
            if isinstance(eos, int):
                return eos
        found = self.token_id("eos_token")
        if found is None:
            raise RequestError(f"the tokenizer in {self.folder} names no eos token; send end_id with each request")
        return found


def to_word_list(words: list[list[int]]) -> np.ndarray:
    """TensorRT-LLM's stop/bad words format [2, n]: concatenated ids, then cumulative end offsets (-1 padded)."""
    flat = [tok for word in words for tok in word]
    offsets = [int(x) for x in np.cumsum([len(word) for word in words])] if words else []
    out = np.zeros((2, max(1, len(flat))), dtype=np.int32)
    out[1, :] = -1
    out[0, : len(flat)] = flat
    out[1, : len(offsets)] = offsets
    return out


def from_word_list(row: np.ndarray | None) -> list[list[int]]:
    """The [2, n] words format back to a list of id lists."""
    if row is None or row.size == 0:
        return []
    ids, offsets = row.reshape(2, -1)
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end > start:
            words.append([int(t) for t in ids[start:end]])
        start = int(end)
    return words


class Utf8Chunker:
    """Groups streamed token ids so that every chunk decodes to whole UTF-8 characters on its own."""

    REPLACEMENT = "\ufffd"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.pending: list[int] = []

    def push(self, tokens: list[int]) -> list[int]:
        """Add tokens; returns the ids ready to send (empty while a character is still incomplete)."""
        self.pending.extend(tokens)
        if not self.pending or self.tokenizer.decode(self.pending, skip_special_tokens=False).endswith(
                self.REPLACEMENT):
            return []
        ready, self.pending = self.pending, []
        return ready

    def flush(self) -> list[int]:
        ready, self.pending = self.pending, []
        return ready


# ---------------------------------------------------------------------------------------------
# Request / response tensors (the tensorrt_llm models of every backend use the same names)


def optional_value(request: Any, name: str) -> Any | None:
    """The single value of an optional [1, 1] input, or None when absent."""
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    values = tensor.as_numpy()
    return values.reshape(-1)[0] if values.size else None


def word_row(request: Any, name: str) -> np.ndarray | None:
    """A stop/bad words input in TensorRT-LLM's [2, n] format, or None when absent."""
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(2, -1)


def output_tensors(ids: list[int]) -> list[Any]:
    """output_ids [1, 1, n] and sequence_length [1, 1] for one sequence (batch 1, beam 1)."""
    import triton_python_backend_utils as pb_utils

    return [pb_utils.Tensor("output_ids", np.array(ids, dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.array([[len(ids)]], dtype=np.int32))]


def send_final(live: Any, rest: list[int], extra: list[Any] | None = None) -> None:
    """Close a decoupled response stream: the held-back tail (if any, with its `extra` tensors) goes out with the
    FINAL flag."""
    import triton_python_backend_utils as pb_utils

    if rest:
        live.send(pb_utils.InferenceResponse(output_tensors=output_tensors(rest) + list(extra or [])),
                  flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    else:
        live.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def split_words(words: list[list[int]], decode: Any) -> tuple[list[int], list[str]]:
    """Stop/bad words for an API that takes single token ids and strings: one-token words stay ids, longer ones
    are detokenized (`decode(ids) -> str`); a word that decodes to nothing is a RequestError."""
    ids = [w[0] for w in words if len(w) == 1]
    texts = []
    for word in (w for w in words if len(w) > 1):
        text = str(decode(word))
        if not text:
            raise RequestError(f"stop/bad word {word} decodes to an empty string: send it as single token ids")
        texts.append(text)
    return ids, texts


# Inputs of upstream's tensorrt_llm model that trtkv's Python engines (reference runtime, LLM API model) cannot
# honour: a request that sets one gets a clear error (a default value passes). Beam-search-only knobs (len_penalty,
# early_stopping, beam_search_diversity_rate) and KV retention hints (retention_*) are accepted and have no effect
# with one beam and a cache that never evicts.
UNSUPPORTED = {
    "beam_width": ("> 1", lambda v: int(v) > 1, "one beam"),
    "num_return_sequences": ("> 1", lambda v: int(v) > 1, "one sequence per request"),
    "return_context_logits": ("true", bool, "logits are not returned"),
    "return_generation_logits": ("true", bool, "logits are not returned"),
    "stop": ("true", bool, "cancel a request from the client instead"),
    "runtime_top_p_min": ("set", lambda v: True, "no top-p decay"),
    "runtime_top_p_decay": ("set", lambda v: True, "no top-p decay"),
    "runtime_top_p_reset_ids": ("set", lambda v: True, "no top-p decay"),
    "draft_acceptance_threshold": ("set", lambda v: True, "no speculative decoding"),
}
ABSENT_ONLY = ("encoder_input_features", "encoder_output_lengths", "draft_input_ids", "draft_logits",
               "prompt_embedding_table", "prompt_table_extra_ids", "prompt_vocab_size", "cross_attention_mask",
               "mrope_rotary_cos_sin", "mrope_position_deltas", "lora_task_id", "lora_weights", "lora_config",
               "context_phase_params", "skip_cross_attn_blocks", "guided_decoding_guide_type", "guided_decoding_guide",
               "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")


def refuse_unsupported(request: Any, engine: str = "the reference runtime") -> None:
    """A RequestError naming every input this request sets that `engine` cannot honour."""
    import triton_python_backend_utils as pb_utils

    problems = []
    for name, (what, bad, why) in UNSUPPORTED.items():
        value = optional_value(request, name)
        if value is not None and bad(value):
            problems.append(f"{name} {what} ({why})")
    for name in ABSENT_ONLY:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None and tensor.as_numpy().size:
            problems.append(f"{name} (not supported)")
    decoder = pb_utils.get_input_tensor_by_name(request, "decoder_input_lengths")
    if decoder is not None and decoder.as_numpy().size and int(decoder.as_numpy().reshape(-1)[0]) > 1:
        problems.append("decoder_input_ids (encoder-decoder models only)")
    if problems:
        raise RequestError(f"{engine} cannot honour: " + "; ".join(problems) + ". Leave them out or at their "
                           "defaults.")
