"""The KV scale audit's record (trtkv.engines.kv_scale_audit builds it): findings, what each
engine uses per layer, the stored scales per layer, and the words the report uses for them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

FAIL, WARN, INFO = "fail", "warn", "info"
USE_WORDS = {
    "separate": "its K and V scales",
    "unity": "1.0",
    "unused": "1.0 (scales never read)",
    "k_for_both": "K's scale for K and V",
    "shared": "one shared K/V scale",
    "crash": "a crash at load",
    "unknown": "what its loader does is not modelled",
}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str  # fail, warn, info
    message: str
    layers: tuple[int, ...] = ()
    engine: str | None = None


@dataclass(frozen=True)
class EngineLayer:
    """What one engine uses on one layer."""

    layer: int
    uses: str  # separate, unity, k_for_both, shared, crash, unused
    k: float | None
    v: float | None
    dropped: tuple[str, ...] = ()  # tensor names its loader drops or refuses
    error: str | None = None
    warning: str | None = None


@dataclass(frozen=True)
class EngineVerdict:
    engine: str
    version: str
    applies: bool  # the engine reads this checkpoint's format
    loader: str
    summary: str
    layers: tuple[EngineLayer, ...] = ()


@dataclass(frozen=True)
class LayerRow:
    layer: int
    scales: dict[str, float | None]  # kind -> the stored scale (max over a per-head tensor)
    names: tuple[str, ...]
    kv_ratio: float | None


@dataclass
class Audit:
    folder: str
    format: str
    architecture: str | None
    kv_algo: str | None
    conventions: list[str]
    rows: list[LayerRow]
    engines: list[EngineVerdict]
    findings: list[Finding] = field(default_factory=list)
    clip: dict | None = None  # --calibrate's result (trtkv.calibrate.scale_clip)

    @property
    def exit_code(self) -> int:
        return 1 if any(f.severity == FAIL for f in self.findings) else 0

    def to_dict(self) -> dict:
        return {**asdict(self), "exit_code": self.exit_code}


def span_layers(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> "layers 0-2, 5"; [3] -> "layer 3"."""
    out: list[str] = []
    for i in sorted(layers):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(out)
