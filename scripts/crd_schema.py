"""Extract one version's OpenAPI schema from a CustomResourceDefinition into trtkv/data/schemas/ (gzip JSON), with
where it came from. `trtkv deploy` validates the LeaderWorkerSet and DynamoGraphDeployment objects it writes against
these (trtkv.deploy.check).

    python scripts/crd_schema.py CRD.yaml VERSION OUT.json.gz --source "owner/repo path @commit (release)"

Refresh: read the CRD file from the upstream repository at a named release (e.g. `git show v0.10.0:config/crd/bases/
leaderworkerset.x-k8s.io_leaderworkersets.yaml`) and rerun with --source naming the release (each file records its
source; `trtkv deploy` prints it in its README).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import yaml


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("crd", type=Path)
    ap.add_argument("version", help="the CRD version whose schema to keep, e.g. v1 or v1beta1")
    ap.add_argument("out", type=Path)
    ap.add_argument("--source", required=True, help="repository, path, commit and release it was read from")
    args = ap.parse_args()
    docs = [d for d in yaml.safe_load_all(args.crd.read_text()) if d]
    crd = next((d for d in docs if d.get("kind") == "CustomResourceDefinition"), None)
    if crd is None:
        print(f"error: {args.crd} holds no CustomResourceDefinition", file=sys.stderr)
        return 1
    spec = crd["spec"]
    versions = {v["name"]: v for v in spec["versions"]}
    if args.version not in versions:
        print(f"error: {args.crd} has versions {sorted(versions)}, not {args.version}", file=sys.stderr)
        return 1
    version = versions[args.version]
    out = {"group": spec["group"], "kind": spec["names"]["kind"], "version": args.version,
           "served": version.get("served"), "storage": version.get("storage"), "source": args.source,
           "openAPIV3Schema": version["schema"]["openAPIV3Schema"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, separators=(",", ":"), sort_keys=True).encode()
    args.out.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))  # mtime 0: the same bytes on every rerun
    print(f"{args.out}: {out['kind']} {out['group']}/{args.version} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
