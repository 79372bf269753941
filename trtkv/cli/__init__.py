"""The `trtkv` console script: the verbs of trtkv.cli.registry.VERBS, one module each with
`add_parser` and `run`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from trtkv.cli.registry import VERBS
from trtkv.core.errors import TrtkvError, os_error_line
from trtkv.version import __version__

EPILOG = """\
the chain: calibrate -> build -> repo -> serve -> bench -> report -> stop (`trtkv demo RECIPE` runs it all);
`trtkv <command> --help` has each command's examples.

examples:
  $ trtkv ls
  $ trtkv plan llama70b_fp8kv
  $ trtkv validate
  $ trtkv demo smollm2_fp8kv
"""  # noqa: E501


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtkv",
        description="From a YAML recipe to a served, measured LLM with a quantized KV cache.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"trtkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # each module is imported only to build its parser; heavy work is lazy inside run()
    for verb in VERBS:
        importlib.import_module(verb.module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # section.key=value overrides may follow the options (`trtkv deploy R --target k8s
    # build.tp_size=8`)
    if (
        extra
        and hasattr(args, "overrides")
        and all("=" in a and not a.startswith("-") for a in extra)
    ):
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
    # read-only, full, name too long, permission: one line naming the path and the next step
    except OSError as exc:
        print(f"error: {os_error_line(exc)}", file=sys.stderr)
        return TrtkvError.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

__all__ = ["main"]
