"""Fields that land in commands and READMEs take only what they name: triton.host an IP or RFC 1123 host name,
build.tensorrt_llm_version a whole version from the matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtkv.core.errors import RecipeError
from trtkv.platform import versions
from trtkv.recipe import load_recipe

from .conftest import Writer

GOOD_HOSTS = ["127.0.0.1", "0.0.0.0", "10.0.0.5", "::1", "::", "2001:db8::8a2e:370:7334", "localhost",
              "node-1.cluster.local", "Triton.Example.COM", "a" * 63 + ".x"]
BAD_HOSTS = ["127.0.0.1; rm -rf ~", "$(id)", "host name", "-leading", "trailing-", "a..b", "1.2.3.999", "1234",
             "a" * 64, ".".join(["a" * 63] * 4) + ".aa", "fe80::1%$(id)", "", "https://x", "x:80"]


def host_problem(path: Path, host: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path), [f"triton.host={host!r}"])
    return [p for p in info.value.problems if ": triton.host:" in p]


@pytest.mark.parametrize("host", GOOD_HOSTS)
def test_good_hosts(write: Writer, good: str, host: str) -> None:
    assert load_recipe(str(write(good)), [f"triton.host={host!r}"]).triton.host == host


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_bad_hosts_list_what_is_allowed(write: Writer, good: str, host: str) -> None:
    (problem,) = host_problem(write(good), host)
    assert "must be an IP address (v4 or v6" in problem and "RFC 1123 host name" in problem, problem


def test_tensorrt_llm_version_matches_whole(write: Writer, good: str) -> None:
    path = write(good)
    for known in [*versions.supported_trtllm(), *(row.tensorrt_llm for row in versions.rows())]:
        assert load_recipe(str(path), [f"build.tensorrt_llm_version={known!r}"]).build.tensorrt_llm_version == known
    for bad in ["1.2.1$(touch X)", "1.2.1 ", "1.2.10", "1.2.1.post1", "1.2", "v1.2.1"]:
        with pytest.raises(RecipeError) as info:
            load_recipe(str(path), [f"build.tensorrt_llm_version={bad!r}"])
        (problem,) = [p for p in info.value.problems if ": build.tensorrt_llm_version:" in p]
        assert "the whole version must match" in problem, problem
        assert f"Allowed: {', '.join(versions.supported_trtllm())} (or the NGC build 1.0.3.2510)" in problem, problem
