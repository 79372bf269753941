"""The helpers inside the generated Python models (tokenizer, UTF-8 chunking, stop-word format), outside Triton."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from trtkv.repo.generate import SHARED_MODULE, TEMPLATES


@pytest.fixture(scope="module")
def utils() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trtkv_model_utils", TEMPLATES / SHARED_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["trtkv_model_utils"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer(utils: ModuleType, smollm2_dir: Path):  # noqa: ANN201 - trtkv_model_utils.Tokenizer
    return utils.Tokenizer(smollm2_dir)


def test_word_list_round_trip(utils: ModuleType) -> None:
    words = [[5, 6], [7], [8, 9, 10]]
    packed = utils.to_word_list(words)
    assert packed.tolist() == [[5, 6, 7, 8, 9, 10], [2, 3, 6, -1, -1, -1]]
    assert utils.from_word_list(packed) == words
    assert utils.from_word_list(utils.to_word_list([])) == []
    assert utils.to_word_list([]).shape == (2, 1)


def test_split_words_keeps_single_ids_and_detokenizes_longer_words(utils: ModuleType) -> None:
    """The pytorch model's stop/bad words: one-token words as ids, multi-token words as strings, never dropped."""
    ids, texts = utils.split_words([[5], [7, 8], [9]], lambda word: "".join(chr(96 + t) for t in word))
    assert ids == [5, 9] and texts == ["gh"]
    with pytest.raises(utils.RequestError, match="decodes to an empty string"):
        utils.split_words([[1, 2]], lambda _word: "")


@pytest.mark.slow
def test_tokenizer_ids_match_transformers(tokenizer, smollm2_dir: Path) -> None:  # noqa: ANN001
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(smollm2_dir))
    for text in ("The capital of France is", "héllo wörld 東京 🎉", "  spaces  and\nnewlines."):
        ids = tokenizer.encode(text)
        assert ids == reference.encode(text)
        assert tokenizer.decode(ids) == text
    assert tokenizer.end_id() == 2  # generation_config.json (<|im_end|>), not tokenizer_config's eos


def test_streamed_chunks_are_whole_characters(utils: ModuleType, tokenizer) -> None:  # noqa: ANN001
    text = "Tōkyō 東京 🎉 naïve café"
    ids = tokenizer.encode(text)
    chunker = utils.Utf8Chunker(tokenizer)
    chunks = [c for c in (chunker.push([t]) for t in ids) if c] + [chunker.flush()]
    pieces = [tokenizer.decode(c) for c in chunks if c]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text
    assert len(pieces) < len(ids)  # some multi-byte characters span several tokens and were held back


def test_word_list_rows_are_padded(utils: ModuleType) -> None:
    packed = utils.to_word_list([[1, 2, 3]])
    assert packed.dtype == np.int32 and packed[1].tolist() == [3, -1, -1]
