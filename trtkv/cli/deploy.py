"""`trtkv deploy`: Kubernetes, Slurm or NVIDIA Dynamo files for a recipe, sized by the planner and
checked."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated

from pydantic import Field

from trtkv.cli.common import add_verb, load
from trtkv.core.options import Flag, Options
from trtkv.deploy import Target
from trtkv.deploy.k8s import (
    DEFAULT_CLIENTS,
    DEFAULT_NAMESPACE,
    DEFAULT_PROMETHEUS,
    DEFAULT_PROMETHEUS_NAMESPACE,
)

_LABELS = "KEY=VALUE[,...]"


class DeployOptions(Options):
    """`trtkv deploy RECIPE --target TARGET [options]`: each field one flag (trtkv.core.options)."""

    target: Annotated[Target, Field(description="what to write files for"), Flag()]
    output: Annotated[
        Path | None, Field(description="folder (default deploy/<recipe>/<target>/)"), Flag()
    ] = None
    replicas: Annotated[
        int | None, Field(description="model replicas (default 1)"), Flag(exclusive="count")
    ] = None
    target_concurrency: Annotated[
        int | None,
        Field(
            description="concurrent sequences of build.max_seq_len to serve: replicas follow from "
            "the planner"
        ),
        Flag(exclusive="count"),
    ] = None
    model_source: Annotated[
        str | None,
        Field(
            description="k8s/dynamo: where the loader Job copies the model from: "
            "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, nfs://SERVER/PATH (folders mirroring "
            "/models/<recipe>/), or hf://ORG/NAME[@REV] (an HF export)"
        ),
        Flag(metavar="URI"),
    ] = None
    namespace: Annotated[
        str,
        Field(
            description=f"k8s/dynamo: the objects' namespace (default {DEFAULT_NAMESPACE}; never "
            "`default`)"
        ),
        Flag(),
    ] = DEFAULT_NAMESPACE
    image: Annotated[
        str | None,
        Field(description="k8s: the server image (e.g. pinned by digest: IMAGE@sha256:...)"),
        Flag(),
    ] = None
    loader_image: Annotated[
        str | None, Field(description="k8s/dynamo: the loader Job's image (e.g. a mirror)"), Flag()
    ] = None
    model_size: Annotated[
        float | None,
        Field(
            gt=0,
            description="k8s/dynamo with an hf:// source: the GiB its weights hold (the volume is "
            "sized for them); default: the total_size of the export's index built here",
        ),
        Flag(metavar="GIB"),
    ] = None
    allow_from: Annotated[
        str,
        Field(
            description="k8s: the labels of the pods the NetworkPolicy admits to the server "
            f"(default {DEFAULT_CLIENTS})"
        ),
        Flag(metavar=_LABELS),
    ] = DEFAULT_CLIENTS
    allow_namespace: Annotated[
        str | None,
        Field(
            description="k8s: admit those pods from the namespaces of these labels (default: the "
            "deployment's own)"
        ),
        Flag(metavar=_LABELS),
    ] = None
    prometheus: Annotated[
        str,
        Field(
            description="k8s: the Prometheus pods admitted to the metrics port (default "
            f"{DEFAULT_PROMETHEUS})"
        ),
        Flag(metavar=_LABELS),
    ] = DEFAULT_PROMETHEUS
    prometheus_namespace: Annotated[
        str,
        Field(
            description=f"k8s: their namespace's labels (default {DEFAULT_PROMETHEUS_NAMESPACE})"
        ),
        Flag(metavar=_LABELS),
    ] = DEFAULT_PROMETHEUS_NAMESPACE


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_verb(
        sub,
        "deploy",
        "  $ trtkv deploy llama70b_fp8kv --target k8s --model-source s3://my-bucket/trtkv/llama70b_fp8kv\n"
        "  $ trtkv deploy llama70b_fp8kv --target k8s --model-source "
        "nfs://nas.example/models/llama70b_fp8kv --namespace llm --allow-from app=gateway\n"
        "  $ trtkv deploy llama70b_fp8kv --target k8s --model-source gs://my-bucket/llama70b_fp8kv "
        "build.pp_size=2 hardware.count=8 hardware.gpus_per_node=4\n"
        "  $ trtkv deploy llama70b_fp8kv_llmapi --target dynamo --model-source s3://my-bucket/l70 "
        "--target-concurrency 256\n"
        "  $ trtkv deploy llama70b_fp8kv --target slurm --replicas 2 --output "
        "/shared/trtkv/slurm\n",
        DeployOptions,
        run,
    )


def run(args: argparse.Namespace) -> int:
    from trtkv.deploy import Options as FileOptions
    from trtkv.deploy import deploy
    from trtkv.deploy.k8s import Fence, selector
    from trtkv.plan import figures

    o = DeployOptions.from_args(args)
    fence = Fence(
        clients=selector(o.allow_from, "--allow-from"),
        client_namespaces=(
            selector(o.allow_namespace, "--allow-namespace")
            if o.allow_namespace is not None
            else None
        ),
        prometheus=selector(o.prometheus, "--prometheus"),
        prometheus_namespace=selector(o.prometheus_namespace, "--prometheus-namespace"),
    )
    options = FileOptions(
        fence=fence,
        namespace=o.namespace,
        model_source=o.model_source,
        image=o.image,
        loader_image=o.loader_image,
        model_size_gib=o.model_size,
    )
    recipe = load(args)
    deploy(
        recipe,
        o.target,
        o.output,
        o.replicas,
        o.target_concurrency,
        options=options,
        planned=figures(recipe),
    )
    return 0
