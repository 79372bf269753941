"""An exact HF tokenizer built from a GGUF's own SentencePiece metadata, for files transformers'
GGUF conversion gets wrong.

transformers 5.14 turns Gemma 3's GGUF tokenizer into a Unigram over the BPE scores, which encodes
character by character. The file itself says what the tokenizer is: `tokenizer.ggml.model ==
"llama"` is llama.cpp's name for a SentencePiece model; `tokens`, `scores` and `token_type` are its
pieces (types 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte). This module writes
that as a `tokenizers` BPE (the merges ranked by the merged piece's score, as SentencePiece's BPE
picks them), with user-defined pieces matched whole before the merges (as SentencePiece's prefix
matcher does), byte fallback, and BOS/EOS added as the file says (files without the dummy prefix
only, as Gemma's: with one, a tokenizer.json cannot be exact), then saves it as tokenizer.json +
tokenizer_config.json + special_tokens_map.json (trtkv.checkpoints.tokenizer_files) so transformers
4.57 and 5.x, vLLM and Triton load the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE_PIECE = "\u2581"  # SentencePiece's visible space
BYTE_PIECES = [f"<0x{b:02X}>" for b in range(256)]
NEXT = (
    "Next: use a GGUF written by llama.cpp's convert_hf_to_gguf.py from a SentencePiece model, or "
    "give the model as an HF folder with its own tokenizer.json (model.source: <folder>)."
)


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer fields of one GGUF file, as the file states them."""

    path: Path
    tokens: list[str]
    scores: list[float]
    types: list[int]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    context_length: int | None

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]


def _scalar(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value.item() if hasattr(value, "item") else value


def _strings(field: Any) -> list[str]:
    """A GGUF string array, read from its raw parts (GGUFReader's contents() takes ~15 s on 262K
    strings)."""
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _numbers(field: Any) -> list[Any]:
    return [field.parts[i][0].item() for i in field.data]


def read_gguf_vocab(path: Path) -> GgufVocab:
    """The SentencePiece vocabulary of `path`; refuses a file that holds some other kind of
    tokenizer."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    model = _scalar(reader, "tokenizer.ggml.model")
    if model != "llama":
        raise StageError(
            f"{path}: tokenizer.ggml.model is {model!r}; trtkv's exact GGUF tokenizer reads only "
            f"'llama' (a SentencePiece model with scores and token types). {NEXT}"
        )
    missing = [
        k for k in ("tokens", "scores", "token_type") if f"tokenizer.ggml.{k}" not in reader.fields
    ]
    if missing:
        raise StageError(
            f"{path}: no tokenizer.ggml.{', tokenizer.ggml.'.join(missing)} field; a SentencePiece "
            f"tokenizer needs tokens, scores and token_type. {NEXT}"
        )
    tokens = _strings(reader.fields["tokenizer.ggml.tokens"])
    scores = [float(s) for s in _numbers(reader.fields["tokenizer.ggml.scores"])]
    types = [int(t) for t in _numbers(reader.fields["tokenizer.ggml.token_type"])]
    if not len(tokens) == len(scores) == len(types):
        raise StageError(
            f"{path}: tokenizer.ggml.tokens/scores/token_type have {len(tokens)}/{len(scores)}/"
            f"{len(types)} entries; they must be equal. {NEXT}"
        )
    unknown_types = sorted(set(types) - {NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE})
    if unknown_types:
        raise StageError(
            f"{path}: tokenizer.ggml.token_type holds {unknown_types}; allowed: 1 normal, 2 "
            f"unknown, 3 control, 4 user-defined, 5 unused, 6 byte. {NEXT}"
        )
    if UNUSED in types:
        raise StageError(
            f"{path}: {types.count(UNUSED)} pieces are of type 5 (unused): SentencePiece re-splits "
            "them after merging, which a tokenizer.json cannot express, so the result would not "
            f"be exact. {NEXT}"
        )
    if _scalar(reader, "tokenizer.ggml.add_space_prefix") in (None, True):
        raise StageError(
            f"{path}: tokenizer.ggml.add_space_prefix is true or absent (SentencePiece's dummy "
            "prefix): a tokenizer.json prepends it to every piece of text between user-defined "
            "tokens, SentencePiece only once, so the result would not be exact; trtkv builds only "
            f"files that say false (Gemma's). {NEXT}"
        )
    arch = _scalar(reader, "general.architecture")
    ids = {}
    for name in ("bos", "eos", "unknown", "padding"):
        value = _scalar(reader, f"tokenizer.ggml.{name}_token_id")
        if value is not None and not 0 <= int(value) < len(tokens):
            raise StageError(
                f"{path}: tokenizer.ggml.{name}_token_id is {value}, outside the {len(tokens)} "
                f"tokens. {NEXT}"
            )
        ids[name] = None if value is None else int(value)
    context = _scalar(reader, f"{arch}.context_length") if arch else None

    def flag(key: str, default: bool) -> bool:
        value = _scalar(reader, f"tokenizer.ggml.{key}")
        return default if value is None else bool(value)

    return GgufVocab(
        path=path,
        tokens=tokens,
        scores=scores,
        types=types,
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        unk_id=ids["unknown"],
        pad_id=ids["padding"],
        add_bos=flag("add_bos_token", ids["bos"] is not None),
        add_eos=flag("add_eos_token", False),
        context_length=None if context is None else int(context),
    )


def hf_pieces(vocab: GgufVocab) -> list[str]:
    """The pieces as SentencePiece sees them: llama.cpp writes user-defined pieces with real spaces
    ("pre-normalized"), SentencePiece matches them on text whose spaces are already U+2581."""
    return [
        tok.replace(" ", SPACE_PIECE) if kind == USER_DEFINED else tok
        for tok, kind in zip(vocab.tokens, vocab.types, strict=True)
    ]


def spm_merges(pieces: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's BPE: a pair of normal pieces merges when their
    concatenation is a normal piece, and the pair whose result scores highest merges first."""
    normal = {
        piece: i
        for i, (piece, kind) in enumerate(zip(pieces, types, strict=True))
        if kind == NORMAL
    }
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, index in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-scores[index], index, cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def build_tokenizer(vocab: GgufVocab) -> Any:
    """The `tokenizers.Tokenizer` equal to the GGUF's SentencePiece model."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    pieces = hf_pieces(vocab)
    byte_fallback = all(p in set(pieces) for p in BYTE_PIECES)
    model = BPE(
        vocab={p: i for i, p in enumerate(pieces)},
        merges=spm_merges(pieces, vocab.scores, vocab.types),
        unk_token=vocab.token(vocab.unk_id),
        fuse_unk=True,
        byte_fallback=byte_fallback,
    )
    tokenizer = Tokenizer(model)
    # SentencePiece's identity normalizer with escaped whitespace, no dummy prefix (read_gguf_vocab
    # refuses one)
    tokenizer.normalizer = normalizers.Replace(" ", SPACE_PIECE)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPACE_PIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    # control/unknown pieces are special (never produced from text by SentencePiece; HF matches them
    # as markers); user-defined ones are matched whole on the normalized text, as SentencePiece's
    # prefix matcher does
    tokenizer.add_tokens(
        [
            AddedToken(p, special=False, normalized=True)
            for p, kind in zip(pieces, vocab.types, strict=True)
            if kind == USER_DEFINED
        ]
    )
    tokenizer.add_special_tokens(
        [
            AddedToken(p, special=True, normalized=False)
            for p, kind in zip(pieces, vocab.types, strict=True)
            if kind in (CONTROL, UNKNOWN)
        ]
    )
    tokenizer.post_processor = _post_processor(vocab, processors)
    return tokenizer


def _post_processor(vocab: GgufVocab, processors: Any) -> Any:
    """BOS/EOS around every sequence, exactly as the file's add_bos_token/add_eos_token say."""
    bos = vocab.token(vocab.bos_id) if vocab.add_bos else None
    eos = vocab.token(vocab.eos_id) if vocab.add_eos else None
    if vocab.add_bos and bos is None or vocab.add_eos and eos is None:
        raise StageError(
            f"{vocab.path}: add_bos_token/add_eos_token is true but the file has no bos/eos token "
            f"id. {NEXT}"
        )
    pre, post = [bos] if bos else [], [eos] if eos else []
    single = [*pre, "$A:0", *post]
    pair = [*single, *pre, "$B:1", *post]
    ids = {vocab.token(i): i for i in (vocab.bos_id, vocab.eos_id) if i is not None}
    specials = [(t, ids[t]) for t in dict.fromkeys([*pre, *post])]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def save_hf_tokenizer(vocab: GgufVocab, out_dir: Path) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`
    (trtkv.checkpoints.tokenizer_files: transformers 4.57 and 5.x load them alike)."""
    from transformers import PreTrainedTokenizerFast

    from trtkv.checkpoints.tokenizer_files import save_tokenizer

    special = {
        name: vocab.token(token_id)
        for name, token_id in (
            ("bos_token", vocab.bos_id),
            ("eos_token", vocab.eos_id),
            ("unk_token", vocab.unk_id),
            ("pad_token", vocab.pad_id),
        )
        if token_id is not None
    }
    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(vocab),
        clean_up_tokenization_spaces=False,
        model_max_length=vocab.context_length or 1_000_000_000_000_000_019_884_624_838_656,
        **special,
    )
    return save_tokenizer(
        fast,
        out_dir,
        special=special,
        add_bos=vocab.add_bos,
        add_eos=vocab.add_eos,
        source=f"GGUF {vocab.path.name}",
    )


@dataclass(frozen=True)
class GgufSpecial:
    """The special-token ids and BOS/EOS flags a GGUF states, for any tokenizer model."""

    ids: dict[str, int]  # bos_token / eos_token / unk_token / pad_token -> id
    add_bos: bool
    add_eos: bool


def read_gguf_special(path: Path) -> GgufSpecial:
    """tokenizer.ggml.{bos,eos,unknown,padding}_token_id and add_bos_token/add_eos_token of
    `path`."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    ids = {}
    for name, key in (
        ("bos_token", "bos"),
        ("eos_token", "eos"),
        ("unk_token", "unknown"),
        ("pad_token", "padding"),
    ):
        value = _scalar(reader, f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            ids[name] = int(value)
    add_bos, add_eos = (
        _scalar(reader, f"tokenizer.ggml.{k}") for k in ("add_bos_token", "add_eos_token")
    )
    return GgufSpecial(
        ids=ids,
        add_bos="bos_token" in ids if add_bos is None else bool(add_bos),
        add_eos=bool(add_eos),
    )
