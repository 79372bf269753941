"""How big a deployment is, from the planner's figures (trtkv.contracts.PlanFigures): GPUs and
nodes per replica, KV tokens per GPU, the sequences of the recipe's max_seq_len that fit in one
replica, and the replica count (`--replicas N`, or enough replicas for `--target-concurrency C`)."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import ConfigDict, computed_field, model_validator

from trtkv.contracts.artifacts import Artifact
from trtkv.contracts.plan_figures import PlanFigures
from trtkv.core.errors import StageError
from trtkv.platform.hardware import GPU
from trtkv.recipe import Recipe
from trtkv.recipe.limits import RANGES
from trtkv.units import GIB

DERIVED = ("total_gpus", "concurrent_sequences")


class Sizing(Artifact):
    """sizing.json of `trtkv deploy` (written next to the files it sized; total_gpus and
    concurrent_sequences follow from the other fields: written for the reader, recomputed on
    load)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    FILE = "sizing.json"
    WRITTEN_BY = "`trtkv deploy RECIPE --target TARGET`"

    gpus_per_replica: int
    gpus_per_node: int
    nodes_per_replica: int
    gpus_per_pod: int  # one pod per node
    kv_format: str
    kv_bytes_per_token_per_gpu: float
    kv_tokens_per_gpu: int
    max_seq_len: int
    sequences_per_replica: int  # of max_seq_len tokens, capped by build.max_batch_size
    bound_by: Literal["kv memory", "max_batch_size"]
    replicas: int
    chosen_by: str  # how the replica count was chosen
    weights_gib_total: float
    # what the models volume should hold: two loads (trtkv.deploy.loader keeps the one in use until
    # the next is complete)
    storage_gib: int
    # the plan's lower bound for one decode step at max_seq_len (0: unknown)
    decode_step_ms: float = 0.0
    # what an hf:// source holds (its index's metadata.total_size, or --model-size), which the
    # volume is sized for instead of the planned export (0: the planned export)
    source_gib: float = 0.0
    # the concurrency cap the engine is passed (build.max_batch_size as its flag) and the sequences
    # of the bench workload that fit in one replica beside the full-context count above
    # (trtkv.plan.concurrency)
    max_batch_size: int = 0
    batch_flag: str = ""
    bench_input_tokens: int = 0
    bench_output_tokens: int = 0
    bench_sequences_per_replica: int = 0

    @property
    def weights_gib_per_pod(self) -> float:
        """The weights one pod (one node of a replica) reads and loads: its ranks' shards."""
        return self.weights_gib_total / self.nodes_per_replica

    @model_validator(mode="before")
    @classmethod
    def _drop_derived(cls, data: Any) -> Any:
        """A written file carries the derived figures too; they are recomputed, not read."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in DERIVED}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    @computed_field  # type: ignore[prop-decorator]
    @property
    def concurrent_sequences(self) -> int:
        return self.sequences_per_replica * self.replicas

    def lines(self) -> list[str]:
        """The sizing as README lines."""
        return [
            f"- GPUs per replica: {self.gpus_per_replica} (TP x PP) = {self.nodes_per_replica} "
            f"node(s) x {self.gpus_per_pod} GPU(s) (hardware.gpus_per_node = {self.gpus_per_node})",
            f"- KV cache ({self.kv_format}): {self.kv_bytes_per_token_per_gpu:,.0f} bytes per "
            f"token on the fullest GPU; {self.kv_tokens_per_gpu:,} tokens per GPU in the KV pool "
            "the engine's own memory rule leaves after weights, activations and its other "
            "buffers (`trtkv plan`)",
            f"- Sequences of {self.max_seq_len:,} tokens per replica: {self.sequences_per_replica} "
            f"(bound by {self.bound_by})",
            f"- Concurrency cap passed to the engine: {self.max_batch_size:,} ({self.batch_flag} = "
            f"build.max_batch_size); sequences of the bench workload ({self.bench_input_tokens:,} "
            f"in + {self.bench_output_tokens:,} out tokens) that fit per replica: "
            f"{self.bench_sequences_per_replica:,}",
            f"- Replicas: {self.replicas} ({self.chosen_by}) -> {self.total_gpus} GPUs, "
            f"{self.concurrent_sequences} concurrent sequences at full context",
            f"- Model volume: {self.storage_gib} GiB (twice the folders the server reads, since a "
            "new load is copied beside the one in use and replaces it only once complete: "
            + (
                f"the hub repository's weights, {self.source_gib:.1f} GiB (its index's total_size, "
                "--model-size or the checkpoint's weights as stored),"
                if self.source_gib
                else f"the exported weights, {self.weights_gib_total:.1f} GiB,"
            )
            + " x 1.25 + 5 GiB for the tokenizer, the engines' per-rank copies of embeddings and "
            "the repository)",
        ]


def volume_gib(weights_gib: float) -> int:
    """The models volume for weights of `weights_gib`: two loads (the one in use and the next), each
    the weights x 1.25 + 5 GiB (tokenizer, per-rank copies of embeddings, the repository)."""
    return math.ceil(2 * (weights_gib * 1.25 + 5))


INDEX_FILE = "model.safetensors.index.json"


def hub_source_gib(recipe: Recipe, model_size_gib: float | None) -> float:
    """What an hf:// source holds, in GiB: `--model-size`, else the total_size of the HF export's
    own index built here (checkpoint/hf/model.safetensors.index.json, the file the hub repository
    holds when it was uploaded from there), else a pre-quantized checkpoint's weights as stored
    (model.checkpoint_weights_gib, counted by `trtkv init`: the repository is that checkpoint);
    StageError when none is given."""
    from trtkv.recipe.layout import host_artifacts

    if model_size_gib is not None:
        return model_size_gib
    index = host_artifacts(recipe).hf / INDEX_FILE
    total = None
    if index.is_file() and index.stat().st_size < 64 << 20:
        try:
            meta = json.loads(index.read_text()).get("metadata") or {}
        except (ValueError, OSError, AttributeError) as e:
            raise StageError(
                f"{index}: not a readable safetensors index ({e}). Next: rebuild the export "
                "(`trtkv calibrate`), or pass --model-size GIB."
            ) from e
        total = meta.get("total_size") if isinstance(meta, dict) else None
    stored = recipe.model.checkpoint_weights_gib
    if (not isinstance(total, int) or isinstance(total, bool) or total <= 0) and stored:
        return stored
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise StageError(
            f"deploy {recipe.name} --model-source hf://...: the models volume must hold what the "
            "hub repository holds, which trtkv cannot read from here (no index with "
            f"metadata.total_size at {index}). Next: pass --model-size GIB (the repository's "
            "safetensors total, e.g. from its model.safetensors.index.json), or build the export "
            "here first."
        )
    return total / GIB


def size(
    recipe: Recipe,
    planned: PlanFigures,
    replicas: int | None = None,
    target_concurrency: int | None = None,
) -> Sizing:
    """The planner's figures for this recipe (`planned`: trtkv.plan.figures), and the replica
    count; StageError when the recipe cannot be sized."""
    hw = recipe.hardware
    if hw.gpu is GPU.CPU:
        raise StageError(
            f"{recipe.name}: hardware.gpu is cpu; `trtkv deploy` writes files for GPU clusters. "
            "Next: use a GPU recipe (e.g. llama70b_fp8kv), or override hardware.gpu=H100-80GB "
            f"hardware.count=N with matching build.tp_size/pp_size."
        )
    if replicas is not None and target_concurrency is not None:
        raise StageError(
            "--replicas and --target-concurrency both given: pass one (the other follows from it)"
        )
    bound_to = RANGES["replicas"]  # Kubernetes' int32 replica count; concurrency alike
    for flag, value in (("--replicas", replicas), ("--target-concurrency", target_concurrency)):
        if value is not None and not bound_to.admits(value):
            raise StageError(f"{flag} {value}: use 1 or more, a whole number in {bound_to.text()}")
    cap = planned.formats[planned.recipe_kv_format]
    seq_len = recipe.build.max_seq_len
    fit = cap.sequences_at_max_seq_len or 0
    if fit < 1:
        raise StageError(
            f"{recipe.name}: not one sequence of build.max_seq_len={seq_len} fits in the KV pool "
            f"({planned.pool_gib_per_gpu:.1f} GiB per GPU by {planned.engine}'s rule, after "
            f"{planned.weights_gib_per_gpu:.1f} GiB of weights). Next: `trtkv plan {recipe.name}`, "
            "then raise build.tp_size/pp_size (and hardware.count), or lower build.max_seq_len."
        )
    per_replica = min(fit, recipe.build.max_batch_size)
    bound = "kv memory" if fit < recipe.build.max_batch_size else "max_batch_size"
    if target_concurrency is not None:
        count = max(1, math.ceil(target_concurrency / per_replica))
        chosen = f"--target-concurrency {target_concurrency} / {per_replica} per replica"
    else:
        count = replicas or 1
        chosen = (
            f"--replicas {count}"
            if replicas
            else "default 1; --replicas N or --target-concurrency C"
        )

    if not bound_to.admits(count * recipe.world_size):
        raise StageError(
            f"{recipe.name}: {count:,} replicas of {recipe.world_size} GPU(s) is more than "
            f"{bound_to.text()}. Next: fewer replicas (--replicas / --target-concurrency)."
        )
    world, per_node = recipe.world_size, hw.gpus_per_node
    weights = planned.weights_gib_total
    return Sizing(
        gpus_per_replica=world,
        gpus_per_node=per_node,
        nodes_per_replica=max(1, math.ceil(world / per_node)),
        gpus_per_pod=min(world, per_node),
        kv_format=planned.recipe_kv_format,
        kv_bytes_per_token_per_gpu=cap.bytes_per_token_per_gpu,
        kv_tokens_per_gpu=cap.tokens_per_gpu,
        max_seq_len=seq_len,
        sequences_per_replica=per_replica,
        bound_by=bound,
        replicas=count,
        chosen_by=chosen,
        weights_gib_total=weights,
        storage_gib=volume_gib(weights),
        decode_step_ms=cap.decode_step_ms,
        max_batch_size=recipe.build.max_batch_size,
        batch_flag=planned.batch_flag,
        bench_input_tokens=planned.bench_input_tokens,
        bench_output_tokens=planned.bench_output_tokens,
        bench_sequences_per_replica=planned.bench_sequences,
    )


def tp_across_nodes(recipe: Recipe) -> str | None:
    """The warning for a tensor-parallel group wider than a node (None when TP fits in one): every
    layer's all-reduce then crosses the inter-node network (hundreds of GB/s of NVLink inside a
    node against tens of GB/s of InfiniBand/RoCE between nodes), so each decode step waits on it."""
    b, per_node = recipe.build, recipe.hardware.gpus_per_node
    # under attention DP the all-reduce stays inside a group (the experts' all-to-all crosses)
    if recipe.parallelism.attention_tp <= per_node:
        return None
    return (
        f"warning: {recipe.name}: build.tp_size = {b.tp_size} spans "
        f"{math.ceil(b.tp_size / per_node)} nodes of hardware.gpus_per_node = {per_node}: every "
        "layer's tensor-parallel all-reduce crosses the inter-node network (tens of GB/s against "
        "NVLink's hundreds inside a node), which slows every decode step. Next: keep TP inside a "
        f"node and split across nodes with pipeline parallelism (build.tp_size={per_node} "
        f"build.pp_size={b.tp_size * b.pp_size // per_node})."
    )
