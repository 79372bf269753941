"""Bring trtkv/ to a line length of 100 (issue #43 step 3) in one mechanical pass that can be re-run on any main.

    .venv/bin/python scripts/reflow_lines.py [--package trtkv] [--width 100] [--no-mypy] [--allow-dirty]

1. writes <package>/ruff.toml: extends pyproject.toml with line-length 100 (ruff format and E501) for that folder
   only (tests/, scripts/, benchmarks/ and tools/ keep pyproject's 130); repo/templates/ (files shipped as data,
   hashed into stage keys) is never formatted and has no E501/I001 (isort wraps at the line length too);
2. runs `ruff format <package>`;
3. rewraps what the formatter leaves over the limit (the rows ruff's E501 reports), with tokenize and ast, never
   regexes over code: a long trailing comment moves above its line; comment blocks and docstring paragraphs are
   reflowed from the long line on (code blocks, tables, doctests, pragmas and docstrings the code reads through
   `__doc__` are left alone); long string literals and f-strings are split at spaces into implicitly concatenated
   pieces, or their last words carried into the next piece of the same concatenation (each change checked to keep
   the value) that `ruff format` then lays out; repeated until nothing moves;
4. marks what is left (unbreakable strings such as URLs, code and tables in docstrings, the values of multi-line
   strings) with `ruff check --add-noqa` and lists it; drops the `# noqa` comments the formatter carried off their
   statement's line (new RUF100 findings only) and puts the `# type: ignore[code]` comments it moved back on the
   line mypy reports;
5. checks every changed module against its original: the ASTs must be equal (implicit concatenations are joined
   by the parser; docstrings compare with whitespace collapsed, exactly where the module reads `__doc__`), and each
   comment must still annotate the statement it annotated (scripts/comment_anchors.py: comments are not in the
   AST; issue #47 found lifted comments stacked over the next statement, merged into another or put between a
   decorator and its `def`); exits 1 on any difference, a ruff, format or mypy finding, or a dirty tree.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import subprocess
import sys
import time
import tokenize
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.comment_anchors import misplaced, report  # noqa: E402

RUFF = ROOT / ".venv" / "bin" / "ruff"
ROUNDS = 8
# shipped as data (copied into users' Triton repositories, their bytes hashed): never formatted, no E501
KEEP = ("repo/templates",)
# comments whose words tools read: never rewrapped or moved
PRAGMA = re.compile(r"#\s*(noqa|type:|pragma|fmt:|pyright:|mypy:|ruff:|isort:|!)")
LIST_MARKER = re.compile(r"(?:[-*+•] |\d{1,2}[.)] )")
NOT_PROSE = ("|", "+--", ">>>", "...", "$ ", "```", "#", "..")


@dataclass
class Seg:
    """One physical line of a comment block or docstring: fixed head, wrappable body, fixed tail."""

    head: str
    body: str
    tail: str = ""
    cont: str = ""  # head of the lines that continue this one
    fixed: bool = False  # code, table, pragma, blank: never wrapped, never merged into

    @property
    def width(self) -> int:
        return len(self.head) + len(self.body) + len(self.tail)


def _hanging(head: str, body: str) -> str:
    m = LIST_MARKER.match(body)
    return head + " " * (m.end() if m else 0)


def _mergeable(seg: Seg, cont: str) -> bool:
    return (not seg.fixed and seg.head == cont and bool(seg.body.strip())
            and not LIST_MARKER.match(seg.body) and not seg.body.startswith(NOT_PROSE))


def rewrap(segs: list[Seg], i: int, width: int) -> bool:
    """Greedy reflow from segs[i] on: the overflow goes to the start of the next line of the same paragraph, else to
    a new line; True when every touched line fits."""
    while i < len(segs):
        s = segs[i]
        if s.width <= width:
            return True
        if s.fixed:
            return False
        room = width - len(s.head)
        spaces = [k for k, ch in enumerate(s.body) if ch == " " and s.body[:k].strip()]
        fits = [k for k in spaces if k <= room]
        if fits:
            cut = max(fits)
        else:
            later = [k for k in spaces if k > room]
            if not later:
                return False
            cut = min(later)
        keep, rest = s.body[:cut].rstrip(), s.body[cut + 1 :].lstrip()
        if not rest:
            return False
        nxt = segs[i + 1] if i + 1 < len(segs) else None
        segs[i] = replace(s, body=keep, tail="")
        if not s.tail and nxt is not None and _mergeable(nxt, s.cont):
            segs[i + 1] = replace(nxt, body=rest + " " + nxt.body.lstrip())
        else:
            segs.insert(i + 1, Seg(s.cont, rest, s.tail, s.cont))
        i += 1
    return True


# ---- strings ------------------------------------------------------------------------------------------------------


def _scan(body: str, is_f: bool) -> tuple[list[int], list[tuple[int, int]]]:
    """Split points (index just after a space outside escapes and replacement fields) and the fields' spans."""
    cuts: list[int] = []
    fields: list[tuple[int, int]] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c == "\\":
            if body.startswith("\\N{", i):
                i = body.find("}", i) + 1 or n
            else:
                i += 2
            continue
        if is_f and c == "{":
            if body.startswith("{{", i):
                i += 2
                continue
            start, depth, quote = i, 0, ""
            while i < n:
                ch = body[i]
                if quote:
                    quote = "" if ch == quote else quote
                elif ch in "'\"":
                    quote = ch
                elif ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            fields.append((start, i + 1))
            i += 1
            continue
        if is_f and c == "}":
            i += 2
            continue
        if c == " ":
            cuts.append(i + 1)
        i += 1
    return cuts, fields


def _same_value(a: str, b: str) -> bool:
    """Same value: compared beside a replacement field (text strings), so that f"x" and "x" compare equal as the
    parts of an f-string they are."""
    prefix = a[: len(a) - len(a.lstrip("rRbBuUfF"))]
    field = "" if "b" in prefix.lower() else ' f"{_}"'
    try:
        dumps = [ast.dump(ast.parse(f"(\n{s}{field}\n)", mode="eval")) for s in (a, b)]
    except SyntaxError:
        return False
    return dumps[0] == dumps[1]


def _parts(text: str) -> tuple[str, str, str] | None:
    """(prefix, quote, body) of a one-line string literal's source; None for triple quotes or a line break."""
    prefix = text[: len(text) - len(text.lstrip("rRbBuUfF"))]
    if text[len(prefix) : len(prefix) + 3] in ('"""', "'''") or "\n" in text or len(text) < len(prefix) + 2:
        return None
    return prefix, text[len(prefix)], text[len(prefix) + 1 : -1]


def _chunks(body: str, is_f: bool, prefix: str, first: int, rest: int) -> list[tuple[int, int]]:
    cuts, _ = _scan(body, is_f)
    chunks: list[tuple[int, int]] = []
    start, avail = 0, first
    while True:
        limit = avail - len(prefix) - 2
        open_cuts = [c for c in cuts if start < c < len(body)]
        if len(body) - start <= limit or not open_cuts:
            chunks.append((start, len(body)))
            return chunks
        fit = [c for c in open_cuts if c - start <= limit]
        cut = max(fit) if fit else min(open_cuts)
        chunks.append((start, cut))
        start, avail = cut, rest


def _render(prefix: str, q: str, body: str) -> str:
    """A literal for `body` (source text of `prefix` strings); an f-string without fields becomes plain (F541)."""
    is_f = "f" in prefix.lower()
    if is_f and not _scan(body, True)[1]:
        prefix = prefix.replace("f", "").replace("F", "")
        body = body.replace("{{", "{").replace("}}", "}")
    return prefix + q + body + q


def split_string(text: str, first: int, rest: int) -> list[str] | None:
    """A one-line string literal's source as pieces that concatenate to the same value, the first at most `first`
    characters long and the others `rest` where spaces allow; None when it cannot be split."""
    parts = _parts(text)
    if parts is None:
        return None
    prefix, q, body = parts
    chunks = _chunks(body, "f" in prefix.lower(), prefix, first, rest)
    if len(chunks) < 2:
        return None
    pieces = [_render(prefix, q, body[a:b]) for a, b in chunks]
    return pieces if _same_value(text, " ".join(pieces)) else None


def _braces(body: str, prefix: str) -> str:
    """`body` as the source of an f-string's literal text."""
    return body if "f" in prefix.lower() else body.replace("{", "{{").replace("}", "}}")


def carry_over(text: str, nxt: str, first: int) -> tuple[str, str] | None:
    """Two adjacent pieces of an implicit concatenation with the words of `text` past `first` characters moved to
    the start of `nxt` (the paragraph way, no short fragments); None when they cannot be merged safely."""
    a, b = _parts(text), _parts(nxt)
    if a is None or b is None or a[1] != b[1] or "\\N{" in text + nxt:
        return None
    if a[0].lower().replace("f", "") != b[0].lower().replace("f", ""):
        return None
    chunks = _chunks(a[2], "f" in a[0].lower(), a[0], first, 10**6)
    if len(chunks) != 2:
        return None
    keep, moved = a[2][: chunks[1][0]], a[2][chunks[1][0] :]
    if "f" in a[0].lower() or "f" in b[0].lower():
        f_prefix = b[0] if "f" in b[0].lower() else b[0] + "f"
        merged = _render(f_prefix, b[1], _braces(moved, a[0]) + _braces(b[2], b[0]))
    else:
        merged = _render(b[0], b[1], moved + b[2])
    head = _render(a[0], a[1], keep)
    return (head, merged) if _same_value(text + " " + nxt, head + " " + merged) else None


# ---- one file -----------------------------------------------------------------------------------------------------


def doc_nodes(tree: ast.AST) -> list[ast.Constant]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    out.append(first.value)
    return out


def exact_docs(tree: ast.AST) -> set[str]:
    """Names whose docstring the module reads at run time ("" for the module's own `__doc__`)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "__doc__":
            names.add("")
        elif isinstance(node, ast.Attribute) and node.attr == "__doc__" and isinstance(node.value, ast.Name):
            names.add(node.value.id)
    return names


def _exact_doc_positions(tree: ast.AST) -> set[tuple[int, int]]:
    names = exact_docs(tree)
    pos = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = "" if isinstance(node, ast.Module) else node.name
            docs = doc_nodes(node)
            if name in names and docs and node.body[0].value is docs[0]:  # type: ignore[attr-defined]
                pos.add((docs[0].lineno, docs[0].col_offset))
    return pos


@dataclass
class Edit:
    first: int  # 1-based rows, inclusive
    last: int
    lines: list[str]
    kind: str


def _comment_block(lines: list[str], row: int, col: int, width: int) -> Edit | None:
    def standalone(r: int) -> bool:
        text = lines[r - 1]
        return 1 <= r <= len(lines) and text[:col].strip() == "" and text[col : col + 1] == "#"

    text = lines[row - 1].rstrip()
    if len(text) > width and len(set(text[col + 1 :].strip())) == 1 and text[-1] in "-=*#~_":  # a ruler line
        return Edit(row, row, [text[:width]], "comment")
    top, bottom = row, row
    while top > 1 and standalone(top - 1):
        top -= 1
    while bottom < len(lines) and standalone(bottom + 1):
        bottom += 1
    segs = []
    for r in range(top, bottom + 1):
        text = lines[r - 1].rstrip()
        rest = text[col + 1 :]
        head = text[: col + 1] + rest[: len(rest) - len(rest.lstrip())]
        body = text[len(head) :]
        fixed = not body or bool(PRAGMA.match(text[col:])) or not rest.startswith(" ")
        segs.append(Seg(head, body, cont=_hanging(head, body), fixed=fixed))
    rewrap(segs, row - top, width)
    new = [s.head + s.body + s.tail for s in segs]
    return Edit(top, bottom, new, "comment") if new != lines[top - 1 : bottom] else None


def _docstring(lines: list[str], tok: tokenize.TokenInfo, rows: set[int], width: int) -> Edit | None:
    (sr, sc), (er, ec) = tok.start, tok.end
    text = tok.string
    prefix = text[: len(text) - len(text.lstrip("rRuU"))]
    if text[len(prefix) : len(prefix) + 3] not in ('"""', "'''") or lines[sr - 1][:sc].strip():
        return None
    if any(line.rstrip().endswith("\\") for line in lines[sr - 1 : er]):
        return None
    base = lines[sr - 1][:sc]
    segs: list[Seg] = []
    fence = literal = False
    literal_indent = 0
    for r in range(sr, er + 1):
        line = lines[r - 1]
        lo = sc + len(prefix) + 3 if r == sr else 0
        hi = ec - 3 if r == er else len(line)
        inner = line[lo:hi].rstrip()
        tail = line[hi:] if r == er else ""
        if r == sr:
            head, body = line[:lo], inner
        else:
            head = inner[: len(inner) - len(inner.lstrip())]
            body = inner[len(head) :]
        indent = len(head) if r != sr else len(base)
        if literal and body and indent <= literal_indent:
            literal = False
        if body and r != sr and indent > len(base) and segs and not segs[-1].body and not literal:
            literal, literal_indent = True, len(base)  # an indented block after a blank line: code, kept
        code = fence or literal or body.startswith(NOT_PROSE)
        if body.startswith("```"):
            fence = not fence
        if body.endswith("::"):
            literal, literal_indent = True, indent
        segs.append(Seg(head, body, tail, _hanging(base if r == sr else head, body), fixed=code or not body))
    k = 0
    while k < len(segs):
        if segs[k].width > width and not segs[k].fixed:
            rewrap(segs, k, width)
        k += 1
    new = [s.head + s.body + s.tail for s in segs]
    return Edit(sr, er, new, "docstring") if new != lines[sr - 1 : er] else None


def _move_comment(lines: list[str], toks: list[tokenize.TokenInfo], com: tokenize.TokenInfo) -> Edit | None:
    row, col = com.start
    if PRAGMA.search(com.string) or "noqa" in com.string:
        return None
    starts = [t.start[0] for t in toks if t.start[0] <= row <= t.end[0] and t.type not in _SKIP]
    anchor = min(starts) if starts else row
    if anchor > 1 and lines[anchor - 2].rstrip().endswith("\\"):
        return None
    if lines[anchor - 1].lstrip().startswith(("def ", "async def ", "class ")):
        while anchor > 1 and lines[anchor - 2].lstrip().startswith("@"):  # above the decorators, not between (#47)
            anchor -= 1
    indent = lines[anchor - 1][: len(lines[anchor - 1]) - len(lines[anchor - 1].lstrip())]
    moved = lines[anchor - 1 : row]
    moved[-1] = lines[row - 1][:col].rstrip()
    return Edit(anchor, row, [indent + com.string.rstrip()] + moved, "trailing comment")


_SKIP = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENDMARKER)


def _split_on_row(lines: list[str], toks: list[tokenize.TokenInfo], row: int, docs: set, width: int) -> Edit | None:
    line = lines[row - 1]
    strings = [t for t in toks if t.type == tokenize.STRING and t.start[0] == t.end[0] == row and t.start not in docs]
    for tok in sorted(strings, key=lambda t: -len(t.string)):
        (_, sc), (_, ec) = tok.start, tok.end
        indent = len(line) - len(line.lstrip())
        after = min(len(line[ec:].rstrip()), 2)
        rest = width - indent - 4 - 2
        first = width - sc - after
        k = toks.index(tok)
        nxt = next((t for t in toks[k + 1 :] if t.type != tokenize.NL), None)
        if nxt is not None and nxt.type == tokenize.STRING and nxt.start[0] == row + 1 == nxt.end[0]:
            pair = carry_over(tok.string, nxt.string, first if first > 30 else rest)
            if pair:
                below = lines[row]
                return Edit(row, row + 1, [line[:sc] + pair[0] + line[ec:],
                                           below[: nxt.start[1]] + pair[1] + below[nxt.end[1] :]], "string")
        pieces = split_string(tok.string, first if first > 30 else rest, rest)
        if pieces:
            return Edit(row, row, [line[:sc] + " ".join(pieces) + line[ec:]], "string")
    return None


def lift_trailing_comments(src: str, width: int) -> tuple[str, int]:
    """Move each trailing comment of a line longer than `width` (with the trailing comments aligned under it on
    the next lines of the same statement, one comment continued) above its statement line (above a `def`'s
    decorators); pragmas stay."""
    lines = src.split("\n")
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    trailing = {t.start[0]: t for t in toks if t.type == tokenize.COMMENT and lines[t.start[0] - 1][: t.start[1]].strip()}
    ends = {t.start[0] for t in toks if t.type == tokenize.NEWLINE}  # rows that end a statement
    edits: list[Edit] = []
    row = 1
    while row <= len(lines):
        com = trailing.get(row)
        if com is None or len(lines[row - 1]) <= width or PRAGMA.search(com.string):
            row += 1
            continue
        group = [com]
        while (nxt := trailing.get(group[-1].start[0] + 1)) is not None and nxt.start[1] == com.start[1]:
            done = group[-1].start[0]  # a statement or an element (`x,`) ends there: the next one's own comment (#47)
            if PRAGMA.search(nxt.string) or done in ends or lines[done - 1][: trailing[done].start[1]].rstrip().endswith(","):
                break
            group.append(nxt)
        last = group[-1].start[0]
        edit = _move_comment(lines, toks, com)
        if edit is not None:
            body = [lines[r - 1][: trailing[r].start[1]].rstrip() for r in range(row, last + 1)]
            above = [edit.lines[0]] + [edit.lines[0][: edit.lines[0].index("#")] + g.string.rstrip() for g in group[1:]]
            edits.append(Edit(edit.first, last, above + edit.lines[1:-1] + body, "lifted comment"))
        row = last + 1
    edits = [e for k, e in enumerate(edits) if k == 0 or e.first > edits[k - 1].last]  # no overlaps
    done = 0
    for e in sorted(edits, key=lambda e: -e.first):
        trial = lines[: e.first - 1] + e.lines + lines[e.last :]
        try:
            same = normalized_ast("\n".join(trial)) == normalized_ast(src)
        except SyntaxError:
            same = False
        if same:
            lines, done = trial, done + 1
    return "\n".join(lines), done


def reflow_source(src: str, rows: set[int], width: int) -> tuple[str, list[str]]:
    """The module's source with the long `rows` rewrapped (one edit per region a round), and the kinds applied."""
    lines = src.split("\n")
    tree = ast.parse(src)
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    doc_pos = {(d.lineno, d.col_offset) for d in doc_nodes(tree)}
    exact = _exact_doc_positions(tree)
    edits: list[Edit] = []
    for row in sorted(rows):
        on_row = [t for t in toks if t.start[0] <= row <= t.end[0] and t.type not in _SKIP[:4]]
        comment = next((t for t in on_row if t.type == tokenize.COMMENT), None)
        doc = next((t for t in on_row if t.type == tokenize.STRING and t.start in doc_pos), None)
        edit = None
        if comment is not None and lines[row - 1][: comment.start[1]].strip():
            edit = _move_comment(lines, toks, comment)
        elif comment is not None and not PRAGMA.match(comment.string):
            edit = _comment_block(lines, row, comment.start[1], width)
        if edit is None and doc is not None and doc.start not in exact:
            edit = _docstring(lines, doc, rows, width)
        if edit is None:
            edit = _split_on_row(lines, toks, row, doc_pos, width)
        if edit is not None:
            edits.append(edit)
    kinds = []
    taken: list[tuple[int, int]] = []
    reference = normalized_ast(src)
    for e in sorted(edits, key=lambda e: -e.first):
        if any(not (e.last < a or e.first > b) for a, b in taken):
            continue
        trial = lines[: e.first - 1] + e.lines + lines[e.last :]
        try:  # each edit on its own keeps the module's meaning, or it is dropped
            if normalized_ast("\n".join(trial)) != reference:
                continue
        except SyntaxError:
            continue
        taken.append((e.first, e.last))
        lines = trial
        kinds.append(e.kind)
    return "\n".join(lines), kinds


# ---- checks -------------------------------------------------------------------------------------------------------


def normalized_ast(src: str) -> str:
    """ast.dump with docstrings' whitespace collapsed, except those the module reads through `__doc__`."""
    tree = ast.parse(src)
    exact = _exact_doc_positions(tree)
    for doc in doc_nodes(tree):
        if (doc.lineno, doc.col_offset) not in exact:
            doc.value = " ".join(doc.value.split())
    return ast.dump(tree)


def _ruff(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RUFF), *args], cwd=ROOT, capture_output=True, text=True, check=check)


def long_rows(package: str) -> dict[Path, set[int]]:
    out = _ruff("check", package, "--select", "E501", "--output-format", "json", "--no-cache").stdout
    rows: dict[Path, set[int]] = {}
    for d in json.loads(out or "[]"):
        rows.setdefault(Path(d["filename"]), set()).add(d["location"]["row"])
    return rows


def unused_noqa(package: str) -> list[dict]:
    out = _ruff("check", package, "--extend-select", "RUF100", "--output-format", "json", "--no-cache").stdout
    return [d for d in json.loads(out or "[]") if d["code"] == "RUF100"]


def _key(d: dict) -> tuple[str, str]:
    return d["filename"], d["message"]


def drop_moved_noqa(package: str, before: list[dict]) -> int:
    """Remove the `# noqa` comments the formatter carried off their statement's line (ruff's own RUF100 fix, applied
    only to the findings that were not there before the run)."""
    old = [_key(d) for d in before]
    new = []
    for d in unused_noqa(package):
        if _key(d) in old:
            old.remove(_key(d))
        elif d.get("fix"):
            new.append(d)
    for d in sorted(new, key=lambda d: (d["filename"], -d["location"]["row"], -d["location"]["column"])):
        path = Path(d["filename"])
        lines = path.read_text().split("\n")
        for e in sorted(d["fix"]["edits"], key=lambda e: (-e["location"]["row"], -e["location"]["column"])):
            (r0, c0), (r1, c1) = (e["location"]["row"], e["location"]["column"]), (e["end_location"]["row"],
                                                                                 e["end_location"]["column"])
            text = "\n".join(lines)
            offsets = [0]
            for line in lines:
                offsets.append(offsets[-1] + len(line) + 1)
            a, b = offsets[r0 - 1] + c0 - 1, offsets[r1 - 1] + c1 - 1
            lines = (text[:a] + (e["content"] or "") + text[b:]).split("\n")
        path.write_text("\n".join(lines))
    return len(new)


MYPY_ERROR = re.compile(r"^(?P<path>[^:\n]+\.py):(?P<row>\d+): error: .*\[(?P<code>[a-z0-9-]+)\]$", re.M)
ORPHAN_IGNORE = re.compile(r"^\s*# type: ignore(\[[^\]]*\])?\s*$")


def repair_type_ignores(package: str, original: dict[Path, str]) -> list[str]:
    """Put back the `# type: ignore[code]` comments the formatter moved off the line mypy reports (only codes the
    module's original already ignored); the orphaned comment lines go. Returns what mypy still reports."""
    run = subprocess.run([str(ROOT / ".venv" / "bin" / "mypy"), package], cwd=ROOT, capture_output=True, text=True)
    wanted: dict[Path, dict[int, list[str]]] = {}
    left = []
    for m in MYPY_ERROR.finditer(run.stdout):
        path, code = ROOT / m["path"], m["code"]
        if f"type: ignore[{code}]" in original.get(path, ""):
            wanted.setdefault(path, {}).setdefault(int(m["row"]), []).append(code)
        else:
            left.append(m.group(0))
    for path, rows in wanted.items():
        src = path.read_text()
        comments = {t.start[0]: t.start[1] for t in tokenize.generate_tokens(io.StringIO(src).readline)
                    if t.type == tokenize.COMMENT}
        lines = src.split("\n")
        for row, codes in rows.items():
            pragma = f"# type: ignore[{', '.join(sorted(set(codes)))}]"
            text = lines[row - 1]
            col = comments.get(row)
            lines[row - 1] = text.rstrip() + "  " + pragma if col is None else text[:col] + pragma + "  " + text[col:]
        if not any(ORPHAN_IGNORE.match(line) for line in original[path].split("\n")):
            lines = [line for line in lines if not ORPHAN_IGNORE.match(line)]
        path.write_text("\n".join(lines))
    return left


def over(files: list[Path], width: int) -> int:
    return sum(len(line) > width for f in files for line in f.read_text().splitlines())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--package", default="trtkv")
    ap.add_argument("--width", type=int, default=100)
    ap.add_argument("--no-mypy", action="store_true", help="skip repairing `# type: ignore` placement with mypy")
    ap.add_argument("--allow-dirty", action="store_true", help="run although the package has uncommitted changes")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    pkg = ROOT / args.package
    dirty = subprocess.run(["git", "status", "--porcelain", args.package], cwd=ROOT, capture_output=True, text=True)
    if dirty.stdout.strip() and not args.allow_dirty:
        print(f"{args.package}/ has uncommitted changes; commit them or pass --allow-dirty", file=sys.stderr)
        return 1
    keep = [pkg / k for k in KEEP]
    files = sorted(f for f in pkg.rglob("*.py") if not any(f.is_relative_to(k) for k in keep))
    original = {f: f.read_text() for f in files}
    targets = [str(f.relative_to(ROOT)) for f in files]
    before = over(files, args.width)
    noqa_unused_before = unused_noqa(args.package)
    kept = [k.relative_to(pkg).as_posix() + "/**" for k in keep]
    (pkg / "ruff.toml").write_text(
        f"# {args.package}/ alone: line length {args.width} (issue #43); the rest of the repository keeps\n"
        "# pyproject.toml's. The templates are shipped as data (copied into the repositories trtkv writes,\n"
        "# their bytes hashed into its stage keys): never formatted, no line length or import-order check.\n"
        f'extend = "../pyproject.toml"\nline-length = {args.width}\n'
        'src = [".."]  # first-party imports as from the repository root (isort), not from here\n'
        'cache-dir = "../.ruff_cache"\n\n'
        f"[format]\nexclude = {json.dumps(kept)}\n\n"
        "[lint.per-file-ignores]  # isort wraps imports at the line length too\n"
        + "".join(f'"{k}" = ["E501", "I001"]\n' for k in kept)
    )
    stats: dict[str, int] = {"lifted comment": 0}
    for path in files:  # long trailing comments go above their line before the formatter splits code for them
        src = path.read_text()
        new, n = lift_trailing_comments(src, args.width)
        if n:
            path.write_text(new)
            stats["lifted comment"] += n
    for _ in range(ROUNDS):
        _ruff("format", args.package, check=True)
        moved = 0
        for path, rows in long_rows(args.package).items():
            src = path.read_text()
            new, kinds = reflow_source(src, rows, args.width)
            if new != src:
                path.write_text(new)
                moved += 1
                for k in kinds:
                    stats[k] = stats.get(k, 0) + 1
        if not moved:
            break
    _ruff("format", args.package, check=True)
    left = long_rows(args.package)
    leftover = [f"{p.relative_to(ROOT)}:{r}: {p.read_text().splitlines()[r - 1].strip()[:110]}"
                for p, rows in sorted(left.items()) for r in sorted(rows)]
    noqa_before = sum(s.count("# noqa") for s in original.values())
    for _ in range(3):
        _ruff("check", *targets, "--add-noqa")
        if _ruff("format", args.package, "--check").returncode == 0:
            break
        _ruff("format", args.package, check=True)
    moved_noqa = drop_moved_noqa(args.package, noqa_unused_before)
    mypy_left = [] if args.no_mypy else repair_type_ignores(args.package, original)
    for _ in range(3):
        _ruff("check", *targets, "--add-noqa")
        if _ruff("format", args.package, "--check").returncode == 0:
            break
        _ruff("format", args.package, check=True)
    noqa_after = sum(f.read_text().count("# noqa") for f in files)
    bad = [str(f.relative_to(ROOT)) for f in files
           if f.read_text() != original[f] and normalized_ast(f.read_text()) != normalized_ast(original[f])]
    misplaced_comments = [line for f in files if f.read_text() != original[f] and str(f.relative_to(ROOT)) not in bad
                          for line in report(str(f.relative_to(ROOT)), misplaced(original[f], f.read_text()))]
    lint = _ruff("check", args.package, "--no-cache")
    fmt = _ruff("format", args.package, "--check")
    changed = sum(f.read_text() != original[f] for f in files)
    print(f"{args.package}/: {len(files)} modules, {changed} changed; lines > {args.width}: {before} -> "
          f"{over(files, args.width)}; edits: {stats}; noqa comments {noqa_before} -> {noqa_after} "
          f"({len(leftover)} E501 rows marked, {moved_noqa} noqa the formatter moved dropped); "
          f"{time.monotonic() - t0:.1f} s")
    for line in leftover:
        print("  noqa E501:", line)
    if bad:
        print("AST differs from the original:", *bad, sep="\n  ", file=sys.stderr)
    if misplaced_comments:
        print("comments that no longer annotate their statement (scripts/comment_anchors.py):", *misplaced_comments,
              sep="\n  ", file=sys.stderr)
    if lint.returncode or fmt.returncode:
        print(lint.stdout[-3000:], fmt.stdout[-3000:], file=sys.stderr)
    if mypy_left:
        print("mypy errors the run did not cause or could not repair:", *mypy_left, sep="\n  ", file=sys.stderr)
    return 1 if bad or misplaced_comments or lint.returncode or fmt.returncode or mypy_left else 0


if __name__ == "__main__":
    sys.exit(main())
