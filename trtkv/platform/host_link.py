"""Each GPU's link to host memory (PCIe generation and width, or NVLink-C2C), the link a host KV
tier's blocks cross when a reused prefix is loaded back (trtkv.plan.prefix_reuse prices that copy).
The figures and their sources are data: trtkv/data/host_links.json. Light: json only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from trtkv.platform.hardware import GPU

DATA = Path(__file__).resolve().parents[1] / "data" / "host_links.json"


@dataclass(frozen=True)
class HostLink:
    """One GPU's host link, one direction."""

    name: str  # e.g. "PCIe Gen5 x16"
    peak_gb_per_s: float  # the link's own figure, GB/s (10^9 bytes)
    measured_gb_per_s: float | None  # a published copy benchmark's, where there is one
    share: int  # GPUs that split the link (GB200: 2 per Grace)
    source: str  # the link's figures and the GPU's link, with their sources

    @property
    def gb_per_s(self) -> float:
        """What one GPU's copies get: the measured figure where there is one, else the peak, over
        the GPUs that share the link."""
        return (self.measured_gb_per_s or self.peak_gb_per_s) / self.share

    @property
    def basis(self) -> str:
        """Which figure gb_per_s is, as the plan says it."""
        what = "measured" if self.measured_gb_per_s else "peak"
        split = f", split over {self.share} GPUs" if self.share > 1 else ""
        return f"{self.name}, {self.gb_per_s:g} GB/s per direction ({what}{split})"


@lru_cache(maxsize=1)
def load(path: Path = DATA) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def host_link_of(gpu: GPU) -> HostLink | None:
    """The GPU's host link (None: none in the table, e.g. the CPU or GB10's unified memory)."""
    data = load()
    row = data["gpus"].get(gpu.value)
    if row is None:
        return None
    link = data["links"][row["link"]]
    return HostLink(
        link["name"],
        float(link["peak_gb_per_s"]),
        None if link["measured_gb_per_s"] is None else float(link["measured_gb_per_s"]),
        int(row.get("share", 1)),
        f"{row['source']}; {link['source']}",
    )
