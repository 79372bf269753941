"""trtkv's exact GGUF tokenizer against an independent one, on the shipped calibration and evaluation text
(`python benchmarks/gguf_tokenizer_check.py [--model-dir DIR] [--gguf FILE]`; default: packaged Gemma 3 270M).

The reference is Google's `sentencepiece` library driven by a ModelProto built here from the `gguf` package's own
reader (no trtkv code): the GGUF's pieces, scores and types, BPE, byte fallback, and the normalizer of Gemma's
tokenizer.model (identity, no dummy prefix, whitespace kept and escaped to U+2581). Checked on every string: encode
ids equal (BOS as the file says), decode equal, and streaming token by token: the text a streamer emits that holds
back partial UTF-8 equal, and the decode of every prefix (of the first 48 tokens) equal, partial UTF-8 included,
except one counted case (`partial_run`: how a run of byte tokens ending mid-character is replaced). Prints the counts and exits 1
on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

SPACE = "\u2581"
REPLACEMENT = "\ufffd"
# characters the streaming and byte-fallback checks need: accents, other scripts, emoji (4-byte UTF-8), combining
# marks, characters outside the vocabulary (variation selectors, private use: byte fallback), whitespace runs, digits,
# a literal U+2581, user-defined pieces
EXTRA = ["é", "ß", "ø", "Ω", "Ж", "中文", "日本語", "한국어", "عربى", "हिन्दी", "🙂", "👍🏽", "🇫🇷", "e\u0301", "\U000E0100",
         "\ue000", "\U0010fffd", "\U0002a6d6", "\u2581", "  ", "   ", "\t", "\n\n", " \n ", "2024", "3.14159",
         "<table>", "</td>", "[multimodal]", "\u200b", "\x1f", "~", "…", "—"]


def reference_proto(reader: Any) -> bytes:
    """A SentencePiece BPE ModelProto from the GGUF's pieces, scores and types (serialized)."""
    # the schema only: sentencepiece's own generated module needs protobuf >= 7, this venv has 6
    from transformers.utils import sentencepiece_model_pb2_new as pb

    def field(key: str) -> Any:
        found = reader.fields.get(key)
        return None if found is None else found.contents()

    tokens, scores, types = (field(f"tokenizer.ggml.{k}") for k in ("tokens", "scores", "token_type"))
    unk_id = int(field("tokenizer.ggml.unknown_token_id"))
    proto = pb.ModelProto()
    for i, (token, score, kind) in enumerate(zip(tokens, scores, types, strict=True)):
        piece = proto.pieces.add()
        # llama.cpp's converter writes user-defined pieces with real spaces; tokenizer.model holds U+2581 there
        piece.piece = token.replace(" ", SPACE) if kind == 4 else token
        piece.score = float(score)
        piece.type = 2 if i == unk_id else int(kind)
    spec = proto.trainer_spec
    spec.model_type = 2  # BPE
    spec.vocab_size = len(tokens)
    spec.byte_fallback = True
    spec.split_digits = True
    spec.allow_whitespace_only_pieces = True
    spec.treat_whitespace_as_suffix = False
    spec.unk_id = unk_id
    spec.bos_id = int(field("tokenizer.ggml.bos_token_id"))
    spec.eos_id = int(field("tokenizer.ggml.eos_token_id"))
    spec.pad_id = int(field("tokenizer.ggml.padding_token_id"))
    for name in ("unk", "bos", "eos", "pad"):
        setattr(spec, f"{name}_piece", tokens[getattr(spec, f"{name}_id")])
    norm = proto.normalizer_spec
    norm.name = "identity"
    norm.add_dummy_prefix = bool(field("tokenizer.ggml.add_space_prefix"))
    norm.remove_extra_whitespaces = False
    norm.escape_whitespaces = True
    return proto.SerializeToString()


def gguf_reader(gguf_path: Path) -> Any:
    """The `gguf` package's GGUFReader, parsing unchanged, over a plain ndarray view of its memory map: numpy's memmap
    subclass (`__getitem__`, `__array_finalize__` on each of the ~1M small slices the reader takes of Gemma 3's
    262K-piece vocabulary, scores and types) was two thirds of its ~20 s; the same bytes, shared, not copied."""
    import numpy as np
    from gguf import GGUFReader

    class PlainReader(GGUFReader):
        @property
        def data(self) -> Any:
            return self._plain

        @data.setter
        def data(self, value: Any) -> None:  # GGUFReader.__init__ sets np.memmap(path)
            self._plain = value.view(np.ndarray)

    return PlainReader(str(gguf_path))


def reference(gguf_path: Path) -> tuple[Any, bool]:
    """The sentencepiece processor and the file's add_bos_token."""
    import sentencepiece

    reader = gguf_reader(gguf_path)
    add_bos = reader.fields["tokenizer.ggml.add_bos_token"].contents()
    return sentencepiece.SentencePieceProcessor(model_proto=reference_proto(reader)), bool(add_bos)


def corpus(limit: int | None = None, seed: int = 0) -> list[str]:
    """Strings from calibration_data/ (calib and eval): whole records, ~200-character slices at varied offsets, quiz
    prompts, and copies of slices with characters from EXTRA inserted at random places."""
    from trtkv.core import texts as data

    records = data.load_texts(data.CALIB_DEFAULT) + data.eval_long_text()
    rng = random.Random(seed)
    strings = list(records)
    for text in records:
        for _ in range(2):
            start = rng.randrange(max(1, len(text) - 200))
            strings.append(text[start:start + rng.randrange(20, 240)])
    strings += [f"{q['question']}: {q['answer']}\n" for q in data.quiz_items()]
    for text in rng.sample(records, min(len(records), 900)):
        start = rng.randrange(max(1, len(text) - 160))
        chars = list(text[start:start + 160])
        for _ in range(rng.randrange(1, 6)):
            chars.insert(rng.randrange(len(chars) + 1), rng.choice(EXTRA))
        strings.append("".join(chars))
    strings = [s for s in strings if s]
    return strings[:limit] if limit else strings


def held_back_stream(decode: Any, ids: list[int]) -> list[str]:
    """The text chunks a streamer emits that holds tokens back while their decode ends in a partial character."""
    chunks, pending = [], []
    for token in ids:
        pending.append(token)
        text = decode(pending)
        if not text.endswith(REPLACEMENT):
            chunks.append(text)
            pending = []
    if pending:
        chunks.append(decode(pending))
    return chunks


def partial_run(ours: str, theirs: str) -> bool:
    """A prefix that ends inside a character, after complete characters in the same run of byte-fallback tokens:
    tokenizers' ByteFallback decoder turns that whole invalid run into one U+FFFD per byte, sentencepiece only the
    incomplete tail (a hold-back streamer emits the same text from both)."""
    return (ours.endswith(REPLACEMENT) and theirs.endswith(REPLACEMENT)
            and theirs.rstrip(REPLACEMENT).startswith(ours.rstrip(REPLACEMENT)))


def compare(tokenizer: Any, sp: Any, add_bos: bool, strings: list[str], stream_tokens: int = 48) -> dict[str, Any]:
    """Encode/decode/streaming agreement counts, with the first few mismatches."""
    fast = tokenizer.backend_tokenizer
    names = ["tokens", "encode_mismatch", "decode_mismatch", "roundtrip_differs", "prefix_decodes", "prefix_mismatch",
             "prefix_partial_run_differs", "stream_mismatch", "byte_fallback_tokens", "strings_with_byte_fallback",
             "partial_utf8_prefixes"]
    counts: dict[str, Any] = {"strings": len(strings), **dict.fromkeys(names, 0)}
    examples: list[dict[str, Any]] = []
    ours_all = tokenizer(strings)["input_ids"]
    byte_ids = {tokenizer.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)}
    for text, ours in zip(strings, ours_all, strict=True):
        theirs = sp.encode(text, add_bos=add_bos)
        counts["tokens"] += len(ours)
        n_bytes = sum(t in byte_ids for t in ours)
        counts["byte_fallback_tokens"] += n_bytes
        counts["strings_with_byte_fallback"] += n_bytes > 0
        if ours != theirs:
            counts["encode_mismatch"] += 1
            if len(examples) < 5:
                examples.append({"text": text[:120], "ours": ours[:40], "sentencepiece": theirs[:40]})
            continue
        body = ours[1:] if add_bos else ours
        decoded = tokenizer.decode(ours, skip_special_tokens=True)
        counts["decode_mismatch"] += decoded != sp.decode(ours)
        counts["roundtrip_differs"] += decoded != text
        head = body[:stream_tokens]
        for k in range(1, len(head) + 1):
            mine, ref = fast.decode(head[:k]), sp.decode(head[:k])
            counts["prefix_decodes"] += 1
            counts["partial_utf8_prefixes"] += ref.endswith(REPLACEMENT)
            if mine != ref and partial_run(mine, ref):
                counts["prefix_partial_run_differs"] += 1
            elif mine != ref:
                counts["prefix_mismatch"] += 1
                if len(examples) < 5:
                    examples.append({"prefix": head[:k], "ours": mine[-40:], "sentencepiece": ref[-40:]})
        counts["stream_mismatch"] += held_back_stream(fast.decode, head) != held_back_stream(sp.decode, head)
    counts["examples"] = examples
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="HF folder with tokenizer.json (default: packaged:gemma3)")
    parser.add_argument("--gguf", type=Path, help="the GGUF it came from (default: packaged:gemma3's)")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", type=Path, help="write the counts here too")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from trtkv.checkpoints.models import packaged_gguf, packaged_model

    start = time.time()
    model_dir = args.model_dir or packaged_model("gemma3")
    gguf = args.gguf or packaged_gguf("gemma3")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    sp, add_bos = reference(gguf)
    loaded = time.time() - start
    strings = corpus(args.limit)
    counts = compare(tokenizer, sp, add_bos, strings)
    counts.update({"load_seconds": round(loaded, 1), "check_seconds": round(time.time() - start - loaded, 1),
                   "reference": f"sentencepiece {version('sentencepiece')} on a ModelProto from gguf {version('gguf')}'s "
                                f"GGUFReader", "gguf": gguf.name, "model_dir": str(model_dir)})
    print(json.dumps(counts, indent=2, ensure_ascii=False))
    if args.json:
        args.json.write_text(json.dumps(counts, indent=2, ensure_ascii=False) + "\n")
    bad = counts["encode_mismatch"] + counts["decode_mismatch"] + counts["prefix_mismatch"] + counts["stream_mismatch"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
