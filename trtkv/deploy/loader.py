"""The models volume filled by a Job, not by `kubectl cp`: a small, well-known CLI image copies the
folders the server reads from the source the user names (`trtkv deploy --model-source`) into a new
folder of the PVC, writes the marker `.trtkv-loaded` holding this load's id into it, and only then
switches /models/<recipe> (a symbolic link) to it with one rename; every server pod's init container
waits for that marker (trtkv.deploy.pods.wait_for_load). A pod never starts on a half-copied volume,
a new build (new manifests, so a new id and a new Job name) is never mistaken for the old one, and a
load that fails half-way leaves the previous load and its marker as they were (the old pods can
restart), which goes only once the new one is in place.

Sources (the folders under them mirror /models/<recipe>/: engine/, checkpoint/..., triton_repo/):
- s3://BUCKET/PREFIX   amazon/aws-cli, `aws s3 sync --delete` (credentials: IRSA/instance role, or
  Secret
                       <name>-loader keys `credentials`/`config` as AWS's shared files;
                       AWS_ENDPOINT_URL for S3-compatible stores goes in `config` as endpoint_url)
- gs://BUCKET/PREFIX   google-cloud-cli, `gcloud storage rsync` (Workload Identity, or Secret key
  `key.json`)
- nfs://SERVER/PATH    `cp` from the export mounted read-only
- hf://ORG/NAME[@REV]  huggingface_hub's `snapshot_download` of an HF export (checkpoint/hf only:
                       the LLM API, vLLM or SGLang path) run in the server's own image, which
                       ships huggingface_hub (the engine loads HF models with it): nothing is
                       installed at run time; the cluster must reach the hub (token: Secret key
                       `token`); the volume is sized for what the repository holds
                       (trtkv.deploy.sizing.hub_source_gib)
Never executed here: no cluster.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from trtkv.contracts.stage import read_manifest
from trtkv.core.errors import StageError
from trtkv.deploy.pods import (
    LOAD_MARKER,
    MODELS_MOUNT,
    container_security,
    image_skips,
    pod_security,
    skip_annotations,
)
from trtkv.deploy.resources import LOADER
from trtkv.recipe import Recipe

LOADER_UID = 10001
LOADER_IMAGES = {  # pinned tags of the tools' own images (override: --loader-image)
    "s3": "amazon/aws-cli:2.17.0",
    "gs": "gcr.io/google.com/cloudsdktool/google-cloud-cli:489.0.0-slim",
    "nfs": "python:3.12.8-slim",  # GNU coreutils (mv -T), as the others
}  # hf://: the server's image (it ships huggingface_hub), passed to job() as `image`
CREDENTIALS_DIR = "/etc/trtkv-loader"
JOB_DEADLINE_S = 6 * 3600
_PATH = r"[A-Za-z0-9._~/@+=-]*"
FORMS = (
    "s3://BUCKET/PREFIX",
    "gs://BUCKET/PREFIX",
    "nfs://SERVER/EXPORT/PATH",
    "hf://ORG/NAME[@REVISION]",
)


class SourceKind(str, Enum):
    S3 = "s3"
    GS = "gs"
    NFS = "nfs"
    HF = "hf"


@dataclass(frozen=True)
class ModelSource:
    """Where the loader Job copies from; `host` is the bucket, NFS server or hub organisation."""

    kind: SourceKind
    host: str
    path: str
    revision: str | None = None

    @property
    def uri(self) -> str:
        return f"{self.kind.value}://{self.host}/{self.path}" + (
            f"@{self.revision}" if self.revision else ""
        )


# each provider's own naming rule, checked whole (never a bucket cut to a prefix of what was typed)
S3_BUCKET_RULE = (
    "an S3 bucket name is 3-63 characters of lower-case letters, digits, '.' and '-', begins and "
    "ends with a letter or digit, has no '..', is not an IP address, and does not begin with "
    "xn--, sthree- or amzn-s3-demo- nor end with -s3alias, --ol-s3, .mrap, --x-s3 or --table-s3 "
    "(AWS: bucket naming rules)"
)
GS_BUCKET_RULE = (
    "a Cloud Storage bucket name is 3-63 characters of lower-case letters, digits, '_', '-' and "
    "'.' (up to 222 with dots, each dot-separated part at most 63), begins and ends with a letter "
    "or digit, has no '..', is not an IP address, does not begin with 'goog' nor contain 'google' "
    "(Google Cloud: bucket naming requirements)"
)
HF_NAME_RULE = (
    "a hub repository id is ORG/NAME, each part 1-96 characters of letters, digits, '_', '-' and "
    "'.', beginning and ending with a letter or digit, with no '--' or '..' (huggingface_hub's "
    "validate_repo_id); a revision is letters, digits and ._/- with no '..' and no leading '/'"
)
NFS_RULE = (
    "an NFS server is a host name (dot-separated labels of 1-63 letters, digits and '-', not "
    "beginning or ending with '-', at most 253 characters) or a [IPv6] address, and the export "
    "path is absolute, with no '.' or '..' part"
)
PATH_RULE = "a path or prefix holds letters, digits and ._~/@+=- only"
_IP = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
_S3_NAME = re.compile(r"[a-z0-9](?:[a-z0-9.-]{1,61})[a-z0-9]")
_S3_AFFIXES = (
    ("xn--", "sthree-", "amzn-s3-demo-"),
    ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"),
)
_GS_PART = re.compile(r"[a-z0-9_-]{1,63}")
_GS_NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]{1,220})[a-z0-9]")
_HF_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _bucket_ok(kind: str, name: str) -> bool:
    """`name` keeps the provider's bucket naming rule (S3_BUCKET_RULE, GS_BUCKET_RULE)."""
    if ".." in name or _IP.fullmatch(name):
        return False
    if kind == "s3":
        starts, ends = _S3_AFFIXES
        return bool(_S3_NAME.fullmatch(name)) and not (
            name.startswith(starts) or name.endswith(ends)
        )
    parts = name.split(".")
    return (
        bool(_GS_NAME.fullmatch(name))
        and (len(name) <= 63 or len(parts) > 1)
        and all(_GS_PART.fullmatch(p) for p in parts)
        and not name.startswith("goog")
        and "google" not in name
    )


def _refuse(text: str, rule: str) -> StageError:
    return StageError(
        f"--model-source {text!r}: {rule}. Next: correct it, e.g. --model-source "
        "s3://my-bucket/trtkv/<recipe>; the folders under it mirror /models/<recipe>/ (the "
        "README's upload step writes them)."
    )


def parse_source(text: str) -> ModelSource:
    """`--model-source` validated where it enters, whole, by each provider's naming rule (it reaches
    a shell line, a Job spec and the README's upload step); StageError naming the value and the
    rule otherwise."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in {k.value for k in SourceKind}:
        raise _refuse(text, f"it is not one of {', '.join(FORMS)}")
    kind = SourceKind(scheme)
    host, slash, path = rest.partition("/")
    if kind in (SourceKind.S3, SourceKind.GS):
        if not _bucket_ok(scheme, host):
            raise _refuse(text, S3_BUCKET_RULE if kind is SourceKind.S3 else GS_BUCKET_RULE)
        if not re.fullmatch(_PATH, path):
            raise _refuse(text, PATH_RULE)
        return ModelSource(kind, host, path.strip("/"))
    if kind is SourceKind.NFS:
        labels = host.split(".")
        named = len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)
        parts = path.split("/")
        if (
            not (named or re.fullmatch(r"\[[0-9a-fA-F:]+\]", host))
            or not slash
            or any(p in (".", "..") for p in parts)
        ):
            raise _refuse(text, NFS_RULE)
        if not re.fullmatch(_PATH, path):
            raise _refuse(text, PATH_RULE)
        return ModelSource(kind, host, ("/" + path).rstrip("/") or "/")
    name, at, revision = path.partition("@")
    if (
        not all(_HF_PART.fullmatch(p) for p in (host, name))
        or any(".." in p or "--" in p for p in (host, name))
        or (at and not re.fullmatch(r"[A-Za-z0-9._-][A-Za-z0-9._/-]*", revision))
        or ".." in revision
    ):
        raise _refuse(text, HF_NAME_RULE)
    return ModelSource(kind, host, name, revision or None)


def check_source(source: ModelSource, recipe: Recipe, folders: list[str]) -> None:
    """A hub id holds an HF export only: refuse it for a server that reads anything else."""
    if source.kind is SourceKind.HF and folders != ["checkpoint/hf"]:
        from trtkv.backends import BACKENDS

        # the other backends that serve the HF export alone: their own server, no Triton repository
        alone = [b.value for b, obj in BACKENDS.items() if obj.repo is None]
        others = [b for b in alone if b != recipe.build.backend.value]
        raise StageError(
            f"--model-source {source.uri}: a hub repository holds an HF export (checkpoint/hf), "
            f"but {recipe.name}'s server (build.backend {recipe.build.backend.value}) also reads "
            f"{', '.join(f for f in folders if f != 'checkpoint/hf')} (trtkv's build and "
            "repository). Next: upload them to s3://, gs:// or an NFS export"
            + (
                f", or use a backend that serves the HF export alone (build.backend "
                f"{' or '.join(others)})."
                if others
                else "."
            )
        )


def load_id(recipe: Recipe, source: ModelSource, folders: list[tuple[Path, str]]) -> str:
    """Names this load: the source, the folders and what the stage manifests of the artifacts built
    here say they hold (their `key`: recipe, inputs, templates; not their run times or this
    machine's paths): a rebuild from other inputs changes it, the same files deployed again do
    not."""

    def held(host: Path) -> Any:
        manifest = read_manifest(host)
        return manifest.key if manifest else None

    data = {
        "recipe": recipe.name,
        "source": source.uri,
        "folders": {sub: held(host) for host, sub in folders},
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


def remote(source: ModelSource, sub: str) -> str:
    """The bucket URI of one folder (`sub`, relative to /models/<recipe>)."""
    return "/".join(p for p in (f"{source.kind.value}://{source.host}", source.path, sub) if p)


def _copy(source: ModelSource, sub: str, dest: str) -> str:
    """The shell line copying one folder (`sub`, relative to /models/<recipe>) into `dest` (a shell
    word, already quoted)."""
    q = shlex.quote
    if source.kind is SourceKind.S3:
        return f"aws s3 sync --only-show-errors --delete {q(remote(source, sub))} {dest}"
    if source.kind is SourceKind.GS:
        return (
            "gcloud storage rsync --recursive --delete-unmatched-destination-objects "
            f"{q(remote(source, sub))} {dest}"
        )
    if source.kind is SourceKind.NFS:
        return f"cp -R {q('/source/' + sub)}/. {dest}/"
    call = (
        "import sys; from huggingface_hub import snapshot_download; "
        "snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2] or None, "
        "local_dir=sys.argv[3])"
    )
    return (
        f"python3 -c {q(call)} {q(source.host + '/' + source.path)} "
        f"{q(source.revision or '')} {dest}"
    )


# under the volume: every load of a recipe in a folder of its own; /models/<recipe> is a symbolic
# link to the complete load in use, so a load is switched by one rename
LOADS_DIR = ".trtkv-loads"


def script(recipe: Recipe, source: ModelSource, subs: list[str], lid: str) -> str:
    """The Job's shell: copy every folder into a new folder beside the load in use, check none is
    empty, write the marker into it, then switch /models/<recipe> (a symbolic link) to it with one
    rename (`mv -T`, GNU coreutils: every loader image has them); the previous load is removed only
    after that. A copy that fails half-way removes its own folder and leaves the load in use, its
    marker included, as it was. A folder a trtkv before 2026-12 loaded in place is moved under
    LOADS_DIR once, behind the link, unchanged."""
    q = shlex.quote
    name = recipe.name
    loads = f"{LOADS_DIR}/{name}"  # relative to the volume: the link's target
    lines = [
        "set -eu",
        f"top={q(MODELS_MOUNT)}",
        f"root={q(MODELS_MOUNT + '/' + name)}",
        f"loads={q(loads)}",
        f'new="$loads/{lid}.$(date +%s).$$"',
        f'link="$top/.{name}.link.$$"',
        'mkdir -p "$top/$loads"',
        'trap \'rm -rf "${top:?}/$new" "$link"\' EXIT  # a failed copy leaves nothing of its own',
        'if [ -d "$root" ] && [ ! -L "$root" ]; then old="$loads/inplace.$(date +%s)"; '
        'mv "$root" "$top/$old"; ln -s "$old" "$root"; fi',
    ]
    if source.kind is SourceKind.GS:
        lines.append(
            f"if [ -f {CREDENTIALS_DIR}/key.json ]; then gcloud auth activate-service-account "
            f"--key-file={CREDENTIALS_DIR}/key.json; fi"
        )
    for sub in subs:
        dest = f'"$top/$new"/{q(sub)}'
        lines += [
            f"mkdir -p {dest}",
            _copy(source, sub, dest),
            f'[ -n "$(ls -A {dest})" ] || {{ echo "loader: {sub} is empty after the copy from '
            f'{source.uri}" >&2; exit 1; }}',
        ]
    lines += [
        f'echo {lid} > "$top/$new/{LOAD_MARKER}"',
        'ln -s "$new" "$link"',
        'mv -T "$link" "$root"  # one rename: the servers see the old load or the new one, whole',
        "trap - EXIT",
        'for old in "$top/$loads"/*; do [ "$old" = "$top/$new" ] || rm -rf "$old"; done',
        f'echo "loaded {len(subs)} folder(s) from {source.uri} into $root -> $new ({lid})"',
    ]
    return "\n".join(lines) + "\n"


def env(source: ModelSource) -> list[dict[str, Any]]:
    """The tools' configuration: credentials as files from the optional Secret (never a Secret in an
    env var)."""
    out = [{"name": "HOME", "value": "/tmp"}]
    if source.kind is SourceKind.S3:
        out += [
            {"name": "AWS_SHARED_CREDENTIALS_FILE", "value": f"{CREDENTIALS_DIR}/credentials"},
            {"name": "AWS_CONFIG_FILE", "value": f"{CREDENTIALS_DIR}/config"},
        ]
    elif source.kind is SourceKind.GS:
        out.append({"name": "CLOUDSDK_CONFIG", "value": "/tmp/gcloud"})
    elif source.kind is SourceKind.HF:
        out += [
            {"name": "HF_TOKEN_PATH", "value": f"{CREDENTIALS_DIR}/token"},
            {"name": "HF_HOME", "value": "/tmp/hf"},
        ]
    return out


def job(
    recipe: Recipe,
    source: ModelSource,
    subs: list[str],
    lid: str,
    names: dict[str, str],
    labels: dict[str, str],
    namespace: str,
    image: str | None = None,
) -> dict[str, Any]:
    """The loader Job (`names`: job, claim, secret): one pod, non-root, read-only root filesystem, a
    scratch /tmp."""
    img = image or LOADER_IMAGES.get(source.kind.value)
    if img is None:  # pragma: no cover - deploy passes the server's image for hf://
        raise StageError(f"--model-source {source.uri}: no loader image. Next: --loader-image.")
    volumes: list[dict[str, Any]] = [
        {"name": "models", "persistentVolumeClaim": {"claimName": names["claim"]}},
        {"name": "tmp", "emptyDir": {}},
        {
            "name": "credentials",
            "secret": {"secretName": names["secret"], "optional": True, "defaultMode": 0o440},
        },
    ]
    volume_mounts = [
        {"name": "models", "mountPath": MODELS_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True},
    ]
    if source.kind is SourceKind.NFS:
        volumes.append(
            {
                "name": "source",
                "nfs": {"server": source.host.strip("[]"), "path": source.path, "readOnly": True},
            }
        )
        volume_mounts.append({"name": "source", "mountPath": "/source", "readOnly": True})
    container = {
        "name": "loader",
        "image": img,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script(recipe, source, subs, lid)],
        "env": env(source),
        "resources": LOADER.k8s(),
        "securityContext": container_security(),
        "volumeMounts": volume_mounts,
    }
    pod_labels = {**labels, "app.kubernetes.io/component": "loader"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names["job"],
            "namespace": namespace,
            "labels": pod_labels,
            "annotations": skip_annotations(*image_skips([img])),
        },
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": JOB_DEADLINE_S,
            "ttlSecondsAfterFinished": 7 * 86400,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": volumes,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pod_security(LOADER_UID),
                },
            },
        },
    }


def upload_lines(source: ModelSource, folders: list[tuple[Path, str]]) -> list[str]:
    """The README's commands putting this machine's folders where the loader reads them."""
    q = shlex.quote
    if source.kind is SourceKind.HF:
        return [
            f"# {source.uri}: the hub repository must hold the HF export the server loads "
            "(checkpoint/hf)"
        ]
    out = []
    for host, sub in folders:
        if source.kind is SourceKind.S3:
            out.append(f"aws s3 sync --delete {q(str(host))} {q(remote(source, sub))}")
        elif source.kind is SourceKind.GS:
            out.append(
                "gcloud storage rsync --recursive --delete-unmatched-destination-objects "
                f"{q(str(host))} {q(remote(source, sub))}"
            )
        else:
            out.append(
                f"rsync -a --delete {q(str(host))}/ {q(f'{source.host}:{source.path}/{sub}')}/   "
                f"# or copy it there any way you like"
            )
    return out
