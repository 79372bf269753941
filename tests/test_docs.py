"""The README is a short front door and docs/ holds the guide: generated sections current, no dead links, strict build."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trtkv.platform.versions import table_markdown
from trtkv.recipe.reference import reference_markdown

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def generated(page: str, name: str) -> str:
    """The body between a docs page's `<!-- name:start -->` and `<!-- name:end -->` markers."""
    text = (ROOT / page).read_text(encoding="utf-8")
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    assert text.count(start) == 1 and text.count(end) == 1, f"{page}: expected one {start} and one {end}"
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def relative_links(path: Path) -> list[str]:
    """Link targets in a Markdown file outside code, without web links and same-page anchors."""
    text = CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_version_matrix_is_current() -> None:
    assert generated("docs/where-it-runs.md", "version-matrix") == table_markdown().strip(), (
        "docs/where-it-runs.md version matrix is stale: run `python scripts/update_docs.py`")


def test_kv_formats_table_is_current() -> None:
    from trtkv.kvcache.engines import table_markdown as kv_formats_markdown

    body = generated("docs/kv-formats.md", "kv-formats")
    assert body == kv_formats_markdown().strip(), (
        "docs/kv-formats.md KV formats table is stale: run `python scripts/update_docs.py`")
    row = next(line for line in body.splitlines() if line.startswith("| **int8_per_token_head**"))
    assert "`--kv-cache-dtype int8_per_token_head`" in row and "TritonAttentionBackend" in row


def test_gpu_table_is_current() -> None:
    from trtkv.platform.gpu_capabilities import table_markdown as gpu_table_markdown

    assert generated("docs/plan.md", "gpu-table") == gpu_table_markdown().strip(), (
        "docs/plan.md GPU table is stale: run `python scripts/update_docs.py`")


def test_verb_outputs_are_current() -> None:
    from trtkv.cli.registry import outputs_markdown

    assert generated("docs/where-it-runs.md", "verb-outputs") == outputs_markdown().strip(), (
        "docs/where-it-runs.md verb outputs are stale: run `python scripts/update_docs.py`")


def test_recipe_reference_is_current() -> None:
    assert generated("docs/recipes.md", "recipe-reference") == reference_markdown().strip(), (
        "docs/recipes.md recipe reference is stale: run `python scripts/update_docs.py`")
    from trtkv.recipe.reference import limits_markdown

    assert generated("docs/recipes.md", "limits") == limits_markdown().strip(), (
        "docs/recipes.md ranges table is stale: run `python scripts/update_docs.py`")


@pytest.mark.parametrize("path", [README, ROOT / "CHANGELOG.md", *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_a_file(path: Path) -> None:
    dead = [t for t in relative_links(path) if not (path.parent / t.split("#", 1)[0]).resolve().exists()]
    assert not dead, f"{path.relative_to(ROOT)}: links to missing files: {dead}"
    if path.parent == DOCS:  # mkdocs resolves links only inside docs/
        outside = [t for t in relative_links(path) if DOCS not in (DOCS / t.split("#", 1)[0]).resolve().parents]
        assert not outside, f"{path.relative_to(ROOT)}: links outside docs/ (name the file in `code` instead): {outside}"


def test_readme_is_short_and_links_every_docs_page() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines (at most 150): move the detail into docs/"
    long = [i for i, line in enumerate(lines, 1) if len(line) > 120]
    assert not long, f"README.md lines over 120 characters: {long}"
    linked = {t.split("#", 1)[0] for t in relative_links(README)}
    missing = [p.relative_to(ROOT).as_posix() for p in PAGES
               if p.relative_to(ROOT).as_posix() not in linked and p.name != "index.md"]
    assert not missing, f"README.md does not link to {missing}"
    for must in ("make demo", "make test", "make check", "make engine RECIPE=llama70b_fp8kv", "make deploy",
                 "Security: [docs/security.md](docs/security.md)", "[Changelog](CHANGELOG.md)"):
        assert must in text, f"README.md lost {must!r}"


def test_readme_summary_is_the_quickstart_one() -> None:
    """The one real summary in the README is the `make demo` output the quickstart shows, not a retyped copy."""
    blocks = [b for b in FENCE.findall(README.read_text(encoding="utf-8")) if "Summary for " in b]
    assert len(blocks) == 1, "README.md should show one `make demo` summary"
    assert blocks[0] in (DOCS / "quickstart.md").read_text(encoding="utf-8")


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert [p.name for p in PAGES if f": {p.name}" not in nav] == []


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_docs_build_strictly(tmp_path: Path) -> None:
    result = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_dead_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "plan.md").open("a", encoding="utf-8") as f:
        f.write("\n[gone](no-such-page.md) and [no anchor](probe.md#no-such-heading)\n")
    result = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr and "no-such-heading" in result.stderr


def test_update_docs_refills_a_stale_section() -> None:
    spec = importlib.util.spec_from_file_location("update_docs", ROOT / "scripts" / "update_docs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    stale = "# page\n\n<!-- version-matrix:start -->\n| old |\n<!-- version-matrix:end -->\n\nafter\n"
    fresh = mod.fill(stale, "version-matrix", table_markdown())
    assert mod.section(fresh, "version-matrix") == table_markdown().strip()
    assert fresh.startswith("# page\n") and fresh.endswith("\n\nafter\n")
    with pytest.raises(ValueError, match="recipe-reference:start"):
        mod.section(stale, "recipe-reference")


def test_every_generated_section_is_current() -> None:
    """Each section scripts/update_docs.py fills (the tables above and the `trtkv plan` outputs docs/plan.md quotes,
    scripts/plan_examples.py) is what its source makes now."""
    spec = importlib.util.spec_from_file_location("update_docs", ROOT / "scripts" / "update_docs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    stale = [f"{page} ({name})" for name, (page, make) in mod.SECTIONS.items()
             if generated(page, name) != make().strip()]
    assert not stale, f"stale generated sections: {', '.join(stale)}. Next: python scripts/update_docs.py"
