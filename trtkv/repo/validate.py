"""Check a generated Triton model repository before anything uses it.

Every `config.pbtxt` is parsed with Triton's own protobuf schema
(`tritonclient.grpc.model_config_pb2` + `google.protobuf.text_format`), no `${...}` placeholder may
remain, and the ensemble is checked against the models it calls: each mapped tensor exists with the
same dtype and compatible dims, every required input is fed, every internal tensor is produced
before it is read, and decoupled is set consistently. Each problem names the file, the line and the
field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from trtkv.core.errors import StageError

PLACEHOLDER = re.compile(r"\$\{[^}]*\}?")


class RepoError(StageError):
    """A generated repository that Triton would reject or serve wrongly; carries every problem
    found."""

    def __init__(self, repo: Path, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            f"Triton model repository {repo} is not valid, found {self.listing(self.problems)}\n"
            "Next: fix the template or recipe value named above and rerun `trtkv repo "
            "--force`."
        )


@dataclass
class ModelFile:
    """One parsed config.pbtxt with its text (for line numbers)."""

    path: Path
    text: str
    config: Any  # model_config_pb2.ModelConfig

    def line_of(self, *needles: str, after: int = 0) -> int:
        """1-based line of the first line (from line `after`) containing every needle; `after` or 1
        when none."""
        for number, line in enumerate(self.text.splitlines()[after:], start=after + 1):
            if all(n in line for n in needles):
                return number
        return max(after, 1)


@dataclass
class Tensor:
    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False


@dataclass
class Report:
    models: dict[str, ModelFile] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add(self, path: Path, line: int, where: str, message: str) -> None:
        self.problems.append(f"{path}:{line}: {where}: {message}")


def parse_config(path: Path, report: Report) -> ModelFile | None:
    """Parse one config.pbtxt with Triton's schema; problems go to `report`."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), start=1):
        for match in PLACEHOLDER.finditer(line):
            report.add(path, number, "placeholder", f"unfilled template value {match.group(0)!r}")
    try:
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        line_no = int(exc.GetLine() or 1)
        column = exc.GetColumn() or 0
        message = str(exc).split(" : ", 1)[-1]
        field_name = _field_near(text, line_no)
        report.add(
            path,
            line_no,
            f"column {column}, field {field_name}",
            f"not valid for Triton's ModelConfig: {message}",
        )
        return None
    return ModelFile(path, text, config)


def _field_near(text: str, line: int) -> str:
    """The field name written on `line` (for parse errors), or '?'."""
    lines = text.splitlines()
    if 0 < line <= len(lines):
        match = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*:", lines[line - 1])
        if match:
            return match.group(1)
    return "?"


def tensors(model: ModelFile, kind: str) -> dict[str, Tensor]:
    from tritonclient.grpc import model_config_pb2

    out = {}
    for t in getattr(model.config, kind):
        dtype = model_config_pb2.DataType.Name(t.data_type)
        out[t.name] = Tensor(t.name, dtype, tuple(t.dims), bool(getattr(t, "optional", False)))
    return out


def dims_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Same rank and each dimension equal, or -1 (variable) on either side."""
    return len(a) == len(b) and all(
        x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=False)
    )


def decoupled(model: ModelFile) -> bool:
    return bool(model.config.model_transaction_policy.decoupled)


def check_model(model: ModelFile, folder: str, report: Report) -> None:
    """Name matches the folder, a version folder exists, a Python model has a compilable
    model.py."""
    cfg, path = model.config, model.path
    add = partial(report.add, path)
    if cfg.name != folder:
        add(model.line_of("name:"), "name", f"{cfg.name!r} must equal its folder name {folder!r}")
    if not cfg.backend and not cfg.platform:
        add(1, "backend", "neither backend nor platform is set")
    versions = [p for p in path.parent.iterdir() if p.is_dir() and p.name.isdigit()]
    if not versions:
        add(1, "version", f"no version folder (e.g. {path.parent / '1'}) next to the config")
    if cfg.backend == "python":
        for version in versions:
            script = version / "model.py"
            if not script.is_file():
                add(model.line_of("backend:"), "backend", f"python model without {script}")
                continue
            try:
                compile(script.read_text(encoding="utf-8"), str(script), "exec")
            except SyntaxError as exc:
                report.add(script, exc.lineno or 1, "python", f"syntax error: {exc.msg}")


def check_ensemble(ensemble: ModelFile, models: dict[str, ModelFile], report: Report) -> None:
    """Every step's maps against the called model's inputs/outputs and the ensemble's own
    tensors."""
    path = ensemble.path
    inputs, outputs = tensors(ensemble, "input"), tensors(ensemble, "output")
    # tensor name -> (producer's tensor, producing step)
    internal: dict[str, tuple[Tensor, str]] = {}
    produced: set[str] = set()
    for step in ensemble.config.ensemble_scheduling.step:
        name = step.model_name
        step_line = ensemble.line_of(f'"{name}"', "model_name")
        target = models.get(name)
        if target is None:
            why = f"calls {name!r}, which is not in the repository ({', '.join(sorted(models))})"
            report.add(path, step_line, "ensemble_scheduling.step.model_name", why)
            continue
        if ensemble.config.max_batch_size > target.config.max_batch_size:
            theirs = f"{name}'s {target.config.max_batch_size} ({target.path})"
            why = f"{ensemble.config.max_batch_size} exceeds {theirs}"
            report.add(path, ensemble.line_of("max_batch_size"), "max_batch_size", why)
        model_in, model_out = tensors(target, "input"), tensors(target, "output")
        for key, value in step.input_map.items():
            line = ensemble.line_of(f'"{key}"', f'"{value}"', after=step_line - 1)
            bad = partial(report.add, path, line, f"step {name} input_map {key}")
            dest = model_in.get(key)
            if dest is None:
                listed = ", ".join(model_in)
                bad(f"{name} has no input {key!r} ({target.path}); its inputs: {listed}")
                continue
            source = inputs.get(value) or (internal[value][0] if value in internal else None)
            if source is None:
                bad(f"{value!r} is neither an ensemble input nor produced by an earlier step")
                continue
            _compare(bad, source, dest, target.path)
            if value in inputs and not dest.optional and inputs[value].optional:
                bad(f"ensemble input {value!r} is optional but {name}'s {key!r} is required")
        for tensor_name, tensor in model_in.items():
            if not tensor.optional and tensor_name not in step.input_map:
                why = f"required input {tensor_name!r} of {name} is not mapped"
                report.add(path, step_line, f"step {name} input_map", why)
        for key, value in step.output_map.items():
            line = ensemble.line_of(f'"{key}"', f'"{value}"', after=step_line - 1)
            bad = partial(report.add, path, line, f"step {name} output_map {key}")
            src = model_out.get(key)
            if src is None:
                listed = ", ".join(model_out)
                bad(f"{name} has no output {key!r} ({target.path}); its outputs: {listed}")
                continue
            if value in outputs:
                _compare(bad, src, outputs[value], path)
            elif value in internal:
                bad(f"{value!r} is already produced by step {internal[value][1]}")
            else:
                internal[value] = (src, name)
            produced.add(value)
    for output in outputs:
        if output not in produced:
            line = ensemble.line_of(f'"{output}"')
            report.add(path, line, f"output {output}", "no step produces this ensemble output")


def _compare(bad: Callable[[str], None], src: Tensor, dest: Tensor, other: Path) -> None:
    """A mapped tensor's dtype and dims against its other end's; each mismatch goes to `bad`."""
    theirs = f"{dest.name!r} ({other})"
    if src.dtype != dest.dtype:
        bad(f"dtype {src.dtype} of {src.name!r} does not match {dest.dtype} of {theirs}")
    if not dims_compatible(src.dims, dest.dims):
        bad(f"dims {list(src.dims)} of {src.name!r} do not match {list(dest.dims)} of {theirs}")


def check_decoupled(
    models: dict[str, ModelFile], expect_decoupled: bool | None, report: Report
) -> None:
    """tensorrt_llm (and the BLS model) follow the recipe; pre/postprocessing answer once; ensembles
    set nothing."""
    wrong: list[tuple[ModelFile, str, str]] = []  # (model, field, problem), in this order
    field_name = "model_transaction_policy.decoupled"
    llm = models.get("tensorrt_llm")
    if llm is not None and expect_decoupled is not None and decoupled(llm) != expect_decoupled:
        why = f"{decoupled(llm)} but the recipe's triton.decoupled is {expect_decoupled}"
        wrong.append((llm, field_name, why))
    bls = models.get("tensorrt_llm_bls")
    if bls is not None and llm is not None and decoupled(bls) != decoupled(llm):
        why = f"{decoupled(bls)} differs from tensorrt_llm's {decoupled(llm)}"
        wrong.append((bls, field_name, why))
    for name in ("preprocessing", "postprocessing"):
        model = models.get(name)
        if model is not None and decoupled(model):
            wrong.append(
                (model, field_name, f"{name} must answer each request once (not decoupled)")
            )
    for model in models.values():
        if model.config.platform == "ensemble" and model.config.HasField(
            "model_transaction_policy"
        ):
            why = "an ensemble takes decoupled from its steps; remove this block"
            wrong.append((model, "model_transaction_policy", why))
    for model, where, why in wrong:
        report.add(model.path, model.line_of("decoupled"), where, why)


def validate_repo(repo: Path, expect_decoupled: bool | None = None) -> dict[str, ModelFile]:
    """Parse and cross-check every model under `repo`; raises RepoError listing every problem."""
    report = Report()
    configs = sorted(repo.glob("*/config.pbtxt"))
    if not configs:
        raise RepoError(repo, [f"{repo}: no <model>/config.pbtxt found"])
    for path in configs:
        model = parse_config(path, report)
        if model is not None:
            report.models[path.parent.name] = model
            check_model(model, path.parent.name, report)
    for model in report.models.values():
        if model.config.platform == "ensemble":
            check_ensemble(model, report.models, report)
    check_decoupled(report.models, expect_decoupled, report)
    if report.problems:
        raise RepoError(repo, report.problems)
    return report.models


def check_model_yaml(repo: Path, expect_decoupled: bool) -> dict[str, Any]:
    """The llmapi layout's tensorrt_llm/1/model.yaml: a mapping with `model` and a triton_config
    whose decoupled is the recipe's (TensorRT-LLM's model.py reads max_batch_size and decoupled from
    there)."""
    import yaml

    path = repo / "tensorrt_llm" / "1" / "model.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RepoError(repo, [f"{path}: not readable as YAML ({exc})"]) from exc
    problems = []
    if not isinstance(data, dict) or not data.get("model"):
        problems.append(f"{path}: no `model` (the HF checkpoint the LLM loads)")
        data = data if isinstance(data, dict) else {}
    triton = data.get("triton_config")
    if not isinstance(triton, dict) or {"max_batch_size", "decoupled"} - set(triton):
        problems.append(
            f"{path}: triton_config needs max_batch_size and decoupled (upstream's model.py reads "
            "both)"
        )
    elif bool(triton["decoupled"]) != expect_decoupled:
        problems.append(
            f"{path}: triton_config.decoupled {triton['decoupled']} but the recipe's "
            f"triton.decoupled is {expect_decoupled}"
        )
    if problems:
        raise RepoError(repo, problems)
    return data
