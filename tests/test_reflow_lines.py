"""scripts/reflow_lines.py (issue #43 step 3): string splits keep the value, comment/docstring reflow keeps the meaning."""

from __future__ import annotations

import ast
import random

import pytest

from scripts.comment_anchors import misplaced, report
from scripts.reflow_lines import carry_over, lift_trailing_comments, normalized_ast, reflow_source, split_string


def value(source: str) -> object:
    """The value of a literal or f-string source, evaluated with x=7, y='a b'."""
    return eval(compile(ast.parse(f"(\n{source}\n)", mode="eval"), "<t>", "eval"), {}, {"x": 7, "y": "a b"})


CASES = [
    '"plain words that go on and on past the limit of the line"',
    "'single quoted words with \\'escapes\\' and \\t tabs and \\n newlines in them'",
    'f"the {x!r} value {{literal braces}} is {y:>10} and {x + 1} more {y!s:^{x}} text here"',
    'f"{x} {{ only braces }} then more plain words {{x}} at the end of it all"',
    'rb"raw bytes \\d+ with a backslash \\ space and more words after it here"',
    'b"bytes \\x00 with \\xff escapes and words enough to need a split somewhere"',
    '"\\N{LATIN SMALL LETTER A} named escapes \\N{EM DASH} keep whole across a split"',
    "f\"{'nested quotes with spaces' if x else 'other words'} then plain text words\"",
    'Rf"raw f-string \\w {x} with {y} and a trailing backslash pair \\\\ end"',
]


@pytest.mark.parametrize("text", CASES)
@pytest.mark.parametrize("width", [8, 12, 20, 33])
def test_split_string_keeps_the_value(text: str, width: int) -> None:
    pieces = split_string(text, width, width)
    assert pieces is not None and len(pieces) > 1
    assert value(" ".join(pieces)) == value(text)
    for piece in pieces:  # a piece without a field is a plain literal (ruff F541)
        ast.parse(piece)
        if piece.lstrip("rRbB").startswith(("f", "F")):
            assert any(isinstance(n, ast.FormattedValue) for n in ast.walk(ast.parse(piece)))


def test_split_string_random_words() -> None:
    rng = random.Random(43)
    words = ["a", "{x}", "{{", "}}", "\\n", "\\\\", "word", "{y!r}", "  ", "\\'", "é", "\\N{BULLET}", "{x:>{x}}"]
    for _ in range(300):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(2, 30)))
        for prefix in ("", "f", "r", "rf", "b"):
            if "b" in prefix and ("é" in body or "\\N" in body):
                continue
            text = f"{prefix}'{body}'"
            try:
                expected = value(text)
            except (SyntaxError, ValueError, NameError):
                continue
            pieces = split_string(text, rng.randint(6, 40), rng.randint(6, 40))
            if pieces is not None:
                assert value(" ".join(pieces)) == expected, (text, pieces)


def test_unbreakable_strings_are_left_alone() -> None:
    assert split_string('"https://example.invalid/a/very/long/path/without/any/spaces"', 20, 20) is None
    assert split_string('f"{x if x else y}"', 5, 5) is None
    assert split_string('"""triple quoted text with spaces"""', 10, 10) is None


def test_carry_over_moves_words_into_the_next_piece() -> None:
    pair = carry_over('f"a b {x} c d {{e}} f g "', '"h {i}"', 14)
    assert pair is not None and value(" ".join(pair)) == value('f"a b {x} c d {{e}} f g " "h {i}"')
    assert pair[0] == 'f"a b {x} c "'


def test_reflow_source_keeps_the_ast() -> None:
    src = (
        'def f(x, y):\n'
        '    """A docstring whose first line is much longer than the limit of forty characters.\n'
        '\n'
        '        code block line that is much longer than forty characters stays\n'
        '    """\n'
        '    # a comment block whose line is longer than forty characters and\n'
        '    # goes on here\n'
        '    z = x  # a trailing comment that is far too long for the line\n'
        '    return f"value {x} and {y} with words enough to split it" + z\n'
    )
    out = src
    for _ in range(6):
        rows = {i + 1 for i, line in enumerate(out.split("\n")) if len(line) > 40}
        out, _kinds = reflow_source(out, rows, 40)
    assert normalized_ast(out) == normalized_ast(src)
    assert "        code block line that is much longer than forty characters stays" in out
    assert out.index("# a trailing comment") < out.index("    z = x\n")  # moved above its line
    assert 'f"value {x} and {y} with " "words enough to split it"' in out  # ruff format lays the pieces out
    assert max(len(line) for line in out.split("\n") if "code block" not in line and "return" not in line) <= 40


# ---- comments keep their statement (issue #47) --------------------------------------------------------------------

BEFORE = '''\
CORE_SHARE = 0.3
SATURATED = 0.9  # a process at this share of a core or more has probably limited the level
LAG_SHARE = 0.1  # the client's lag p99 over this share of the ITL p50 is said in results


class Server:
    @property
    def health_path(self) -> str: ...  # its own cheap health endpoint: the pods' liveness probe


class KVFormat:
    NVFP4 = "nvfp4"  # E2M1 values, E4M3 scale per 16 elements, K and V apart
    KIVI4 = "kivi4"  # K per-channel over token groups, V per-token
'''

# what the width-100 reformat (f2b4349) did: the two trailing comments stacked over SATURATED, the property's
# comment between the decorator and its def, KIVI4's comment rewrapped into the end of NVFP4's
MISPLACED = '''\
CORE_SHARE = 0.3
# a process at this share of a core or more has probably limited the level
# the client's lag p99 over this share of the ITL p50 is said in results
SATURATED = 0.9
LAG_SHARE = 0.1


class Server:
    @property
    # its own cheap health endpoint: the pods' liveness probe
    def health_path(self) -> str: ...


class KVFormat:
    # E2M1 values, E4M3 scale per 16 elements, K and V apart K per-channel over
    # token groups, V per-token
    NVFP4 = "nvfp4"
    KIVI4 = "kivi4"
'''

# each comment above (or beside) its own statement, rewrapped: the same anchors
KEPT = '''\
CORE_SHARE = 0.3
# a process at this share of a core or more has probably
# limited the level
SATURATED = 0.9
# the client's lag p99 over this share of the ITL p50 is said in results
LAG_SHARE = 0.1


class Server:
    # its own cheap health endpoint: the pods' liveness probe
    @property
    def health_path(self) -> str: ...


class KVFormat:
    # E2M1 values, E4M3 scale per 16 elements, K and V apart
    NVFP4 = "nvfp4"
    KIVI4 = "kivi4"  # K per-channel over token groups, V per-token
'''


def test_comment_check_finds_each_misplaced_comment() -> None:
    assert normalized_ast(MISPLACED) == normalized_ast(BEFORE)  # the AST check the reformat relied on passes
    found = {m.row: m for m in misplaced(BEFORE, MISPLACED)}
    assert sorted(found) == [3, 8, 12, 13]
    assert found[3].old == "Assign LAG_SHARE (line 3)" and "Assign SATURATED (line 4)" in found[3].new
    assert found[8].old == "FunctionDef health_path (line 8)" and "after its decorator" in found[8].new
    assert "merged" in found[12].new and "merged" in found[13].new  # NVFP4's own comment no longer ends a line
    lines = report("levels.py", misplaced(BEFORE, MISPLACED))
    assert lines[0].startswith("levels.py:3: comment \"the client's lag p99") and "now above or beside" in lines[0]


def test_comment_check_passes_comments_kept_on_their_statement() -> None:
    assert misplaced(BEFORE, KEPT) == []
    assert misplaced(BEFORE, BEFORE) == []


DICT = '''\
STATS = {
    "ruler": ("accuracy", "correct", "total"),  # string_match_all; `correct` counts items
    "fidelity": ("worse_lengths", "accuracy"),  # lengths judged worse than the format predicts
}
'''


def test_lifting_keeps_each_comment_on_its_statement() -> None:
    """The lift puts each statement's (and each dict entry's) comment above it, and a def's above its decorators."""
    src = DICT + BEFORE
    out, n = lift_trailing_comments(src, 60)
    assert n == 7 and normalized_ast(out) == normalized_ast(src)
    assert misplaced(src, out) == [], out
    assert "    # its own cheap health endpoint: the pods' liveness probe\n    @property\n" in out
