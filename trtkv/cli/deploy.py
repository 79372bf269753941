"""`trtkv deploy`: Kubernetes, Slurm or NVIDIA Dynamo files for a recipe, sized by the planner and checked."""

from __future__ import annotations

import argparse
from pathlib import Path

from trtkv.cli.common import add_recipe_args, load, subparser


def add_parser(sub: argparse._SubParsersAction) -> None:
    from trtkv.deploy.k8s import DEFAULT_CLIENTS, DEFAULT_NAMESPACE, DEFAULT_PROMETHEUS, DEFAULT_PROMETHEUS_NAMESPACE

    p = subparser(sub, "deploy",
                  "  $ trtkv deploy llama70b_fp8kv --target k8s --model-source s3://my-bucket/trtkv/llama70b_fp8kv\n"
                  "  $ trtkv deploy llama70b_fp8kv --target k8s --model-source nfs://nas.example/models/llama70b_fp8kv "
                  "--namespace llm --allow-from app=gateway\n"
                  "  $ trtkv deploy llama70b_fp8kv --target k8s --model-source gs://my-bucket/llama70b_fp8kv "
                  "build.pp_size=2 hardware.count=8 hardware.gpus_per_node=4\n"
                  "  $ trtkv deploy llama70b_fp8kv_llmapi --target dynamo --model-source s3://my-bucket/l70 "
                  "--target-concurrency 256\n"
                  "  $ trtkv deploy llama70b_fp8kv --target slurm --replicas 2 --output /shared/trtkv/slurm\n")
    add_recipe_args(p)
    p.add_argument("--target", required=True, choices=["k8s", "slurm", "dynamo"], help="what to write files for")
    p.add_argument("--output", type=Path, default=None, help="folder (default deploy/<recipe>/<target>/)")
    count = p.add_mutually_exclusive_group()
    count.add_argument("--replicas", type=int, default=None, help="model replicas (default 1)")
    count.add_argument("--target-concurrency", type=int, default=None,
                       help="concurrent sequences of build.max_seq_len to serve: replicas follow from the planner")
    p.add_argument("--model-source", default=None, metavar="URI",
                   help="k8s/dynamo: where the loader Job copies the model from: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, "
                        "nfs://SERVER/PATH (folders mirroring /models/<recipe>/), or hf://ORG/NAME[@REV] (an HF export)")
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE,
                   help=f"k8s/dynamo: the objects' namespace (default {DEFAULT_NAMESPACE}; never `default`)")
    p.add_argument("--image", default=None, help="k8s: the server image (e.g. pinned by digest: IMAGE@sha256:...)")
    p.add_argument("--loader-image", default=None, help="k8s/dynamo: the loader Job's image (e.g. a mirror)")
    p.add_argument("--allow-from", default=DEFAULT_CLIENTS, metavar="KEY=VALUE[,...]",
                   help=f"k8s: the labels of the pods the NetworkPolicy admits to the server (default {DEFAULT_CLIENTS})")
    p.add_argument("--allow-namespace", default=None, metavar="KEY=VALUE[,...]",
                   help="k8s: admit those pods from the namespaces of these labels (default: the deployment's own)")
    p.add_argument("--prometheus", default=DEFAULT_PROMETHEUS, metavar="KEY=VALUE[,...]",
                   help=f"k8s: the Prometheus pods admitted to the metrics port (default {DEFAULT_PROMETHEUS})")
    p.add_argument("--prometheus-namespace", default=DEFAULT_PROMETHEUS_NAMESPACE, metavar="KEY=VALUE[,...]",
                   help=f"k8s: their namespace's labels (default {DEFAULT_PROMETHEUS_NAMESPACE})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trtkv.deploy import Options, Target, deploy
    from trtkv.deploy.k8s import Fence, selector

    fence = Fence(clients=selector(args.allow_from, "--allow-from"),
                  client_namespaces=(selector(args.allow_namespace, "--allow-namespace")
                                     if args.allow_namespace is not None else None),
                  prometheus=selector(args.prometheus, "--prometheus"),
                  prometheus_namespace=selector(args.prometheus_namespace, "--prometheus-namespace"))
    options = Options(fence=fence, namespace=args.namespace, model_source=args.model_source, image=args.image,
                      loader_image=args.loader_image)
    deploy(load(args), Target(args.target), args.output, args.replicas, args.target_concurrency, options=options)
    return 0
