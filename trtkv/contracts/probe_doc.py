"""probe.json's model: `trtkv probe` writes it, the planner, report and printouts read it
(trtkv.measures.probe_results). Every part typed, its fields declared in the order the probe
writes them (trtkv.probe.sweep._document): a file this trtkv wrote is written back byte for byte."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, Field, JsonValue

from trtkv.contracts.artifacts import Artifact, Kept, LayerAmax


class ProbeRecord(Kept):
    """One format at one context length (trtkv.probe.metrics.length_record), keys as written."""

    format: str
    context_len: int
    kl_mean: float
    kl_last_quarter: float
    ppl: float
    ppl_ref: float
    ppl_delta: float
    top1_agreement: float
    needle_accuracy: float | None = None
    clip_rate: float | None = None  # static scales: share of K/V elements beyond their range
    k_clip_rate: float | None = None
    v_clip_rate: float | None = None
    kv_bytes_per_token: float  # measured on the quantized cache
    kv_bytes_per_token_formula: float
    bytes_vs_formula: float | None = None
    kv_semantics: str  # which runtime the format follows
    positions: int
    k_clip_rate_note: str | None = None
    fp16_window_tokens: int | None = None  # KIVI's full-precision window
    fp16_window_bytes_max: int | None = None
    attention: str = "cache_only"  # or an engine mode (trtkv.probe.attention); absent before them
    attention_engine: str | None = None
    attention_numerics: str | None = None
    needle_by_depth: dict[str, float] | None = None
    needle_seeds: int | None = None


class ProbeDrift(Kept):
    """Prefill vs decode of one format under one engine mode (trtkv.probe.attention.drift)."""

    format: str
    attention: str
    prompt_tokens: int
    decode_steps: int
    mean_abs_dlogp: float
    max_abs_dlogp: float
    kl_mean: float
    top1_agreement: float
    exact_zero: bool
    note: str | None = None  # not run: both kernels compute alike


class ProbeAttention(BaseModel):
    """The attention modes measured (trtkv.probe.attention), cache_only first, and why each ran."""

    modes: list[str]
    reasons: dict[str, str]


class ProbeScales(Kept):  # older probe.json files hold k_amax/v_amax lists here
    source: str
    layers: list[LayerAmax] = []


class ProbeModel(Kept):
    """The model probed: its source, then what trtkv.probe.setup loaded."""

    source: str
    model_dir: str
    device: str
    threads: int
    compute_dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None  # a windowed model's
    head_positions: int | None = None
    attn_implementation: str | None = None
    full_layers: list[int] | None = None
    device_map: dict[str, str] | None = None  # placed over GPUs (trtkv.probe.placement)


class ProbeDocSettings(Kept):
    """What the probe ran: formats, lengths, needles, decode steps, engine modes, RULER."""

    formats: list[str]
    lengths: list[int]
    needle_lengths: list[int]
    needle_depths: list[float]
    needle_seeds: int
    needle_method: str | None = None  # absent before the shared haystack
    decode_prompt: int
    decode_steps: int
    attention: list[str] | None = None  # absent before the engine modes
    dtype: str | None = None
    prefill_chunk: int | None = None
    ruler_tasks: list[str] | None = None  # with --ruler only
    ruler_lengths: list[int] | None = None
    ruler_samples: int | None = None


class ProbeNeedles(Kept):
    """One format at one needle length: accuracy per depth and over them (the trials left out)."""

    format: str
    context_len: int
    by_depth: dict[str, float]
    accuracy: float
    method: str | None = None  # asked from the KL pass (trtkv.probe.needles): its timings
    seconds: float | None = None
    cpu_seconds: float | None = None


class ReuseBand(Kept):
    from_: int = Field(alias="from")
    to: int
    clipped_elements: int
    kl_mean: float


class ReuseFormat(Kept):
    layers_exceeding_range_k: int
    layers_exceeding_range_v: int
    max_observed_over_range_k: float
    max_observed_over_range_v: float
    by_position: list[ReuseBand]


class ReuseDecode(Kept):
    prompt_tokens: int
    decode_steps: int
    clip_rate_prompt: float
    clip_rate_decode: float
    kl_decode_first_half: float
    kl_decode_second_half: float
    kl_per_step: list[float]


class ProbeScaleReuse(Kept):
    """Short-prompt static scales at long context and through decode (trtkv.probe.metrics)."""

    scales_source: str
    formats: dict[str, ReuseFormat]
    decode: dict[str, ReuseDecode]


class RulerCell(Kept):
    score: float  # RULER's, in percent
    mean: float
    interval: list[float]
    n: int
    all_found: int
    failed: int
    tokens: dict[str, int | float]  # min, mean, max of input + output tokens


class RulerLength(Kept):
    average: float
    tasks: dict[str, RulerCell]


class RulerFormat(Kept):
    """One format's RULER answers: the bench's summary (trtkv.bench.tasks.ruler), the probe's."""

    accuracy: float
    # `interval` in files of trtkv before 2026-12-08
    accuracy_ci: list[float] = Field(validation_alias=AliasChoices("accuracy_ci", "interval"))
    confidence: float
    correct: int
    total: int
    failed: int
    metric: str
    ruler_commit: str
    by_length: dict[str, RulerLength]
    items: list[dict[str, JsonValue]]  # id, score, prediction, stop, generated
    answered: int
    shared_prefix_tokens: int
    seconds: float
    wall_seconds: float
    generated_tokens: int


class RulerBelow(Kept):
    format: str
    task: str
    length: int
    score: float
    reference_score: float


class ProbeRuler(Kept):
    """RULER on the bench's items through each format's cache (trtkv.probe.ruler.run_ruler)."""

    ruler_commit: str
    seed: int
    metric: str
    confidence: float
    tasks: list[str]
    lengths: list[int]
    samples: int
    tokenizer: str
    reference: str
    notes: list[str]
    items: list[dict[str, JsonValue]]  # what was asked: id, task, length, tokens, answers
    formats: dict[str, RulerFormat]
    below_reference: list[RulerBelow]


class KLByPosition(Kept):
    window: int
    curves: dict[str, list[float]]


class ProbeDoc(Artifact):
    """probe.json of `trtkv probe`: the model, settings, records per format and length, engine
    attention, drift, needles, scale reuse, RULER."""

    FILE = "probe.json"
    WRITTEN_BY = "`trtkv probe`"
    WRITE_DEFAULTS = False  # a record's optional keys: where the probe wrote them

    recipe: str
    seconds: float | None = None
    records: list[ProbeRecord] = []  # cache-only: the stored cache in full-precision attention
    scales: ProbeScales | None = None
    attention: ProbeAttention | None = None  # absent from files written before the engine modes
    attention_records: list[ProbeRecord] = []
    drift: list[ProbeDrift] = []
    model: ProbeModel
    created_at: str | None = None
    versions: dict[str, str] = {}
    settings: ProbeDocSettings
    reference: str = "fp16"  # the 16-bit format every KL is taken against
    method_version: int | None = None
    needles: list[ProbeNeedles] = []
    scale_reuse: ProbeScaleReuse | None = None
    pass_seconds: dict[str, float] = {}
    kv_stats: dict[str, JsonValue] | None = None  # trtkv.kvcache.stats.KVStats.to_dict
    threads: int | None = None  # torch's thread count (before 2026-12-08 OMP_NUM_THREADS as set)
    ruler: ProbeRuler | None = None  # with --ruler
    kl_by_position: KLByPosition | None = None
    plots: list[str] = []
