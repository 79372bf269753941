"""Expert and attention-data parallelism: the recipe's `build.ep_size` and
`build.attention_dp_size` read as one value (`Recipe.parallelism`: what the planner's memory rule,
the speed model and aiconfigurator's mapping take), and what each engine refuses of them.

trtkv counts as SGLang and TensorRT-LLM do: a replica's GPUs are tp_size x pp_size, and EP and
attention DP subdivide the TP group.
- SGLang 0.5.23 (sglang/srt/runtime_context.py derive_parallel_widths): attn_tp_size = tp_size //
  attn_dp_size, moe_tp_size = tp_size // ep_size; `--attn-dp-size` (the old `--dp-size N
  --enable-dp-attention` is deprecated there: arg_groups/parallel_hook.py
  handle_deprecated_dp_attention), `--ep-size`; arg_groups/parallel_hook.py asserts tp_size %
  attn_dp_size == 0.
- TensorRT-LLM (tensorrt_llm/mapping.py @05ebebb2, Mapping.__init__): "tp_size must equal to
  moe_tp_size * moe_ep_size * moe_cluster_size"; MappingBase.dp_size is `tp_size if
  enable_attention_dp else 1` (newer mapping.py): attention DP is all of the TP group or nothing;
  ep_experts gives each EP rank num_experts // moe_ep_size experts.
- vLLM 0.32.0 counts the other way: `--tensor-parallel-size` is the attention TP and
  `--data-parallel-size` the attention DP, GPUs = TP x DP (vllm/engine/arg_utils.py); with
  `--enable-expert-parallel` the experts spread over all TP x DP GPUs, without it they are tensor
  parallel over all of them (vllm/model_executor/layers/fused_moe/config.py
  FusedMoEParallelConfig.make: ep_size = flattened tp_size): EP is all of the group or nothing.
The engine path (trtllm-build) takes its mapping from ModelOpt's TensorRT-LLM checkpoint export,
which writes moe_tp_size = tp_size, moe_ep_size = 1 (modelopt/torch/export/tensorrt_llm_utils.py),
and has no attention DP.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtkv.recipe.enums import Backend


@dataclass(frozen=True)
class Parallelism:
    """One replica's parallel layout in trtkv's count: GPUs = tp x pp; ep and attention_dp divide
    tp."""

    tp: int = 1
    pp: int = 1
    ep: int = 1  # GPUs the routed experts are spread over (1: every expert tensor parallel)
    attention_dp: int = 1  # attention groups inside the TP group, each with its own sequences

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def moe_tp(self) -> int:
        """Tensor parallelism of each expert (tp / ep)."""
        return max(1, self.tp // self.ep)

    @property
    def attention_tp(self) -> int:
        """Tensor parallelism of the attention inside one attention-DP group (tp /
        attention_dp): the KV heads split over it."""
        return max(1, self.tp // self.attention_dp)

    @property
    def active(self) -> bool:
        """EP or attention DP is on (else the layout is plain TP x PP)."""
        return self.ep > 1 or self.attention_dp > 1

    def per_group(self, count: int) -> int:
        """A replica's `count` (sequences in flight) split over its attention-DP groups, rounded
        up: what an engine that schedules each group alone takes (vLLM's --max-num-seqs per DP
        engine core, TensorRT-LLM's max_batch_size per attention-DP rank; SGLang divides
        --max-running-requests by attn_dp_size itself)."""
        return -(-count // self.attention_dp)

    def groups_per_node(self, gpus_per_node: int) -> int:
        """Attention-DP groups whole on one node of `gpus_per_node` GPUs (a multi-node vLLM
        deployment's --data-parallel-size-local)."""
        return max(1, gpus_per_node // (self.attention_tp * self.pp))

    def label(self) -> str:
        """e.g. `TP8 PP1 EP8 attention-DP8`."""
        out = f"TP{self.tp} PP{self.pp}"
        if self.ep > 1:
            out += f" EP{self.ep}"
        if self.attention_dp > 1:
            out += f" attention-DP{self.attention_dp}"
        return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def parallel_problems(p: Parallelism, backend: Backend, per_node: int) -> list[tuple[str, str]]:
    """EP and attention DP against tp_size and the recipe's engine on nodes of `per_node` GPUs
    (what does not depend on the model; that it is MoE is checked where its config is read:
    trtkv.engines.parallel)."""
    out: list[tuple[str, str]] = []
    allowed = ", ".join(map(str, divisors(p.tp)))
    if p.tp % p.ep:
        out.append(
            (
                "build.ep_size",
                f"ep_size {p.ep} does not divide build.tp_size {p.tp}: EP subdivides the TP "
                f"group (the experts over ep_size GPUs, each tensor parallel over tp_size / "
                f"ep_size), as SGLang's --ep-size and TensorRT-LLM's moe_expert_parallel_size "
                f"do; use one of {allowed}",
            )
        )
    if p.tp % p.attention_dp:
        out.append(
            (
                "build.attention_dp_size",
                f"attention_dp_size {p.attention_dp} does not divide build.tp_size {p.tp}: "
                f"attention DP subdivides the TP group (SGLang asserts tp_size % attn_dp_size "
                f"== 0); use one of {allowed}",
            )
        )
    if backend is Backend.TENSORRT:
        out += _engine_path_problems(p)
    elif backend is Backend.LLMAPI and p.attention_dp not in (1, p.tp):
        out.append(
            (
                "build.attention_dp_size",
                f"{p.attention_dp}: TensorRT-LLM's enable_attention_dp runs attention data "
                f"parallel over every TP rank (tensorrt_llm/mapping.py: dp_size = tp_size if "
                f"enable_attention_dp else 1): use attention_dp_size {p.tp} or 1, or backend "
                f"sglang (--attn-dp-size {p.attention_dp})",
            )
        )
    elif backend is Backend.VLLM:
        out += _vllm_problems(p, per_node)
    return out


def _vllm_problems(p: Parallelism, per_node: int) -> list[tuple[str, str]]:
    out = []
    if p.ep not in (1, p.tp):
        out.append(
            (
                "build.ep_size",
                f"{p.ep}: vLLM's --enable-expert-parallel spreads the experts over all "
                f"--tensor-parallel-size x --data-parallel-size GPUs (vllm 0.32.0 fused_moe/"
                f"config.py FusedMoEParallelConfig.make), here {p.tp}: use ep_size {p.tp} or 1, "
                f"or backend sglang / llmapi for ep_size {p.ep}",
            )
        )
    rank = p.attention_tp * p.pp
    if p.attention_dp > 1 and p.gpus > per_node and per_node % rank:
        out.append(
            (
                "build.attention_dp_size",
                f"{p.attention_dp}: across nodes trtkv runs vLLM's own data parallelism, whole DP "
                f"ranks of {rank} GPU(s) (TP {p.attention_tp} x PP {p.pp}) on each node of "
                f"hardware.gpus_per_node = {per_node} (--data-parallel-size-local): choose "
                f"attention_dp_size so that tp_size / attention_dp_size x pp_size divides "
                f"{per_node}",
            )
        )
    return out


def _engine_path_problems(p: Parallelism) -> list[tuple[str, str]]:
    out = []
    if p.ep > 1:
        out.append(
            (
                "build.ep_size",
                f"{p.ep}: the engine path builds from ModelOpt's TensorRT-LLM checkpoint, whose "
                "export writes mapping moe_ep_size 1 (modelopt/torch/export/"
                "tensorrt_llm_utils.py), and trtkv builds Llama-family (dense) engines only: use "
                "build.backend llmapi (moe_expert_parallel_size), vllm or sglang",
            )
        )
    if p.attention_dp > 1:
        out.append(
            (
                "build.attention_dp_size",
                f"{p.attention_dp}: trtllm-build engines have no attention data parallelism "
                "(enable_attention_dp is an LLM API option of the PyTorch backend): use "
                "build.backend llmapi, vllm or sglang",
            )
        )
    return out
