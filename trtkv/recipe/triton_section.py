"""The recipe's `triton:` section: how the server runs (address, ports, instances), each engine's
KV-pool knob under its own name, batching, prefix caching, and the deployment's startup budget
(storage bandwidth, engine init). trtkv.recipe.schema re-exports it."""

from __future__ import annotations

from pydantic import Field, field_validator

from trtkv.recipe.enums import BatchingStrategy, SchedulerPolicy
from trtkv.recipe.limits import bounded
from trtkv.recipe.names import is_ip_or_host_name
from trtkv.recipe.sections import Section


class TritonConfig(Section):
    host: str = Field("127.0.0.1", description="Address the server binds.")
    http_port: int = Field(8000, gt=0, lt=65536, description="HTTP port.")
    grpc_port: int = Field(8001, gt=0, lt=65536, description="gRPC port.")
    metrics_port: int = Field(8002, gt=0, lt=65536, description="Metrics port.")
    instance_count: int = bounded(
        1, "batch", description="Model instances (CPU: one per core is the ceiling)."
    )
    decoupled: bool = Field(True, description="Decoupled model (streaming responses).")
    # --- the KV pool: each engine's knob under its own name (None: its default at trtkv's pinned
    # release), as sized
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="vLLM `--gpu-memory-utilization`: the share of the device's total memory vLLM "
        "may use (weights, activation, CUDA graphs and KV). None: vLLM's default (0.92 in 0.32). "
        "vllm only.",
    )
    mem_fraction_static: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="SGLang `--mem-fraction-static`: weights + KV pool as a share of the memory "
        "free before loading. None: SGLang's computed default (0.5.23's rule, shown by `trtkv "
        "plan`). sglang only.",
    )
    kv_cache_free_gpu_mem_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="TensorRT-LLM: the share of the memory free after weights and the warm-up "
        "(LLM API) or after the engine and its buffers (engine path) given to the KV cache. None: "
        "0.9 (TensorRT-LLM's default). llmapi and tensorrt only.",
    )
    kv_pool_gib_per_gpu: float | None = bounded(
        None,
        "memory_gib",
        description="KV pool per GPU in GiB: pins it where the engine takes a size (vLLM "
        "`--kv-cache-memory-bytes`), caps it where the engine only caps (SGLang "
        "`--max-total-tokens`, TensorRT-LLM `max_tokens`): the plan shows min(rule, cap) and "
        "which bound applied.",
    )
    # --- KV beyond the device (#55): a second tier per replica, served with each engine's own
    # flag (trtkv.engines.kv_tiers), refused where the served engine or release has none
    # (trtkv.recipe.kv_tiers)
    kv_host_tier_gib_per_replica: float | None = bounded(
        None,
        "memory_gib",
        description="Host-memory (pinned) KV tier of one replica in GiB, summed over its GPUs; "
        "None: no host tier. Served as vLLM `--kv-offloading-size` (GiB per DP engine, summed "
        "over its TP ranks) with `--kv-offloading-backend native`, SGLang "
        "`--enable-hierarchical-cache --hicache-size` (whole GB = 1e9 bytes per rank), "
        "TensorRT-LLM `kv_cache_config.host_cache_size` / Triton `kv_cache_host_memory_bytes` "
        "(bytes per rank). Added to the deployment's memory request and limit. vllm, sglang, "
        "llmapi and tensorrt on a GPU; trtkv's reference runtime holds it as the second pool of "
        "its reusable KV blocks (bytes, where block reuse is on).",
    )
    kv_disk_tier_gib_per_replica: float | None = bounded(
        None,
        "memory_gib",
        description="Disk KV tier of one replica in GiB; None: none. No engine at trtkv's pins "
        "serves a sized disk tier (vLLM 0.32.0's fs tier and SGLang 0.5.23's file backend take a "
        "directory, no size; TensorRT-LLM's disk_cache_size comes after 1.2.1, in 1.3.0rc27): "
        "validation refuses it with the release that has one.",
    )
    batching_strategy: BatchingStrategy = Field(
        BatchingStrategy.INFLIGHT_FUSED_BATCHING, description="`gpt_model_type`."
    )
    batch_scheduler_policy: SchedulerPolicy = Field(
        SchedulerPolicy.GUARANTEED_NO_EVICT, description="Scheduler."
    )
    exclude_input_in_output: bool = Field(True, description="Responses carry only generated text.")
    max_queue_delay_microseconds: int = bounded(0, "delay_us", description="Dynamic batcher delay.")
    startup_timeout_s: float = bounded(
        180.0, "timeout_s", description="How long `trtkv serve` waits for readiness."
    )
    # --- deploy (#41): prefix caching as each engine ships it, and the deployment's startup budget
    # ---
    enable_kv_cache_reuse: bool | None = Field(
        None,
        description="Prefix caching (KV block reuse), passed explicitly to every engine. None: the "
        "engine's own default (on for TensorRT-LLM, vLLM and SGLang) where the KV format and build "
        "allow it, off with the reason where not (`trtkv plan` says which, and what a prefix-cache "
        "hit rate does to capacity per format).",
    )
    storage_read_gbps: float = bounded(
        0.5,
        "storage_gbps",
        description="`trtkv deploy`: sustained read bandwidth (GB/s) from the models volume into "
        "one pod or node; the startup probe allows the weights' read at half this rate plus "
        "triton.engine_init_s. 0.5 GB/s: a network filesystem (NFS over 10 GbE tops out near 1.1); "
        "local NVMe reads 2-7. Measure yours: `dd if=<a weights file on the volume> of=/dev/null "
        "bs=16M`.",
    )
    engine_init_s: float = bounded(
        300.0,
        "timeout_s",
        description="`trtkv deploy`: seconds from weights read to serving (engine deserialization "
        "or compilation, CUDA graphs, KV-pool allocation, warm-up), added to the startup probe's "
        "budget.",
    )

    @field_validator("host")
    @classmethod
    def _ip_or_host_name(cls, value: str) -> str:
        """An IP address or an RFC 1123 host name, nothing else: it lands in commands, URLs and
        README `curl` lines."""
        if not is_ip_or_host_name(value):
            raise ValueError(
                "must be an IP address (v4 or v6, e.g. 127.0.0.1, 0.0.0.0, ::1) or an RFC 1123 "
                "host name (letters, digits and '-' in dot-separated labels of 1-63 characters, "
                "not starting or ending with '-', at most 253 characters, e.g. localhost or "
                "node-1.cluster.local)"
            )
        return value
