"""Regenerate the generated parts of docs/: the recipe reference (from the pydantic schema) in docs/recipes.md and the
version matrix (from trtkv/data/trtllm_versions.json) in docs/where-it-runs.md, the KV formats x engines table (from
trtkv/data/kv_formats.json) and its attention modes in docs/kv-formats.md, the GPU table (trtkv.platform.hardware) in
docs/plan.md, what each verb writes (trtkv.cli.registry) in docs/where-it-runs.md, the checkov skips a deployment may
carry (trtkv.deploy.pods) in docs/deploy.md, the `trtkv plan` outputs docs/plan.md quotes (scripts/plan_examples.py);
`--check` only reports stale ones."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import plan_examples  # noqa: E402  (scripts/: the plan outputs docs/plan.md quotes)

from trtkv.cli.registry import outputs_markdown  # noqa: E402
from trtkv.deploy.pods import skips_markdown  # noqa: E402
from trtkv.kvcache.attention_modes import table_markdown as attention_markdown  # noqa: E402
from trtkv.kvcache.engines import table_markdown as kv_formats_markdown  # noqa: E402
from trtkv.platform.gpu_capabilities import table_markdown as gpu_table_markdown  # noqa: E402
from trtkv.platform.versions import table_markdown  # noqa: E402
from trtkv.recipe.reference import limits_markdown, reference_markdown  # noqa: E402

# marker name -> (the docs page that holds it, what fills it)
SECTIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "recipe-reference": ("docs/recipes.md", reference_markdown),
    "limits": ("docs/recipes.md", limits_markdown),
    "version-matrix": ("docs/where-it-runs.md", table_markdown),
    "kv-formats": ("docs/kv-formats.md", kv_formats_markdown),
    "attention-modes": ("docs/kv-formats.md", attention_markdown),
    "gpu-table": ("docs/plan.md", gpu_table_markdown),
    "verb-outputs": ("docs/where-it-runs.md", outputs_markdown),
    "checkov-skips": ("docs/deploy.md", skips_markdown),
    "plan-llama70b": ("docs/plan.md", plan_examples.llama70b),
    "plan-gemma3-27b": ("docs/plan.md", plan_examples.gemma3_27b),
    "plan-qwen3-next": ("docs/plan.md", plan_examples.qwen3_next),
}


def markers(name: str) -> tuple[str, str]:
    """The start and end comments around a generated section."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def section(text: str, name: str) -> str:
    """The generated body between a section's markers (ValueError when a marker is missing)."""
    start, end = markers(name)
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"expected one {start} and one {end}")
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def fill(text: str, name: str, body: str) -> str:
    """`text` with the section `name` replaced by `body`."""
    section(text, name)
    start, end = markers(name)
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body.strip()}\n{end}{tail}"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, (page, make) in SECTIONS.items():
        path = ROOT / page
        try:
            text = path.read_text(encoding="utf-8")
            current = section(text, name) == make().strip()
        except (OSError, ValueError) as exc:
            print(f"error: {page}: the {name} section: {exc}. Next: restore the markers in {page}.", file=sys.stderr)
            return 2
        if current:
            continue
        stale.append(page)
        if not check:
            path.write_text(fill(text, name, make()), encoding="utf-8")
            print(f"updated {page} ({name})")
    if check and stale:
        print(f"stale: {', '.join(stale)}. Next: python scripts/update_docs.py", file=sys.stderr)
        return 1
    if not stale:
        print("docs: generated sections are current")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
