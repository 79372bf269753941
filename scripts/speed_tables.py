"""Print docs/plan.md's speed-estimate tables: trtkv's model against published measurements and against recorded
aiconfigurator estimates (tests/support/speed_cases.py computes both; the tests hold them to the stated bounds).
Usage: .venv/bin/python scripts/speed_tables.py"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import speed_cases as sc  # noqa: E402


def main() -> int:
    print("| source | measurement | format | figure | measured | trtkv model | error |")
    print("|---|---|---|---|---|---|---|")
    for r in sc.published_comparisons():
        print(f"| {Path(r['source']).name} | {r['measurement']} | {r['format']} | {r['figure']} | {r['measured']:.4g} | "
              f"{r['estimate']:.4g} | {r['error']:+.1%} |")
    print()
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for c in sc.aic_comparisons():
        _model, tp, gpu, backend = c.case.split("/")[:4]
        groups[(gpu, backend, tp)].append(c.error)
    print("| GPU | engine | TP | cases | median abs error | worst |")
    print("|---|---|---|---|---|---|")
    for (gpu, backend, tp), errs in sorted(groups.items()):
        worst = max(errs, key=abs)
        print(f"| {gpu} | {backend} | {tp[2:]} | {len(errs)} | {statistics.median(abs(e) for e in errs):.1%} | "
              f"{worst:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
