"""Planned against served: the KV pool the running engine reports beside the one `trtkv plan` sized
(handed in as trtkv.contracts.PlanFigures).

The backend reads its engine's own figure (trtkv.backends.seam.MemoryRule.served: vLLM's /metrics
vllm:cache_config_info num_gpu_blocks x block_size, SGLang's /get_server_info max_total_num_tokens,
TensorRT-LLM's 'Allocated X GiB for max tokens in paged KV cache' log line, the reference runtime's
own line). A served pool more than SHORTFALL below the plan is a warning: the engine then holds
fewer sequences than the plan's counts (something else holds memory on the GPU, or the engine's rule
moved under a new release). `trtkv status` prints it; `trtkv bench` writes it into results.json
("kv_pool", and "warnings").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trtkv.contracts.artifacts import ServerRecord
from trtkv.contracts.plan_figures import PlanFigures
from trtkv.core.readback import ReadBackError
from trtkv.recipe import Recipe
from trtkv.units import GIB

SHORTFALL = 0.10  # served below (1 - SHORTFALL) x planned: a warning


def compare(recipe: Recipe, server: ServerRecord | None, planned: PlanFigures) -> dict[str, Any]:
    """{"planned_bytes_per_gpu", "served_bytes_per_gpu", "served_tokens", "source",
    "served_over_planned", "warning", "rule"} for the recipe's recorded server against its plan
    (`planned`: trtkv.plan.figures); "served_*" None when the engine reported nothing readable."""
    from trtkv.backends import for_recipe

    planned_bytes = planned.kv_pool_bytes_per_gpu
    out: dict[str, Any] = {
        "planned_bytes_per_gpu": planned_bytes,
        "rule": planned.rule,
        "served_bytes_per_gpu": None,
        "served_tokens": None,
        "source": None,
        "served_over_planned": None,
        "warning": None,
    }
    rule = for_recipe(recipe).memory
    if server is None or rule is None or rule.served is None:
        out["source"] = "no server recorded" if server is None else "the backend reports no pool"
        return out
    http = f"http://{server.client_host}:{server.http_port}"
    log, refused = served_log(recipe, server)
    try:
        served = rule.served(recipe, http, log)
    except ReadBackError as exc:  # a bad figure is one line naming its source, never a number
        out["source"] = f"not read: {exc}"
        return out
    if served is None:
        out["source"] = refused or "the engine has not reported its pool (yet)"
        return out
    out.update(
        served_bytes_per_gpu=served.pool_bytes, served_tokens=served.tokens, source=served.source
    )
    if served.pool_bytes is not None and planned_bytes > 0:
        ratio = served.pool_bytes / planned_bytes
        out["served_over_planned"] = ratio
        if ratio < 1 - SHORTFALL:
            out["warning"] = (
                f"the served KV pool ({served.pool_bytes / GIB:.2f} GiB per GPU, {served.source}) "
                f"is {(1 - ratio) * 100:.0f}% below the plan's {planned_bytes / GIB:.2f} "
                f"GiB ({out['rule']}'s rule): the engine holds fewer sequences than `trtkv plan` "
                "counts. Next: check what else holds memory on the GPU, or pin the pool "
                f"(triton.kv_pool_gib_per_gpu)"
            )
    return out


def compare_at(recipe: Recipe, url: str | None, planned: PlanFigures) -> dict[str, Any]:
    """`compare` for `trtkv bench`: the recorded server's pool only when the bench measured that
    server (`url` None, or its host and port the record's exactly) and the record's process still
    runs (its pid and start time, trtkv.serving.teardown.running); else no figure, saying why."""
    from trtkv.recipe.layout import serve_dir
    from trtkv.serving.teardown import running

    server = ServerRecord.load(serve_dir(recipe))
    if server is not None and url and not measured(server, url):
        out = compare(recipe, None, planned)
        out["source"] = (
            f"not read: --url {url[:200]!r} is not the recorded server ({server.host}:"
            f"{server.http_port})"
        )
        return out
    if server is not None and not running(server):
        out = compare(recipe, None, planned)
        out["source"] = f"not read: the recorded server (pid {server.pid}) is not running"
        return out
    return compare(recipe, server, planned)


def measured(server: ServerRecord, url: str) -> bool:
    """Whether `url` (HOST:PORT, with or without a scheme) names the recorded server: the host is
    the record's (or where a client on this machine reaches it) and the port one of its ports."""
    text = url.split("://", 1)[-1].rstrip("/")
    try:
        parts = urlsplit("//" + text)
        host, port = parts.hostname, parts.port
    except ValueError:
        return False
    hosts = {server.host.lower(), server.client_host.lower()}
    return (host or "127.0.0.1") in hosts and port in {server.http_port, server.grpc_port} - {0}


def served_log(recipe: Recipe, server: ServerRecord) -> tuple[Path | None, str]:
    """The record's log when it is a file directly in the recipe's serve/ folder and not a symbolic
    link (docs/security.md), else None and why it is not read."""
    from trtkv.recipe.layout import serve_dir
    from trtkv.serving.teardown import own_file

    log = own_file(server.log, serve_dir(recipe))
    if server.log and log is None:
        return None, (
            f"not read: server.json's log {server.log[:200]!r} is not a file directly in "
            f"{serve_dir(recipe)} (or is a symbolic link)"
        )
    return log, ""


def describe(result: dict[str, Any]) -> str:
    """One line for `trtkv status`."""
    planned = result["planned_bytes_per_gpu"] / GIB
    if result["served_bytes_per_gpu"] is None:
        tokens = f" ({result['served_tokens']:,} tokens)" if result.get("served_tokens") else ""
        return (
            f"KV pool per GPU: planned {planned:.2f} GiB ({result['rule']}); served: "
            f"{result['source']}{tokens}"
        )
    served = result["served_bytes_per_gpu"] / GIB
    tokens = f", {result['served_tokens']:,} tokens" if result.get("served_tokens") else ""
    ratio = result.get("served_over_planned")
    ratio_text = f"; served/planned {ratio:.3f}" if ratio is not None else ""
    line = (
        f"KV pool per GPU: planned {planned:.2f} GiB ({result['rule']}), served {served:.2f} "
        f"GiB{tokens} ({result['source']}{ratio_text})"
    )
    return line + (f"\n  WARNING: {result['warning']}" if result.get("warning") else "")
