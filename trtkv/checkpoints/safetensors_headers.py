"""The tensors a checkpoint folder stores, read from its safetensors headers alone (no tensor data
loaded): `read_tensors(folder)` lists every tensor's name, dtype, shape, bytes and shard.

The folder is read as transformers and the engines find the weights: `model.safetensors.index.json`
(its `weight_map`: tensor -> shard), else `model.safetensors`, else every `*.safetensors` file in
it. Each shard is an 8-byte little-endian header length, then that many bytes of JSON (tensor ->
dtype, shape, data_offsets; an optional `__metadata__` of strings), then the data (the format as
huggingface/safetensors documents it). Everything is untrusted: the index and each header are
bounded in size (MAX_INDEX_BYTES, MAX_HEADER_BYTES: safetensors' own 100 MB header cap), parsed as
strict JSON, and every entry checked (a known dtype, a shape of non-negative integers, offsets that
hold exactly the shape's bytes inside the file, shard names that stay in the folder). A malformed
file is a SafetensorsError naming the file, what is wrong and the next step.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError
from trtkv.core.files import NotReadable, read_json, strict_json

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_INDEX_BYTES = 64 * 1024 * 1024  # DeepSeek-V3's index is ~9 MB
MAX_HEADER_BYTES = 100_000_000  # safetensors' own cap (MAX_HEADER_SIZE)
MAX_SHARDS = 4096
# bits per element of every dtype safetensors names (sub-byte and 6-bit ones packed)
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
}
_SHARD_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,200}\.safetensors")


class SafetensorsError(StageError):
    """A safetensors index or header that cannot be read: names the file, the problem and the next
    step."""


@dataclass(frozen=True)
class TensorEntry:
    """One stored tensor as its shard's header lists it."""

    name: str
    dtype: str  # the safetensors dtype code: "BF16", "F8_E4M3", "U8", ...
    shape: tuple[int, ...]
    nbytes: int  # bytes it occupies in the shard (data_offsets end - begin)
    shard: str  # the shard's file name, inside the folder
    offset: int = field(default=0, compare=False)  # where its bytes begin in the shard file


def weight_files(folder: Path) -> list[str]:
    """The shard file names the folder's weights are stored in (empty: the folder holds no
    safetensors weights, e.g. a config.json alone)."""
    if (folder / INDEX).is_file():
        return sorted(set(index_map(folder).values()))
    if (folder / SINGLE).is_file():
        return [SINGLE]
    return sorted(p.name for p in folder.glob("*.safetensors") if p.is_file())


def holds_weights(folder: Path) -> bool:
    """Whether the folder stores its weights as safetensors (an index or at least one shard)."""
    return folder.is_dir() and bool(weight_files(folder))


def read_tensors(folder: Path) -> list[TensorEntry]:
    """Every tensor the folder's safetensors shards store, sorted by name; SafetensorsError on a
    malformed index or header, or an index naming a tensor its shard does not hold."""
    mapped = index_map(folder) if (folder / INDEX).is_file() else None
    shards = sorted(set(mapped.values())) if mapped is not None else weight_files(folder)
    if not shards:
        raise SafetensorsError(
            f"{folder}: no {INDEX}, {SINGLE} or *.safetensors file. Next: pass the folder that "
            "holds the checkpoint's weights, or its config.json alone for an estimate."
        )
    entries: list[TensorEntry] = []
    for shard in shards:
        entries += read_header(folder / shard)
    if mapped is not None:
        stored = {e.name: e.shard for e in entries}
        wrong = sorted(n for n, s in mapped.items() if stored.get(n) != s)
        if wrong:
            first = wrong[0]
            raise SafetensorsError(
                f"{folder / INDEX}: weight_map puts {len(wrong)} tensor(s) in a shard whose header "
                f"does not list them (first: {first!r} -> {mapped[first]!r}). Next: the download "
                "is incomplete or mixed; fetch the checkpoint again."
            )
    return sorted(entries, key=lambda e: e.name)


def read_header(path: Path) -> list[TensorEntry]:
    """The tensors one safetensors file stores, from its header (the data is not read)."""
    raw, size = _header_bytes(path)
    try:
        header = strict_json(raw)
    except ValueError as exc:
        raise _bad(path, f"the header is not readable JSON ({str(exc)[:120]})") from None
    if not isinstance(header, dict):
        raise _bad(path, f"the header is a {type(header).__name__}, not an object")
    data_bytes = size - 8 - len(raw)
    out = []
    for name, spec in header.items():
        if name == "__metadata__":
            if not isinstance(spec, dict) or not all(isinstance(v, str) for v in spec.values()):
                raise _bad(path, "__metadata__ is not an object of strings")
            continue
        out.append(_entry(path, name, spec, data_bytes, 8 + len(raw)))
    return out


def _entry(path: Path, name: str, spec: Any, data_bytes: int, base: int) -> TensorEntry:
    """One header entry, checked: a known dtype, a shape, offsets holding exactly its bytes (which
    begin at `base` + its first offset in the file)."""
    if not isinstance(spec, dict):
        raise _bad(path, f"tensor {name[:100]!r}: its entry is not an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise _bad(
            path,
            f"tensor {name[:100]!r}: dtype {str(dtype)[:20]!r} (known: {', '.join(DTYPE_BITS)})",
        )
    if not (
        isinstance(shape, list)
        and len(shape) <= 16
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise _bad(path, f"tensor {name[:100]!r}: shape {str(shape)[:60]} is not a list of sizes")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise _bad(
            path,
            f"tensor {name[:100]!r}: data_offsets {str(offsets)[:60]} are not inside the file's "
            f"{data_bytes} data bytes",
        )
    nbits = prod(shape) * DTYPE_BITS[dtype]
    nbytes = offsets[1] - offsets[0]
    if nbytes != (nbits + 7) // 8:
        raise _bad(
            path,
            f"tensor {name[:100]!r}: {nbytes} bytes stored for {dtype} {shape} "
            f"({(nbits + 7) // 8} expected)",
        )
    return TensorEntry(name, dtype, tuple(shape), nbytes, path.name, base + offsets[0])


def _header_bytes(path: Path) -> tuple[bytes, int]:
    """The header's JSON bytes and the file's size, read from a regular file without blocking."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _bad(path, f"cannot open: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "a special file"
        raise _bad(path, f"{what}, not a regular file")
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _bad(path, f"{st.st_size} bytes: shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or length > st.st_size - 8:
            raise _bad(
                path,
                f"header length {length} is beyond the file ({st.st_size} bytes) or the "
                f"{MAX_HEADER_BYTES:,}-byte cap",
            )
        raw = fh.read(length)
    if len(raw) != length:
        raise _bad(path, f"the header ends after {len(raw)} of {length} bytes")
    return raw, st.st_size


def index_map(folder: Path) -> dict[str, str]:
    """The index's weight_map (tensor -> shard file name), checked."""
    path = folder / INDEX
    try:
        index = read_json(path, MAX_INDEX_BYTES, "safetensors index")
    except NotReadable as exc:
        raise _bad(path, exc.problem) from None
    mapped = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(mapped, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapped.items()
    ):
        raise _bad(path, "weight_map is not an object of tensor name -> shard file name")
    bad = sorted({v for v in mapped.values() if not _SHARD_NAME.fullmatch(v)})
    if bad:
        raise _bad(
            path,
            f"weight_map names {bad[0][:80]!r}: a shard must be a *.safetensors file name in the "
            "folder (no path)",
        )
    if len(set(mapped.values())) > MAX_SHARDS:
        raise _bad(path, f"weight_map names more than {MAX_SHARDS} shards")
    return mapped


def _bad(path: Path, problem: str) -> SafetensorsError:
    return SafetensorsError(
        f"{path}: {problem}. Next: fetch the file again as published (a partial download or a file "
        "that is not safetensors), or pass the folder's config.json alone for an estimate."
    )
