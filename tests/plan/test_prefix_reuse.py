"""`plan --estimate` on a prefix-sharing workload (bench.prefix, #55): hit rates per tier from the pools and the
working set under each engine's eviction, block granularity, per KV format, and the TTFT they buy (trtkv.plan.
prefix_reuse); the GPU host-link table (trtkv/data/host_links.json). Shown failing on main's code: neither module
nor Estimate.prefix existed there (ImportError)."""

from __future__ import annotations

import json

import pytest

from tests.support import speed_cases as sc
from trtkv.plan.estimate import estimate
from trtkv.plan.planner import plan
from trtkv.plan.prefix import block_floor
from trtkv.plan.prefix_reuse import survives
from trtkv.platform.hardware import GPU, GPU_SPECS
from trtkv.platform.host_link import DATA, host_link_of
from trtkv.recipe import Recipe, load_recipe

LLAMA8B = sc.ROOT / "tests" / "data" / "configs" / "llama3_1_8b"


def recipe(backend: str, gpu: str, *more: str, isl: int = 4096, osl: int = 128) -> Recipe:
    return load_recipe(sc.BASE, [
        f"model.source={LLAMA8B}", f"build.backend={backend}", "quantization.weights=none",
        "quantization.kv_cache=none", f"hardware.gpu={gpu}", "hardware.count=1", "build.tp_size=1",
        f"bench.input_tokens={isl}", f"bench.output_tokens={osl}", "bench.concurrency=[1]",
        "build.max_num_tokens=8192", "build.max_input_len=65536", "build.max_seq_len=131072", *more])


def reuse(r: Recipe):  # noqa: ANN201 - a PrefixReuse
    section = estimate(r, plan(r), use_aiconfigurator=False).prefix
    assert section is not None
    return section


def rows(r: Recipe) -> dict[tuple[str, int], object]:
    return {(x.format, x.concurrency): x for x in reuse(r).rows}


def test_every_gpu_has_a_host_link_with_its_source() -> None:
    data = json.loads(DATA.read_text())
    for gpu in GPU_SPECS:
        link = host_link_of(gpu)
        if gpu in (GPU.CPU, GPU.GB10):  # no host tier to copy from (the CPU; GB10's unified memory)
            assert link is None
            continue
        assert link is not None and link.source and link.gb_per_s > 0, gpu
    assert host_link_of(GPU.H100_80GB).name == host_link_of(GPU.H200_141GB).name == "PCIe Gen5 x16"
    assert host_link_of(GPU.L40S).name == host_link_of(GPU.A100_80GB).name == "PCIe Gen4 x16"
    assert host_link_of(GPU.GH200).name.startswith("NVLink-C2C")
    # GB200: two Blackwell GPUs share one Grace's 450 GB/s a direction
    assert host_link_of(GPU.GB200).gb_per_s == 225.0 and host_link_of(GPU.GH200).gb_per_s == 450.0
    # a measured figure is used where one is published (H100 DMA copies), else the PCI-SIG peak
    assert host_link_of(GPU.H100_80GB).gb_per_s == 50.0 and host_link_of(GPU.L40S).gb_per_s == 31.5
    assert all(row["source"] for row in data["gpus"].values())


def test_no_prefix_workload_no_section() -> None:
    r = recipe("vllm", "H100-80GB")
    assert estimate(r, plan(r), use_aiconfigurator=False).prefix is None


@pytest.mark.parametrize(("backend", "block", "shared"), [("vllm", 16, 2050), ("sglang", 1, 2050),
                                                          ("llmapi", 32, 2050)])
def test_only_whole_blocks_of_the_shared_prefix_hit(backend: str, block: int, shared: int) -> None:
    # one turn, a 2,050-token system prompt shared by every request, everything resident (8B on an H100)
    r = recipe(backend, "H100-80GB", f"bench.prefix.shared_tokens={shared}")
    section = reuse(r)
    assert section.block_tokens == block
    row = section.rows[0]
    assert row.device_hit_rate == pytest.approx(block_floor(shared, block) / 4096, abs=1e-4)
    assert row.host_hit_rate == 0.0
    assert row.ttft_ms < row.ttft_ms_without_reuse


def test_multi_turn_history_hits_and_the_last_token_is_computed() -> None:
    # 3 turns of +64 tokens after a 1,024-token first prompt, no shared prefix: turn 2 reuses 1,024 + 128 tokens,
    # turn 3 1,024 + 2 x (64 + 128) + 128 - 64; SGLang's 1-token pages floor nothing
    r = recipe("sglang", "H100-80GB", "bench.prefix.turns=3", "bench.prefix.turn_tokens=64", isl=1024)
    prompts = [1024, 1024 + 192, 1024 + 384]
    hits = [0, 1024 + 128, 1024 + 192 + 128]
    assert rows(r)[("bf16", 1)].device_hit_rate == pytest.approx(sum(hits) / sum(prompts), abs=1e-4)


def pressure(*more: str) -> Recipe:
    """Long shared prefixes and think time on an L40S: the working set outgrows the 16-bit device pool."""
    return recipe("vllm", "L40S", "bench.prefix.shared_tokens=8192", "bench.prefix.groups=32",
                  "bench.prefix.turns=4", "bench.prefix.turn_tokens=512", "bench.prefix.think_time_s=30",
                  "bench.concurrency=[12]", *more, isl=16384, osl=512)


def test_a_quantized_cache_keeps_more_prefixes_resident() -> None:
    by = rows(pressure())
    bf16, fp8 = by[("bf16", 12)], by[("fp8", 12)]
    assert fp8.device_tokens == pytest.approx(2 * bf16.device_tokens, rel=0.01)
    assert bf16.device_tokens < bf16.working_set_tokens  # the 16-bit pool cannot hold the sessions
    assert fp8.device_hit_rate > bf16.device_hit_rate
    assert fp8.host_hit_rate == bf16.host_hit_rate == 0.0  # no host tier
    assert fp8.ttft_ms < bf16.ttft_ms


def test_a_host_tier_turns_misses_into_host_hits_under_each_engines_eviction() -> None:
    tier = "triton.kv_host_tier_gib_per_replica=64"
    without, with_tier = rows(pressure())[("bf16", 12)], rows(pressure(tier))[("bf16", 12)]
    assert with_tier.device_hit_rate == without.device_hit_rate
    assert with_tier.host_hit_rate > 0.3
    assert with_tier.ttft_ms < without.ttft_ms
    section = reuse(pressure(tier))
    assert "superset" in section.eviction and "PCIe Gen4 x16" in section.host_link
    # a host tier smaller than the device's free pool adds nothing where the host copies the device (vLLM), and
    # its own blocks where the device's evictions move there (TensorRT-LLM)
    small = "triton.kv_host_tier_gib_per_replica=2"
    vllm_small = rows(pressure(small))[("bf16", 12)]
    assert vllm_small.host_hit_rate == 0.0
    trt = rows(pressure(small, "build.backend=llmapi"))[("bf16", 12)]
    assert trt.host_hit_rate > 0.0
    assert "exclusive" not in reuse(pressure(small, "build.backend=llmapi")).eviction  # stated in its own words
    assert "different blocks" in reuse(pressure(small, "build.backend=llmapi")).eviction


def saturated(*more: str) -> Recipe:
    """Eight 30,000-token system prompts, eight sessions at once on one engine of an 8B on an L40S: the running sessions'
    blocks (8 x 30,000 + their questions and answers) outgrow the 16-bit device pool."""
    return recipe("vllm", "L40S", "bench.prefix.shared_tokens=30000", "bench.prefix.groups=8", "bench.concurrency=[8]",
                  *more, isl=30256, osl=1024)


def test_a_pool_smaller_than_the_running_sessions_holds_no_more_than_itself_and_queues_the_rest() -> None:
    # the device cannot keep resident more of the groups' prefixes than it holds (on main's code: 99% device hits on
    # a pool of 0.78 x the running sessions' blocks), and the sessions that do not fit wait for admission (vLLM's
    # allocate_slots returning None): the wait shrinks when host hits shorten the service
    without = rows(saturated())[("bf16", 8)]
    assert without.device_tokens < without.working_set_tokens
    assert without.device_hit_rate <= without.device_tokens / without.working_set_tokens
    tiered = rows(saturated("triton.kv_host_tier_gib_per_replica=64"))[("bf16", 8)]
    assert tiered.host_hit_rate > 0.9 and tiered.device_hit_rate == without.device_hit_rate
    assert tiered.ttft_ms < without.ttft_ms
    # the FP8 pool holds every running session: no wait, device hits; the 16-bit sessions recompute their prompts
    # and wait besides
    fp8 = rows(saturated())[("fp8", 8)]
    assert without.ttft_ms > 2 * fp8.ttft_ms_without_reuse
    assert fp8.device_tokens > fp8.working_set_tokens and fp8.device_hit_rate > 0.9
    assert fp8.ttft_ms < without.ttft_ms / 10


def test_no_reuse_where_the_engine_keeps_no_prefix_cache() -> None:
    r = recipe("vllm", "H100-80GB", "bench.prefix.shared_tokens=2048", "triton.enable_kv_cache_reuse=false")
    row = reuse(r).rows[0]
    assert row.device_hit_rate == row.host_hit_rate == 0.0
    assert row.ttft_ms == pytest.approx(row.ttft_ms_without_reuse)


def test_lru_share_and_block_floor() -> None:
    assert survives(100, 0) == 1.0 and survives(50, 100) == 0.5 and survives(200, 100) == 1.0
    assert survives(0, 100) == 0.0
    assert block_floor(2050, 16) == 2048 and block_floor(15, 16) == 0


def test_plan_estimate_prints_and_writes_the_section(capsys: pytest.CaptureFixture[str]) -> None:
    from trtkv.cli import main

    args = ["plan", "llama8b_fp8kv", "--estimate", "--no-aiconfigurator", "build.backend=vllm", "hardware.gpu=L40S",
            "bench.prefix.shared_tokens=1024", "bench.prefix.turns=2", "triton.kv_host_tier_gib_per_replica=16"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Prefix reuse (bench.prefix: 1 shared prefix(es) of 1,024 tokens, 2 turn(s)" in out
    assert "hit dev" in out and "PCIe Gen4 x16" in out
    assert main([*args, "--json"]) == 0
    section = json.loads(capsys.readouterr().out)["estimate"]["prefix_reuse"]
    assert section["rows"][0]["device_hit_rate"] > 0 and section["routing"].startswith("one replica")
