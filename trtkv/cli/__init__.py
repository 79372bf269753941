"""The `trtkv` console script: one module per subcommand, each with `add_parser` and `run`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from trtkv.errors import TrtkvError
from trtkv.version import __version__

# Subcommand name -> module in trtkv.cli (imported only to build the parser; heavy work is lazy inside run()).
COMMANDS = ["ls", "init", "validate", "show", "plan", "probe", "calibrate", "build", "repo", "serve", "stop", "bench",
            "report", "demo", "compare", "generate", "status", "deploy"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtkv",
        description="From a YAML recipe to a served, measured LLM with a quantized KV cache.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  $ trtkv ls\n  $ trtkv plan llama70b_fp8kv\n  $ trtkv validate\n",
    )
    parser.add_argument("--version", action="version", version=f"trtkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"trtkv.cli.{name.replace('-', '_')}")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # section.key=value overrides may follow the options (`trtkv deploy R --target k8s build.tp_size=8`)
    if extra and hasattr(args, "overrides") and all("=" in a and not a.startswith("-") for a in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except TrtkvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
