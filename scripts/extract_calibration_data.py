#!/usr/bin/env python3
"""Re-extract the text under ``calibration_data/`` from Debian packages.

Only the standard library is used.  The packages are fetched with
``apt-get download`` (no installation, no root needed apart from what apt
itself requires) and unpacked with ``dpkg -x`` into a temporary directory.
No other network access is made.

Packages used:

* ``bible-kjv-text`` - the King James Version in the compressed format of
  the Bible Retrieval System (``/usr/lib/bible.data``).  It is decoded by
  running the ``bible`` program from the ``bible-kjv`` package (extracted,
  not installed) with ``-f`` (one verse per line) over ``Gen1:1-Rev22:21``.
* ``wordnet-base`` - WordNet 3.0 ``data.{noun,verb,adj,adv}`` glosses.
* ``bsdgames`` - the country/capital files of quiz(6).

Output (same packages in -> byte-identical files out):

* ``calib/kjv.jsonl``          Old Testament chunks (calibration)
* ``calib/wordnet.jsonl``      WordNet gloss paragraphs (calibration)
* ``eval/kjv_nt.jsonl``        New Testament chunks (evaluation / probing)
* ``eval/quiz_capitals.jsonl`` country -> capital quiz items (evaluation)
* ``README.md`` and ``manifest.json``

Usage::

    python scripts/extract_calibration_data.py --output calibration_data

``apt-get update`` may have to be run first so that apt knows the packages.
``--debs DIR`` reuses ``.deb`` files already in DIR instead of downloading.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("bible-kjv-text", "bible-kjv", "wordnet-base", "bsdgames")

REGEN_COMMAND = "python scripts/extract_calibration_data.py --output calibration_data"

# KJV chunking (characters of text).
KJV_CALIB_CHUNK = (2000, 3000, 4000)  # min, target, max
KJV_EVAL_CHUNK = (4000, 6000, 8000)
KJV_CALIB_TARGET_CHARS = 1_450_000  # ~1.5 MB of JSONL, spread evenly over the OT
KJV_TOTAL_VERSES = 31102
KJV_OT_BOOKS = 39
KJV_BOOKS = 66

# WordNet paragraphs.
WORDNET_CHUNK = (1000, 1500, 2000)
WORDNET_TARGET_CHARS = 470_000  # keeps the JSONL file under 0.5 MB
WORDNET_FILES = (("noun", "data.noun"), ("verb", "data.verb"),
                 ("adjective", "data.adj"), ("adverb", "data.adv"))

# bsdgames quiz: the country -> capital subjects listed in the quiz index.
QUIZ_DIR = "usr/share/games/bsdgames/quiz"
QUIZ_CAPITAL_FILES = ("africa", "america", "asia", "europe")


# --------------------------------------------------------------------------
# Packages
# --------------------------------------------------------------------------

@dataclass
class Package:
    name: str
    version: str
    source: str
    deb: Path
    root: Path


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a command given as an argument list (never through a shell)."""
    return subprocess.run(cmd, check=True, **kwargs)


def find_deb(directory: Path, name: str) -> Path | None:
    hits = sorted(directory.glob(f"{name}_*.deb"))
    return hits[-1] if hits else None


def fetch_packages(work: Path, debs_dir: Path | None) -> dict[str, Package]:
    download_dir = work / "debs"
    download_dir.mkdir(parents=True, exist_ok=True)
    packages: dict[str, Package] = {}
    for name in PACKAGES:
        deb = find_deb(debs_dir, name) if debs_dir else None
        if deb is None:
            run(["apt-get", "download", name], cwd=download_dir,
                stdout=subprocess.DEVNULL)
            deb = find_deb(download_dir, name)
            if deb is None:
                raise SystemExit(f"apt-get download {name} produced no .deb")
        fields = run(["dpkg-deb", "--field", str(deb), "Package", "Version", "Source"],
                     capture_output=True, text=True).stdout
        info = dict(line.split(": ", 1) for line in fields.splitlines() if ": " in line)
        if info.get("Package") != name:
            raise SystemExit(f"{deb} is not package {name}")
        root = work / "root" / name
        root.mkdir(parents=True, exist_ok=True)
        run(["dpkg", "-x", str(deb), str(root)])
        source = info.get("Source", name).split(" ")[0]
        packages[name] = Package(name, info["Version"], source, deb, root)
    return packages


# --------------------------------------------------------------------------
# Chunking helpers
# --------------------------------------------------------------------------

def split_even(pieces: list[str], parts: int, sep: str) -> list[list[str]]:
    """Split consecutive ``pieces`` into ``parts`` groups of similar length."""
    total = sum(len(p) + len(sep) for p in pieces)
    groups: list[list[str]] = [[] for _ in range(parts)]
    acc = 0
    for piece in pieces:
        # Index of the group this piece's midpoint falls into.
        mid = acc + (len(piece) + len(sep)) / 2
        groups[min(parts - 1, int(mid * parts / total))].append(piece)
        acc += len(piece) + len(sep)
    return [g for g in groups if g]


def pack(units: list[list[str]], sizes: tuple[int, int, int], sep: str,
         inner: str = " ") -> list[str]:
    """Greedily pack consecutive units into chunks of about ``target`` chars.

    A unit is a list of pieces (verses) joined by ``inner``; units are joined
    by ``sep``.  A unit longer than ``max`` must have been split beforehand.
    A chunk is closed once it reaches ``target``, or before a unit that would
    push it over ``max``; if the chunk is still shorter than ``min`` at that
    point, it is first topped up with the leading pieces of that unit.  A
    short tail is merged into the previous chunk if that stays within ``max``.
    """
    lo, target, hi = sizes
    chunks: list[str] = []
    cur: list[str] = []
    cur_len = 0

    def joined_len(pieces: list[str]) -> int:
        return sum(len(p) for p in pieces) + len(inner) * (len(pieces) - 1)

    for unit in units:
        unit = list(unit)
        ulen = joined_len(unit)
        if cur and cur_len + len(sep) + ulen > hi:
            if cur_len < lo:
                head: list[str] = []
                while len(unit) > 1:
                    cand = head + [unit[0]]
                    if cur_len + len(sep) + joined_len(cand) > target:
                        break
                    head = cand
                    unit.pop(0)
                if head:
                    cur.append(inner.join(head))
                    ulen = joined_len(unit)
            chunks.append(sep.join(cur))
            cur, cur_len = [], 0
        cur_len += ulen + (len(sep) if cur else 0)
        cur.append(inner.join(unit))
        if cur_len >= target:
            chunks.append(sep.join(cur))
            cur, cur_len = [], 0
    if cur:
        tail = sep.join(cur)
        if chunks and len(tail) < lo and len(chunks[-1]) + len(sep) + len(tail) <= hi:
            chunks[-1] = chunks[-1] + sep + tail
        else:
            chunks.append(tail)
    return chunks


def spread_select(items: list[str], target_chars: int) -> list[str]:
    """Pick items evenly spread over the list until about ``target_chars``."""
    total = sum(len(x) for x in items)
    if total <= target_chars:
        return list(items)
    ratio = target_chars / total
    # Bresenham-style: keep item i when floor((i+1)*r) > floor(i*r).
    return [x for i, x in enumerate(items)
            if math.floor((i + 1) * ratio) > math.floor(i * ratio)]


# --------------------------------------------------------------------------
# KJV
# --------------------------------------------------------------------------

VERSE_RE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


@dataclass
class Book:
    abbrev: str
    chapters: list[list[str]] = field(default_factory=list)


def kjv_books(bible: Package, text: Package) -> list[Book]:
    binary = bible.root / "usr/bin/bible"
    data_dir = text.root / "usr/lib"
    if not (data_dir / "bible.data").is_file():
        raise SystemExit(f"no bible.data in {data_dir}")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["LC_ALL"] = "C"
    # -f turns pretty-printing off: one verse per line, "Ge1:1 In the ...".
    # -p points at the extracted data instead of /usr/lib.
    out = run([str(binary), "-f", "-p", str(data_dir), "Gen1:1-Rev22:21"],
              cwd=data_dir, env=env, stdin=subprocess.DEVNULL,
              capture_output=True).stdout.decode("ascii")
    books: list[Book] = []
    last_chapter = None
    n_verses = 0
    for line in out.splitlines():
        m = VERSE_RE.match(line)
        if not m:
            raise SystemExit(f"unexpected line from bible: {line!r}")
        abbrev, chapter, verse_text = m.group(1), int(m.group(2)), m.group(4)
        verse_text = " ".join(verse_text.split())  # collapse double spaces
        if not books or books[-1].abbrev != abbrev:
            books.append(Book(abbrev))
            last_chapter = None
        if chapter != last_chapter:
            books[-1].chapters.append([])
            last_chapter = chapter
        books[-1].chapters[-1].append(verse_text)
        n_verses += 1
    if n_verses != KJV_TOTAL_VERSES or len(books) != KJV_BOOKS:
        raise SystemExit(f"bible output: {n_verses} verses in {len(books)} books, "
                         f"expected {KJV_TOTAL_VERSES} in {KJV_BOOKS}")
    if not books[KJV_OT_BOOKS].abbrev.startswith("Mat"):
        raise SystemExit(f"book {KJV_OT_BOOKS + 1} is {books[KJV_OT_BOOKS].abbrev}, "
                         "expected Matthew")
    return books


def kjv_chunks(books: list[Book], sizes: tuple[int, int, int]) -> list[str]:
    """Chapters (verses joined by spaces) packed into chunks; chapters that
    are too long are split evenly at verse boundaries.  Chapters and books
    within one chunk are separated by a blank line."""
    _, target, hi = sizes
    units: list[list[str]] = []
    for book in books:
        for verses in book.chapters:
            chapter = " ".join(verses)
            if len(chapter) <= hi:
                units.append(verses)
            else:
                units.extend(split_even(verses, math.ceil(len(chapter) / target), " "))
    return pack(units, sizes, "\n\n")


# --------------------------------------------------------------------------
# WordNet
# --------------------------------------------------------------------------

ADJ_MARKER_RE = re.compile(r"\((?:a|p|ip)\)$")


def wordnet_entries(wordnet: Package) -> list[str]:
    """One line per synset that has an example sentence:
    ``word, other word (noun): gloss; "example"``."""
    base = wordnet.root / "usr/share/wordnet"
    per_pos: list[list[str]] = []
    for pos_name, filename in WORDNET_FILES:
        entries = []
        with open(base / filename, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("  "):  # licence header
                    continue
                head, sep, gloss = line.partition(" | ")
                gloss = " ".join(gloss.split())
                if not sep or '"' not in gloss:
                    continue
                fields = head.split()
                w_cnt = int(fields[3], 16)
                words = []
                for i in range(w_cnt):
                    word = ADJ_MARKER_RE.sub("", fields[4 + 2 * i]).replace("_", " ")
                    if word not in words:
                        words.append(word)
                entries.append(f"{', '.join(words)} ({pos_name}): {gloss}")
        per_pos.append(entries)
    # Interleave the parts of speech proportionally so every paragraph
    # region mixes nouns, verbs, adjectives and adverbs.
    total = sum(len(e) for e in per_pos)
    keyed = []
    for p, entries in enumerate(per_pos):
        n = len(entries)
        for i, entry in enumerate(entries):
            keyed.append(((i + 0.5) * total / n, p, entry))
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [k[2] for k in keyed]


def wordnet_license(wordnet: Package) -> str:
    lines = []
    with open(wordnet.root / "usr/share/wordnet/data.adv", encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("  "):
                break
            m = re.match(r"^\s+\d+ ?(.*?)\s*$", line)
            lines.append(m.group(1) if m else "")
    return "\n".join(lines).strip()


# --------------------------------------------------------------------------
# bsdgames quiz
# --------------------------------------------------------------------------

def quiz_lines(path: Path) -> list[str]:
    """Logical lines of a quiz data file (backslash-newline continues)."""
    raw = path.read_bytes().decode("utf-8")
    out: list[str] = []
    buf = ""
    for line in raw.split("\n"):
        if line.endswith("\\") and not line.endswith("\\\\"):
            buf += line[:-1]
            continue
        buf += line
        if buf:
            out.append(buf)
        buf = ""
    if buf:
        out.append(buf)
    return out


def split_categories(line: str) -> list[str]:
    """Split on ':' not quoted by a backslash; the pieces are kept raw."""
    parts, cur, i = [], "", 0
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            cur += line[i:i + 2]
            i += 2
            continue
        if c == ":":
            parts.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    parts.append(cur)
    return parts


def quiz_capitals(bsdgames: Package) -> tuple[list[dict], list[str]]:
    qdir = bsdgames.root / QUIZ_DIR
    index = {}
    index_lines = []
    for line in quiz_lines(qdir / "index"):
        cats = split_categories(line)
        index[Path(cats[0]).name] = cats[1:]
        index_lines.append(line)
    records = []
    for name in QUIZ_CAPITAL_FILES:
        cats = index.get(name)
        if not cats or len(cats) != 2 or cats[1] != "cap{ital}":
            raise SystemExit(f"quiz index entry for {name} is not <region>:cap{{ital}}: {cats}")
        for line in quiz_lines(qdir / name):
            fields = split_categories(line)
            if len(fields) != 2 or not fields[0] or not fields[1]:
                raise SystemExit(f"unexpected quiz line in {name}: {line!r}")
            records.append({"question": fields[0], "answer": fields[1],
                            "source": f"bsdgames quiz {name}"})
    wanted = [entry for entry in index_lines
              if Path(split_categories(entry)[0]).name in QUIZ_CAPITAL_FILES]
    return records, wanted


def bsd_license(bsdgames: Package) -> str:
    text = (bsdgames.root / "usr/share/doc/bsdgames/copyright").read_text(encoding="utf-8")
    start = text.index("   Copyright (c) 1980")
    end = text.index("SUCH DAMAGE.", start) + len("SUCH DAMAGE.")
    return "\n".join(line[3:] if line.startswith("   ") else line.strip()
                     for line in text[start:end].splitlines())


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

def jsonl_bytes(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def length_stats(texts: list[str]) -> str:
    lens = sorted(len(t) for t in texts)
    return f"min {lens[0]}, median {lens[len(lens) // 2]}, max {lens[-1]} characters"


def indent(text: str) -> str:
    return "\n".join(("    " + line) if line else "" for line in text.splitlines())


def readme(files: dict, pk: dict[str, Package], stats: dict, wn_licence: str,
           bsd_licence: str, index_lines: list[str]) -> str:
    def ver(name: str) -> str:
        return f"`{name}` {pk[name].version}"

    def row(path: str) -> str:
        f = files[path]
        return f"| `{path}` | {f['records']} | {f['bytes']} |"

    total = sum(f["bytes"] for f in files.values())
    return f"""# Calibration and evaluation text

Plain text shipped with trtkv for KV-cache quantization.  Everything here is
extracted from Debian packages and can be regenerated byte for byte with

    {REGEN_COMMAND}

(run `apt-get update` first if apt does not know the packages; the script
uses `apt-get download` and `dpkg -x` only, nothing is installed).

**`calib/` is for calibration** (computing KV-cache scales) and **`eval/` is
for evaluation and probing** (accuracy checks, long-context probes).  They are
kept apart: the calibration KJV text is Old Testament only and the evaluation
KJV text is New Testament only, so no evaluation text is seen during
calibration.  Do not calibrate on files under `eval/`.

| file | records | bytes |
|---|---:|---:|
{row("calib/kjv.jsonl")}
{row("calib/wordnet.jsonl")}
{row("eval/kjv_nt.jsonl")}
{row("eval/quiz_capitals.jsonl")}

Total: {total} bytes.  `manifest.json` lists records, bytes, sha256 and the
source package/version of each file.

## calib/kjv.jsonl and eval/kjv_nt.jsonl

* Packages: {ver("bible-kjv-text")} (the compressed text, `usr/lib/bible.data`)
  decoded with the `bible` program of {ver("bible-kjv")}.
* Upstream: the Authorized (King James) Version of 1611, as distributed with
  the Bible Retrieval System by Chip Chapin (Hewlett Packard, 1989-1993),
  packaged for Debian by Christoph Lameter and Matthew Vernon.
* Licence: the KJV text is in the public domain (Debian's copyright file,
  `usr/share/doc/bible-kjv-text/copyright`: "The copyright for the King James
  Version text of the Bible is expired").  The `bible` program (GPL-2+) is
  only run, not shipped.
* How: `bible -f -p <extracted usr/lib> Gen1:1-Rev22:21` prints one verse per
  line (`Ge1:1 In the beginning ...`, {KJV_TOTAL_VERSES} verses); the references
  are stripped and runs of spaces collapsed.  Verses of a chapter
  are joined by spaces; chapters (and books) inside one record are separated
  by a blank line.  Chapters longer than the maximum are split evenly at verse
  boundaries, and a short record is topped up with the first verses of the
  next chapter, so a record may start or end mid-chapter (always at a verse
  boundary).
* Format: one JSON object per line, `{{"text": ...}}`.
* `calib/kjv.jsonl`: Old Testament (Genesis-Malachi) only.  Chunks aimed at
  {KJV_CALIB_CHUNK[1]} characters, at most {KJV_CALIB_CHUNK[2]}; an evenly spread
  subset of all OT chunks is kept to stay near 1.5 MB.
  Kept: {stats['kjv_sel']}; lengths: {stats['kjv']}.
* `eval/kjv_nt.jsonl`: the whole New Testament (Matthew-Revelation) only.
  Chunks aimed at {KJV_EVAL_CHUNK[1]} characters, at most {KJV_EVAL_CHUNK[2]}.
  Lengths: {stats['kjv_nt']}.

## calib/wordnet.jsonl

* Package: {ver("wordnet-base")} (`usr/share/wordnet/data.noun`, `data.verb`,
  `data.adj`, `data.adv`).
* Upstream: WordNet 3.0, Princeton University.
* Licence: "WordNet 3.0 license" (permissive, BSD-like; Debian calls it
  `WordNet3.0`).  Its text is in the package in
  `usr/share/doc/wordnet-base/copyright` and at the top of every `data.*`
  file; it is reproduced below as the licence requires.
* How: every synset whose gloss contains an example sentence becomes one line
  `word, synonym (part of speech): gloss; "example"` (underscores become
  spaces, adjective position markers are dropped).  The four parts of speech
  are interleaved in proportion, an evenly spread subset is kept, and
  consecutive lines are joined with newlines into paragraphs aimed at
  {WORDNET_CHUNK[1]} characters, at most {WORDNET_CHUNK[2]}.
  Kept: {stats['wordnet_sel']}; lengths: {stats['wordnet']}.
* Format: `{{"text": ...}}` per line.

WordNet licence (from `data.adv`):

{indent(wn_licence)}

## eval/quiz_capitals.jsonl

* Package: {ver("bsdgames")} (`{QUIZ_DIR}/{{{",".join(QUIZ_CAPITAL_FILES)}}}`).
  bsdgames has no single "capitals" file: the country -> capital subjects are
  these four region files, each declared `<Region>:cap{{ital}}` in the quiz
  `index`.
* Upstream: bsd-games 2.17 (Linux port of the NetBSD games); quiz(6) by Jim R.
  Oldroyd and Keith Gabryelski.
* Licence: BSD licence (University of California), see
  `usr/share/doc/bsdgames/copyright`; notice reproduced below.
* Format: one record per data line, in file order:
  `{{"question": <country field>, "answer": <capital field>, "source": "bsdgames quiz <file>"}}`.
  Both fields are the raw patterns from the file (the country field uses the
  same syntax, e.g. `{{The }}Gambia`, `Bahr[a|e]in`).

Index lines for these files (first field: data file; then one pattern per
category, i.e. the question category and the answer category):

{indent(chr(10).join(index_lines))}

### Answer-pattern syntax (quiz(6))

Each data line is a set of categories separated by `:`; each category is a
pattern built from:

* `pat|pat` - alternative patterns: `Vienna|Wien` accepts either.
* `{{pat}}` - optional pattern: `Bern{{e}}` accepts `Bern` and `Berne`;
  `Washington{{ DC}}` accepts `Washington` and `Washington DC`.
* `[pat]` - delimits alternatives inside a word, as in `pat[pat|pat]pat`:
  `Rom[e|a]` accepts `Rome` and `Roma`; `Port[-| ]au[-| ]Prince`.
* `\\` quotes a significant character, or at the end of a line continues it.
* An empty question or answer is never asked.

Accented letters are written as backspace overstrikes, e.g.
`Bogot['<BS>a|a<BS>'|a]` (BS = U+0008, shown as `\\b` in the JSON) accepts
`Bogota` typed plainly or with an overstruck accent.  These backspaces are
kept as they are in the file.  Matching in quiz(6) is case-insensitive.
To score a model answer, expand the pattern into its set of accepted strings
(or translate it to a regular expression: `{{x}}` -> `(?:x)?`, `[x]` ->
`(?:x)`, `|` stays `|`, every other character escaped, whole-string match,
ignoring case).

BSD licence notice (from `usr/share/doc/bsdgames/copyright`):

{indent(bsd_licence)}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", type=Path, default=Path("calibration_data"),
                    help="output directory (default: calibration_data)")
    ap.add_argument("--debs", type=Path, default=None,
                    help="directory with already downloaded .deb files to reuse")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="trtkv-calib-") as tmp:
        pk = fetch_packages(Path(tmp), args.debs)

        books = kjv_books(pk["bible-kjv"], pk["bible-kjv-text"])
        ot_all = kjv_chunks(books[:KJV_OT_BOOKS], KJV_CALIB_CHUNK)
        ot = spread_select(ot_all, KJV_CALIB_TARGET_CHARS)
        nt = kjv_chunks(books[KJV_OT_BOOKS:], KJV_EVAL_CHUNK)

        wn_entries = wordnet_entries(pk["wordnet-base"])
        wn_sel = spread_select(wn_entries, WORDNET_TARGET_CHARS)
        wn = pack([[e] for e in wn_sel], WORDNET_CHUNK, "\n")
        wn_licence = wordnet_license(pk["wordnet-base"])

        quiz, index_lines = quiz_capitals(pk["bsdgames"])
        bsd_licence = bsd_license(pk["bsdgames"])

    kjv_src = "bible-kjv-text"
    kjv_ver = pk["bible-kjv-text"].version
    outputs = {
        "calib/kjv.jsonl": ([{"text": t} for t in ot], kjv_src, kjv_ver),
        "calib/wordnet.jsonl": ([{"text": t} for t in wn], "wordnet-base",
                                pk["wordnet-base"].version),
        "eval/kjv_nt.jsonl": ([{"text": t} for t in nt], kjv_src, kjv_ver),
        "eval/quiz_capitals.jsonl": (quiz, "bsdgames", pk["bsdgames"].version),
    }
    files = {}
    for rel, (records, package, version) in outputs.items():
        data = jsonl_bytes(records)
        write(args.output / rel, data)
        files[rel] = {"records": len(records), "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(),
                      "package": package, "version": version,
                      "split": rel.split("/")[0]}
        if package == kjv_src:
            files[rel]["decoded_with"] = f"bible-kjv {pk['bible-kjv'].version}"

    stats = {
        "kjv": length_stats(ot),
        "kjv_sel": f"{len(ot)} of {len(ot_all)} chunks",
        "kjv_nt": length_stats(nt),
        "wordnet_sel": f"{len(wn_sel)} of {len(wn_entries)} synsets with examples",
        "wordnet": length_stats(wn),
    }
    write(args.output / "README.md",
          readme(files, pk, stats, wn_licence, bsd_licence, index_lines).encode("utf-8"))
    manifest = {
        "regenerate": REGEN_COMMAND,
        "packages": {name: p.version for name, p in sorted(pk.items())},
        "files": files,
    }
    write(args.output / "manifest.json",
          (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8"))

    for rel, f in files.items():
        print(f"{rel}: {f['records']} records, {f['bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
