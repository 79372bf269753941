"""Every `trtkv` verb in one list (name, module, one-line help), as vLLM registers its CLI subcommands in one place.

Voice: each line is a lower-case imperative with no full stop ("build the engine ..."), the voice of argparse's own
"show this help message and exit", so the verb list reads as one. Backend and layout names are never typed here:
`{backends}`, `{layouts}` and `{triton_layouts}` are filled from trtkv.backends (a test fails on a typed name).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Verb:
    name: str  # what the user types: `trtkv <name>`
    module: str  # the module with add_parser(sub) and run(args)
    help: str  # one line for `trtkv --help` and the verb's own description; {placeholders} as in engine_names()

    def render(self) -> str:
        return self.help.format_map(engine_names())


VERBS: tuple[Verb, ...] = (
    Verb("ls", "trtkv.cli.ls", "list the recipes under recipes/"),
    Verb("init", "trtkv.cli.init", "write a recipe from a model's config.json (architecture, attention, TP/PP sized)"),
    Verb("validate", "trtkv.cli.validate", "validate recipes and report every problem at once (all shipped ones when "
                                           "none is named)"),
    Verb("show", "trtkv.cli.show", "print the fully resolved recipe as YAML (includes, overrides and defaults applied)"),
    Verb("plan", "trtkv.cli.plan", "plan KV-cache memory and capacity for a recipe on its GPUs"),
    Verb("probe", "trtkv.cli.probe", "measure KV-cache formats vs context length on the recipe's model (KL, perplexity, "
                                     "top-1, needle)"),
    Verb("calibrate", "trtkv.cli.calibrate", "calibrate KV-cache scales with ModelOpt and export the checkpoint"),
    Verb("build", "trtkv.cli.build", "build the engine for the recipe's backend ({backends}) from the checkpoint"),
    Verb("repo", "trtkv.cli.repo", "write the Triton model repository triton_repo/<recipe>/ in its backend's layout "
                                   "({triton_layouts})"),
    Verb("serve", "trtkv.cli.serve", "start the recipe's server, any backend ({backends}), under a supervisor "
                                     "(--attach: supervisor only)"),
    Verb("stop", "trtkv.cli.stop", "stop the recipe's supervisor, then its server's whole process session (SIGTERM, "
                                   "then SIGKILL)"),
    Verb("bench", "trtkv.cli.bench", "benchmark a served recipe: TTFT/ITL/throughput sweep, accuracy tasks, SLOs"),
    Verb("report", "trtkv.cli.report", "summarize a recipe's stage outputs into engines/<recipe>/report/"),
    Verb("demo", "trtkv.cli.demo", "run the whole chain for one recipe (calibrate to report), then stop its server"),
    Verb("compare", "trtkv.cli.compare", "run the chain for several recipes and write engines/compare/compare.md + a "
                                         "PNG"),
    Verb("generate", "trtkv.cli.generate", "generate greedy text from the built engine, no server (here, or "
                                           "TensorRT-LLM's runner on a GPU)"),
    Verb("status", "trtkv.cli.status", "check the recipe's server: alive, ready, answering a one-token inference, and "
                                       "its supervisor"),
    Verb("deploy", "trtkv.cli.deploy", "write cluster deployment files (k8s, slurm, dynamo) for a recipe, sized by "
                                       "the planner"),
)


@functools.cache
def engine_names() -> dict[str, str]:
    """The backend and layout names help text may show, read from the backends themselves (never typed by hand)."""
    from trtkv.backends import BACKENDS

    backends = list(BACKENDS.values())
    return {
        "backends": ", ".join(b.backend.value for b in backends),
        "layouts": ", ".join(dict.fromkeys(b.layout for b in backends)),
        "triton_layouts": ", ".join(dict.fromkeys(b.layout for b in backends if b.repo is not None)),
    }


def layout_lines() -> list[str]:
    """One line per repository layout: the backends that use it (a backend without a Triton model has none)."""
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
