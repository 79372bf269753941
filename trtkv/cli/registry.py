"""Every `trtkv` verb in one list (name, module, one-line help), as vLLM registers its CLI
subcommands in one place.

Voice: each line is a lower-case imperative with no full stop ("build the engine ..."), the voice of
argparse's own "show this help message and exit", so the verb list reads as one. Backend and layout
names are never typed here: `{backends}`, `{layouts}` and `{triton_layouts}` are filled from
trtkv.backends (a test fails on a typed name).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Verb:
    name: str  # what the user types: `trtkv <name>`
    # one line for `trtkv --help` and the verb's own description; {placeholders} as in
    # engine_names()
    help: str
    writes: str = ""  # where it writes, from the folders of trtkv.core.paths.FOLDERS ("" : nothing)

    @property
    def module(self) -> str:
        """The module with add_parser(sub) and run(args): the verb's own name (STYLE.md)."""
        return f"trtkv.cli.{self.name}"

    def render(self) -> str:
        return self.help.format_map(engine_names())

    def where(self) -> str:
        """`writes: ...` and what moves each folder it names (the verb's --help epilog)."""
        from trtkv.core.paths import FOLDERS, HOME

        if not self.writes:
            return "writes: nothing (it reads recipes/, " + FOLDERS["recipes/"] + ")"
        moved = [f"  {folder} is {env}" for folder, env in FOLDERS.items() if folder in self.writes]
        home = [f"  {HOME}"] if any("TRTKV_HOME" in line for line in moved) else []
        return "\n".join([f"writes: {self.writes}", *moved, *home])


VERBS: tuple[Verb, ...] = (
    Verb("ls", "list the recipes under recipes/"),
    Verb(
        "init",
        "write a recipe from a model's config.json (architecture, attention, TP/PP sized)",
        writes="recipes/NAME.yaml (or --output)",
    ),
    Verb(
        "validate",
        "validate recipes and report every problem at once (all shipped ones when none is named)",
    ),
    Verb(
        "show",
        "print the fully resolved recipe as YAML (includes, overrides and defaults applied)",
    ),
    Verb("plan", "plan KV-cache memory and capacity for a recipe on its GPUs"),
    Verb(
        "probe",
        "measure KV-cache formats vs context length on the recipe's model (KL, perplexity, "
        "top-1, needle)",
        writes="engines/<recipe>/probe/ (or --output); the cache",
    ),
    Verb(
        "scales",
        "audit a checkpoint's KV-cache scales and say what each engine will use (exit 1 on a "
        "fault)",
        writes="the cache (--calibrate on a packaged model)",
    ),
    Verb(
        "calibrate",
        "calibrate KV-cache scales with ModelOpt and export the checkpoint",
        writes="engines/<recipe>/checkpoint/; the cache",
    ),
    Verb(
        "build",
        "build the engine for the recipe's backend ({backends}) from the checkpoint",
        writes="engines/<recipe>/engine/",
    ),
    Verb(
        "repo",
        "write the Triton model repository triton_repo/<recipe>/ in its backend's layout "
        "({triton_layouts})",
        writes="triton_repo/<recipe>/",
    ),
    Verb(
        "serve",
        "start the recipe's server, any backend ({backends}), under a supervisor "
        "(--attach: supervisor only)",
        writes="engines/<recipe>/serve/ (the server's record and log)",
    ),
    Verb(
        "stop",
        "stop the recipe's supervisor, then its server's whole process session (SIGTERM, "
        "then SIGKILL)",
        writes="engines/<recipe>/serve/ (removes the server's record)",
    ),
    Verb(
        "bench",
        "benchmark a served recipe: TTFT/ITL/throughput sweep, accuracy tasks, SLOs",
        writes="engines/<recipe>/bench/ (or --output), engines/<recipe>/fidelity/",
    ),
    Verb(
        "report",
        "summarize a recipe's stage outputs into engines/<recipe>/report/",
        writes="engines/<recipe>/report/",
    ),
    Verb(
        "demo",
        "run the whole chain for one recipe (calibrate to report), then stop its server",
        writes="engines/<recipe>/ (every stage), triton_repo/<recipe>/; the cache",
    ),
    Verb(
        "compare",
        "run the chain for several recipes and write engines/compare/compare.md + a PNG",
        writes="engines/compare/ (or --output), and each recipe's engines/<recipe>/, "
        "triton_repo/<recipe>/",
    ),
    Verb(
        "generate",
        "generate greedy text from the built engine, no server (here, or "
        "TensorRT-LLM's runner on a GPU)",
    ),
    Verb(
        "status",
        "check the recipe's server: alive, ready, answering a one-token inference, and "
        "its supervisor",
    ),
    Verb(
        "deploy",
        "write cluster deployment files (k8s, slurm, dynamo) for a recipe, sized by the planner",
        writes="deploy/<recipe>/<target>/ (or --output)",
    ),
)


@functools.cache
def engine_names() -> dict[str, str]:
    """The backend and layout names help text may show, read from the backends themselves (never
    typed by hand)."""
    from trtkv.backends import BACKENDS

    backends = list(BACKENDS.values())
    return {
        "backends": ", ".join(b.backend.value for b in backends),
        "layouts": ", ".join(dict.fromkeys(b.layout for b in backends)),
        "triton_layouts": ", ".join(
            dict.fromkeys(b.layout for b in backends if b.repo is not None)
        ),
    }


def layout_lines() -> list[str]:
    """One line per repository layout: the backends that use it (a backend without a Triton model
    has none)."""
    from trtkv.backends import BACKENDS

    by_layout: dict[str, list[str]] = {}
    for b in BACKENDS.values():
        if b.repo is not None:
            by_layout.setdefault(b.layout, []).append(b.backend.value)
    lines = [f"layout {layout}: {_backends(names)}" for layout, names in by_layout.items()]
    none = [b.backend.value for b in BACKENDS.values() if b.repo is None]
    if none:
        lines.append(f"no Triton repository: {_backends(none)} (`trtkv serve` runs its own server)")
    return lines


def _backends(names: list[str]) -> str:
    return ("backend " if len(names) == 1 else "backends ") + ", ".join(names)


def verb(name: str) -> Verb:
    return next(v for v in VERBS if v.name == name)


def outputs_markdown() -> str:
    """docs/where-it-runs.md's table: what each verb writes, and what moves each folder
    (trtkv.core.paths.FOLDERS)."""
    from trtkv.core.paths import FOLDERS, HOME

    rows = ["| verb | writes |", "|---|---|"]
    rows += [f"| `trtkv {v.name}` | {_cell(v.writes) if v.writes else 'nothing'} |" for v in VERBS]
    moved = ["", "| folder | where it is |", "|---|---|"]
    moved += [f"| {_cell(folder)} | {_cell(env)} |" for folder, env in FOLDERS.items()]
    return "\n".join([*rows, *moved, "", f"{_cell(HOME)}."]) + "\n"


def _cell(text: str) -> str:
    """A table cell: paths (`engines/<recipe>/probe/`, `recipes/NAME.yaml`) and `$VARS` as code."""
    import re

    return re.sub(r"(\$\w+(?:/[\w.<>~-]+)*|[\w.<>~-]+/(?:[\w.<>~-]+/?)*)", r"`\1`", text).replace(
        "|", "\\|"
    )
