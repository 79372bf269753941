"""Each comment keeps the statement it annotates (issue #47): compare a module's comments before and after a
mechanical rewrite (scripts/reflow_lines.py, `make reflow`), which an AST comparison cannot see.

    .venv/bin/python scripts/comment_anchors.py OLD_REV [NEW_REV] [--package trtkv] [--list]

(NEW_REV left out: the working tree.) A comment annotates one node of the module's AST, its anchor:
- a trailing comment (code before it on its line): the outermost node that starts on that line, else the outermost
  that ends on it (a statement's closing bracket); a comment line under it, at its column, continues it;
- a block of comment lines: the next node (a statement, or an argument, element or key inside brackets);
- a decorator stands for its `def`/`class`; a comment between a decorator and its `def` has an anchor of its own,
  so that it differs from one above the decorator or on the `def` line; `else:` and `finally:` are anchors too.
A node is named by its path from the module: each step the field, a label (the name a `def`, `class` or assignment
binds, else the node's source) and the count of earlier siblings with the same label, so that the names survive
code reformatted around them and statements added elsewhere.

Each comment of the old source (a trailing comment with its continuation lines, or a block) is looked up, its text
compared with whitespace collapsed (rewrapped comments compare equal), among the comments of the new source grouped
by anchor: it must stand at the same anchor, starting and ending on line boundaries (a comment rewrapped into the
end of another was merged with it). Pragmas (`# noqa`, `# type: ignore[...]`) are left out: the rewrite moves
them on purpose. Exit 1 with one line per misplaced comment: old file:line, its old and its new statement.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRAGMAS = re.compile(
    r"#\s*(?:noqa(?::\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(?:\[[^\]]*\])?|pragma:[^#]*|fmt:\s*\w+)"
)
RULER = re.compile(r"([-=*#~_])\1{3,}")
Key = tuple[str, ...]


def words(comment: str) -> str:
    """A comment's words: pragmas dropped, the leading '#' gone, whitespace collapsed, rulers cut to 3 characters."""
    text = PRAGMAS.sub(" ", comment).strip()
    text = text[1:] if text.startswith("#") else text
    return " ".join(RULER.sub(r"\1\1\1", text).split())


@dataclass
class Comment:
    row: int
    col: int
    text: str  # words(...)
    trailing: bool
    anchor: Key = ()
    node_row: int = 0  # the anchor's first line
    label: str = ""  # the anchor, readable


class Anchors:
    """The nodes of one module and their names (see the module docstring)."""

    def __init__(self, src: str) -> None:
        self.tree = ast.parse(src)
        self.parent: dict[int, tuple[ast.AST, str, int]] = {}  # id(child) -> (parent, field, index)
        self.nodes: list[ast.AST] = []
        self.owner: dict[int, ast.AST] = {}  # id(decorator) -> its def/class
        self._labels: dict[int, str] = {}
        self._keys: dict[int, Key] = {}
        for node in ast.walk(self.tree):
            for field, value in ast.iter_fields(node):
                children = value if isinstance(value, list) else [value]
                for i, child in enumerate(children):
                    if isinstance(child, ast.AST):
                        self.parent[id(child)] = (node, field, i)
            if _anchorable(node, self.parent.get(id(node))):
                self.nodes.append(node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for dec in node.decorator_list:
                    self.owner[id(dec)] = node
        self.nodes.sort(key=lambda n: (n.lineno, n.col_offset, -n.end_lineno, -n.end_col_offset))  # type: ignore[attr-defined]

    def label(self, node: ast.AST) -> str:
        got = self._labels.get(id(node))
        if got is None:
            got = self._labels[id(node)] = _label(node, self.parent.get(id(node)))
        return got

    def key(self, node: ast.AST) -> Key:
        got = self._keys.get(id(node))
        if got is not None:
            return got
        up = self.parent.get(id(node))
        if up is None:
            return ()
        parent, field, index = up
        label = self.label(node)
        value = getattr(parent, field)
        siblings = value[:index] if isinstance(value, list) else []
        count = sum(self.label(s) == label for s in siblings if isinstance(s, ast.AST))
        got = self._keys[id(node)] = (*self.key(parent), f"{field}/{label}#{count}")
        return got

    def first_after(self, row: int) -> ast.AST | None:
        """The outermost node starting first after `row`."""
        for node in self.nodes:
            if node.lineno > row:  # type: ignore[attr-defined]
                return node
        return None

    def on_row(self, row: int, line: bytes) -> ast.AST | None:
        """The node a trailing comment on `row` annotates, the outermost of the first kind there is: a compound
        statement whose header ends on the row; a node the row begins with and ends with (only closing brackets,
        commas and other elements after it); a node that ends on the row; one that starts on it; else the
        innermost around it. (`line`: the row's code, as bytes: the AST's columns count UTF-8 bytes.)"""
        indent = len(line) - len(line.lstrip())
        compound = [n for n in self.nodes if isinstance(getattr(n, "body", None), list) and _header_end(n) == row]
        on = [n for n in self.nodes if n.lineno == n.end_lineno == row]  # type: ignore[attr-defined]
        begins = [n for n in on if n.col_offset == indent and _closes(line, n, on)]  # type: ignore[attr-defined]
        ends = [n for n in self.nodes if n.end_lineno == row]  # type: ignore[attr-defined]
        starts = [n for n in self.nodes if n.lineno == row]  # type: ignore[attr-defined]
        for found in (compound, begins, ends, starts):
            if found:
                return found[0]
        inside = [n for n in self.nodes if n.lineno <= row <= n.end_lineno]  # type: ignore[attr-defined]
        return inside[-1] if inside else None

    def last_before(self, row: int) -> ast.AST | None:
        """The innermost statement ending last before `row`."""
        ended = [n for n in self.nodes if isinstance(n, ast.stmt) and n.end_lineno < row]  # type: ignore[attr-defined]
        return max(ended, key=lambda n: (n.end_lineno, n.lineno, n.col_offset), default=None)  # type: ignore[attr-defined]

    def branch(self, row: int, word: str) -> ast.AST | None:
        """The innermost compound statement whose `else:`/`finally:` line is `row`."""
        field = "finalbody" if word == "finally" else "orelse"
        best = None
        for node in self.nodes:
            body = getattr(node, field, None)
            if body and node.lineno < row <= node.end_lineno and body[0].lineno > row:  # type: ignore[attr-defined]
                best = node
        return best


ELEMENTS = {(ast.List, "elts"), (ast.Tuple, "elts"), (ast.Set, "elts"), (ast.Dict, "keys"), (ast.Dict, "values"),
            (ast.Call, "args"), (ast.BoolOp, "values"), (ast.BinOp, "left"), (ast.BinOp, "right"),
            (ast.FunctionDef, "decorator_list"), (ast.AsyncFunctionDef, "decorator_list"),
            (ast.ClassDef, "decorator_list"), (ast.ClassDef, "bases")}


BODIES = ("body", "orelse", "finalbody", "handlers", "cases", "decorator_list")


def _header_end(node: ast.AST) -> int:
    """The last line of a compound statement's header (`def ...:`, `if ...:`); other nodes' last line."""
    if not isinstance(getattr(node, "body", None), list):
        return node.end_lineno  # type: ignore[attr-defined]
    rows = [node.lineno]  # type: ignore[attr-defined]
    for field, value in ast.iter_fields(node):
        if field not in BODIES:
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST) and hasattr(child, "end_lineno"):
                    rows.append(child.end_lineno)
    return max(rows)


def _closes(line: bytes, node: ast.AST, on: list[ast.AST]) -> bool:
    """Only closing brackets, commas and other nodes of `on` (one-row nodes) follow `node` on `line`."""
    rest = bytearray(line[node.end_col_offset :])  # type: ignore[attr-defined]
    for other in on:
        a, b = other.col_offset - node.end_col_offset, other.end_col_offset - node.end_col_offset  # type: ignore[attr-defined]
        if a >= 0:
            rest[a:b] = b" " * (b - a)
    return not bytes(rest).strip(b" \t)]},:")


def _anchorable(node: ast.AST, up: tuple[ast.AST, str, int] | None) -> bool:
    """A statement, or one element of what brackets hold (an argument, a keyword, a key, a value, an item)."""
    if not hasattr(node, "end_lineno"):
        return False
    if isinstance(node, (ast.stmt, ast.ExceptHandler, ast.match_case, ast.keyword, ast.arg, ast.alias)):
        return True
    return up is not None and (type(up[0]), up[1]) in ELEMENTS


def _label(node: ast.AST, up: tuple[ast.AST, str, int] | None) -> str:
    kind = type(node).__name__
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return f"{kind} {node.name}"
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        if up is not None and up[2] == 0 and up[1] == "body":
            return "docstring"  # rewrapped by the reflow: its words, not its layout, are kept
    head = {ast.If: "test", ast.While: "test", ast.For: "iter", ast.AsyncFor: "iter", ast.Match: "subject"}
    for cls, field in head.items():
        if isinstance(node, cls):
            return f"{kind} {ast.unparse(getattr(node, field))}"
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return f"{kind} {', '.join(ast.unparse(i) for i in node.items)}"
    if isinstance(node, (ast.Try, ast.TryStar)):
        return kind
    if isinstance(node, ast.ExceptHandler):
        return f"except {ast.unparse(node.type) if node.type else ''}"
    if isinstance(node, ast.match_case):
        return f"case {ast.unparse(node.pattern)}"
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return f"{kind} {', '.join(ast.unparse(t) for t in targets)}"
    try:
        return f"{kind} {ast.unparse(node)}"
    except (ValueError, AttributeError, TypeError):
        return kind


def _short(label: str) -> str:
    one = " ".join(label.split())
    return one if len(one) <= 60 else one[:57] + "..."


def comments(src: str) -> list[Comment]:
    """Every comment of `src` with its anchor; a comment line under a trailing comment, at its column, continues it
    (same anchor)."""
    tree = Anchors(src)
    lines = src.split("\n")
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    code_rows = [i + 1 for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    out: list[Comment] = []
    for tok in toks:
        if tok.type != tokenize.COMMENT:
            continue
        text = words(tok.string)
        if not text:
            continue
        row, col = tok.start
        c = Comment(row, col, text, trailing=bool(lines[row - 1][:col].strip()))
        prev = out[-1] if out else None
        node: ast.AST | None = None
        suffix = ""
        first = lines[row - 1].split()[0] if c.trailing else ""
        if c.trailing and first.rstrip(":") in ("else", "finally"):
            node, suffix = tree.branch(row, first.rstrip(":")), first.rstrip(":")
        elif c.trailing:
            node = tree.on_row(row, lines[row - 1][:col].encode())
        elif prev is not None and prev.row == row - 1 and prev.col == col and (prev.trailing or prev.label.startswith("+")):
            c.anchor, c.node_row, c.label = prev.anchor, prev.node_row, "+" + prev.label.lstrip("+")
            out.append(c)
            continue
        else:
            nxt = next((r for r in code_rows if r > row), None)
            after = lines[nxt - 1] if nxt else ""
            head = after.split()[0].rstrip(":") if nxt else ""
            if after.strip()[:1] not in ")]}" and len(after) - len(after.lstrip()) < col:
                node, suffix = tree.last_before(row), "end of its block"  # reads as the end of the block above
            elif head in ("else", "finally"):
                node, suffix = tree.branch(nxt, head), head  # type: ignore[arg-type]
            else:
                node = tree.first_after(row)
        if node is not None and id(node) in tree.owner:
            node = tree.owner[id(node)]
        elif (not c.trailing and not suffix and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              and node.decorator_list and node.decorator_list[0].lineno <= row):
            suffix = "after its decorator"
        if node is None:
            c.anchor, c.label = ("end of module",), "the end of the module"
        else:
            c.anchor = (*tree.key(node), suffix) if suffix else tree.key(node)
            c.node_row = node.lineno  # type: ignore[attr-defined]
            c.label = _short(tree.label(node)) + (f" ({suffix})" if suffix else "")
        out.append(c)
    return out


def units(found: list[Comment]) -> list[list[Comment]]:
    """The comments as written: a trailing comment with its continuation lines, or a block of adjacent lines."""
    out: list[list[Comment]] = []
    for c in found:
        last = out[-1][-1] if out else None
        if last is not None and (c.label.startswith("+") or (not c.trailing and not last.trailing
                                                             and last.row == c.row - 1 and last.anchor == c.anchor)):
            out[-1].append(c)
        else:
            out.append([c])
    return out


@dataclass
class Misplaced:
    row: int
    text: str
    old: str  # the statement it annotated
    new: str  # where it is now


def misplaced(old_src: str, new_src: str) -> list[Misplaced]:
    """The comments of `old_src` that do not annotate the same node in `new_src` (or were merged into another)."""
    new_units = units(comments(new_src))
    groups: dict[Key, list[tuple[str, int, int]]] = {}  # anchor -> (line text, row, anchor row) in order
    for unit in new_units:
        for c in unit:
            groups.setdefault(c.anchor, []).append((c.text, c.row, c.node_row))
    joined: dict[Key, tuple[str, set[int], set[int]]] = {}
    for key, rows in groups.items():
        text, starts, ends = "", set(), set()
        for line, _, _ in rows:
            text += (" " if text else "")
            starts.add(len(text))
            text += line
            ends.add(len(text))
        joined[key] = (text, starts, ends)
    labels = {c.anchor: (c.label.lstrip("+"), c.node_row) for u in new_units for c in u}
    out = []
    for unit in units(comments(old_src)):
        text = " ".join(c.text for c in unit)
        head = unit[0]
        here = joined.get(head.anchor)
        if here is not None and _at_boundaries(text, *here):
            continue
        where = ""
        for key, (body, starts, ends) in joined.items():
            if _at_boundaries(text, body, starts, ends):
                label, row = labels[key]
                where = f"above or beside {label} (line {row})"
                break
        if not where:
            hits = [(key, body.find(text)) for key, (body, _, _) in joined.items() if text in body]
            if hits:
                key, _ = hits[0]
                label, row = labels[key]
                where = f"merged into another comment of {label} (line {row})"
            else:
                where = "not found whole (split over several statements, or removed)"
        out.append(Misplaced(head.row, text, f"{head.label.lstrip('+')} (line {head.node_row})", where))
    return out


def _at_boundaries(text: str, body: str, starts: set[int], ends: set[int]) -> bool:
    at = body.find(text)
    while at >= 0:
        if at in starts and at + len(text) in ends:
            return True
        at = body.find(text, at + 1)
    return False


def report(path: str, found: list[Misplaced]) -> list[str]:
    return [f"{path}:{m.row}: comment {m.text[:70]!r} annotated {m.old}; now {m.new}" for m in found]


def _show(rev: str, path: str) -> str | None:
    run = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    return run.stdout if run.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", help="the revision before the rewrite (e.g. f2b4349^)")
    ap.add_argument("new", nargs="?", help="the revision after it (default: the working tree)")
    ap.add_argument("--package", default="trtkv")
    ap.add_argument("--list", action="store_true", help="print every misplaced comment, not only the counts")
    args = ap.parse_args(argv)
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", args.old, args.package], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    total, per_module, gone = 0, {}, []
    for path in sorted(p for p in listed if p.endswith(".py")):
        old = _show(args.old, path)
        new = _show(args.new, path) if args.new else ((ROOT / path).read_text() if (ROOT / path).exists() else None)
        if old is None or new is None:
            gone.append(path)
            continue
        if old == new:
            continue
        try:
            found = misplaced(old, new)
        except SyntaxError as exc:
            print(f"{path}: does not parse: {exc}", file=sys.stderr)
            return 2
        if found:
            per_module[path] = len(found)
            total += len(found)
            if args.list:
                print(*report(path, found), sep="\n")
    for path, n in per_module.items():
        print(f"{n:4d}  {path}")
    print(f"{total} misplaced comments in {len(per_module)} modules ({args.old} -> {args.new or 'working tree'}); "
          f"{len(gone)} modules not in both")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
