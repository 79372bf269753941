"""Re-read which vLLM attention backends accept each KV cache dtype (their `supported_kv_cache_dtypes` lists and
`supports_compute_capability` bodies) from an installed vLLM's sources, and write them into trtkv/data/kv_formats.json.

    .venv/bin/python scripts/refresh_kv_formats.py [--vllm-src .venv-vllm/lib/python3.11/site-packages/vllm] [--check]

--check exits 1 (and writes nothing) when the table's `implementations.vllm` differs from the sources: the test
tests/kvcache/test_engine_table.py runs it. Only the vLLM rows are derived; the others are read by hand (their
upstream file and commit are in each row).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "trtkv" / "data" / "kv_formats.json"
DEFAULT_SRC = ROOT / ".venv-vllm" / "lib" / "python3.11" / "site-packages" / "vllm"


def _class_facts(node: ast.ClassDef, source: str) -> tuple[list[str] | None, str | None]:
    dtypes: list[str] | None = None
    capability: str | None = None
    for item in node.body:
        target = None
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            target, value = item.target.id, item.value
        elif isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
            target, value = item.targets[0].id, item.value
        if target == "supported_kv_cache_dtypes" and isinstance(value, ast.List):
            dtypes = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if isinstance(item, ast.FunctionDef) and item.name == "supports_compute_capability":
            returns = [n for n in ast.walk(item) if isinstance(n, ast.Return) and n.value is not None]
            capability = " ; ".join(" ".join((ast.get_source_segment(source, r.value) or "").split()) for r in returns)
    return dtypes, capability


def read_backends(src: Path) -> dict[str, list[dict]]:
    """{cache dtype: [{backend class, file, capability rule}]} over vllm/v1/attention/backends/**.py."""
    found: dict[str, list[dict]] = {}
    for path in sorted((src / "v1" / "attention" / "backends").rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef):
                continue
            dtypes, capability = _class_facts(node, source)
            for dtype in dtypes or []:
                found.setdefault(dtype, []).append({
                    "backend": node.name, "file": str(path.relative_to(src.parent)),
                    "capability": capability or "inherited (AttentionBackend: no limit of its own)"})
    return dict(sorted(found.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-src", type=Path, default=DEFAULT_SRC)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    table = json.loads(TABLE.read_text())
    fresh = read_backends(args.vllm_src)
    current = table["implementations"]["vllm"]["backends"]
    if args.check:
        if current != fresh:
            changed = sorted(k for k in set(current) | set(fresh) if current.get(k) != fresh.get(k))
            print(f"{TABLE}: implementations.vllm.backends differs from {args.vllm_src} for {', '.join(changed)}. "
                  f"Next: python scripts/refresh_kv_formats.py", file=sys.stderr)
            return 1
        return 0
    table["implementations"]["vllm"]["backends"] = fresh
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {TABLE}: {len(fresh)} cache dtypes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
