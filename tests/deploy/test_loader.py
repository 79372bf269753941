"""The loader Job that fills the models volume (no `kubectl cp`): its source forms and refusals, and its script and the
servers' wait for its marker run here for real (an NFS-style copy, the volume's /models and /source moved into a
temporary folder): the marker comes last, a failed or empty copy leaves none, and a server waits for exactly its load."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.planned import deploy
from trtkv.core.errors import StageError
from trtkv.deploy import Options, Target, loader, pods
from trtkv.recipe import load_recipe


@pytest.mark.parametrize("text, kind, host, path, revision", [
    ("s3://my-bucket/trtkv/llama", "s3", "my-bucket", "trtkv/llama", None),
    ("s3://my-bucket", "s3", "my-bucket", "", None),
    ("gs://models.example/a/b/", "gs", "models.example", "a/b", None),
    ("nfs://nas-1.lan/export/models/llama", "nfs", "nas-1.lan", "/export/models/llama", None),
    ("hf://nvidia/Llama-3.3-70B-Instruct-FP8@a1b2c3", "hf", "nvidia", "Llama-3.3-70B-Instruct-FP8", "a1b2c3"),
])
def test_sources_parse(text: str, kind: str, host: str, path: str, revision: str | None) -> None:
    src = loader.parse_source(text)
    assert (src.kind.value, src.host, src.path, src.revision) == (kind, host, path, revision)


@pytest.mark.parametrize("text, rule", [
    ("http://x/y", "is not one of"), ("file:///models", "is not one of"), ("s3:/my-bucket/x", "is not one of"),
    ("s3://b/x", "3-63 characters"), ("s3://my-bucket/$(touch x)", "._~/@"), ("s3://my-bucket/a b", "._~/@"),
    ("s3://my-bucket/x;y", "._~/@"), ("nfs://nas", "export path is absolute"), ("hf://org", "ORG/NAME"),
])
def test_sources_refused(text: str, rule: str) -> None:
    with pytest.raises(StageError, match=re.escape(rule)):
        loader.parse_source(text)


@pytest.mark.parametrize("text", [
    "s3://ab+cd/x",  # before: read as bucket `ab`, path `+cd/x`
    "s3://" + "a" * 64 + "/x",  # before: cut to the first 63 characters, the rest read as the path
    "s3://" + "a" * 64,
    "s3://My-Bucket/x", "s3://my_bucket/x", "s3://-bucket/x", "s3://bucket-/x", "s3://my..bucket/x",
    "s3://192.168.5.4/x", "s3://xn--bucket/x", "s3://bucket-s3alias/x", "s3://ab/x", "s3://a+b@c/x",
])
def test_s3_buckets_are_read_whole_by_aws_naming_rule(text: str) -> None:
    """The bucket is everything up to the first `/`, checked whole: never a prefix of what was typed."""
    with pytest.raises(StageError) as err:
        loader.parse_source(text)
    assert loader.S3_BUCKET_RULE in str(err.value) and repr(text) in str(err.value)


@pytest.mark.parametrize("text, rule", [
    ("gs://Bucket/x", loader.GS_BUCKET_RULE), ("gs://goog-models/x", loader.GS_BUCKET_RULE),
    ("gs://my-google-models/x", loader.GS_BUCKET_RULE), ("gs://" + "a" * 64 + "/x", loader.GS_BUCKET_RULE),
    ("gs://a+b/x", loader.GS_BUCKET_RULE), ("hf://org--x/name", loader.HF_NAME_RULE),
    ("hf://org/na..me", loader.HF_NAME_RULE), ("hf://org/" + "n" * 97, loader.HF_NAME_RULE),
    ("hf://org/name@../x", loader.HF_NAME_RULE), ("hf://-org/name", loader.HF_NAME_RULE),
    ("nfs://-nas/export", loader.NFS_RULE), ("nfs://nas/export/../etc", loader.NFS_RULE),
    ("nfs://nas_1/export", loader.NFS_RULE), ("nfs://" + "n" * 64 + "/export", loader.NFS_RULE),
])
def test_other_sources_keep_their_providers_rules(text: str, rule: str) -> None:
    with pytest.raises(StageError) as err:
        loader.parse_source(text)
    assert rule in str(err.value) and repr(text) in str(err.value)


@pytest.mark.parametrize("text, host", [
    ("s3://" + "a" * 63 + "/x", "a" * 63), ("s3://abc", "abc"), ("s3://my.bucket-1/x", "my.bucket-1"),
    ("gs://my_bucket/x", "my_bucket"), ("gs://" + ".".join(["a" * 60] * 3) + "/x", ".".join(["a" * 60] * 3)),
    ("nfs://10.0.0.5/export", "10.0.0.5"), ("nfs://[fd00::5]/export", "[fd00::5]"),
])
def test_names_at_the_rules_edges_are_read_whole(text: str, host: str) -> None:
    assert loader.parse_source(text).host == host


HUB = "hf://nvidia/Llama-3.3-70B-Instruct-FP8"


def test_a_hub_id_fills_only_an_hf_export(tmp_path: Path) -> None:
    out = deploy(load_recipe("llama70b_fp8kv_llmapi", ["build.backend=vllm"]), Target.K8S, tmp_path / "v",
                 log=lambda _m: None, options=Options(model_source=HUB, model_size_gib=70.0))
    assert "snapshot_download" in (out / "models.yaml").read_text()
    with pytest.raises(StageError, match="a hub repository holds an HF export"):
        deploy(load_recipe("llama70b_fp8kv"), Target.K8S, tmp_path / "t", log=lambda _m: None,
               options=Options(model_source=HUB, model_size_gib=70.0))


@pytest.mark.parametrize(("name", "offered"), [("llama70b_fp8kv_llmapi", "vllm or sglang"),
                                               ("llama70b_fp8kv", "vllm or sglang")])
def test_the_hub_refusal_offers_only_other_backends_that_serve_the_hf_export_alone(tmp_path: Path, name: str,
                                                                                 offered: str) -> None:
    """Issue 51: on main an llmapi recipe was told to use "build.backend vllm, sglang or llmapi", its own backend,
    which on k8s serves through the Triton repository too."""
    recipe = load_recipe(name)
    with pytest.raises(StageError, match="a hub repository holds an HF export") as err:
        deploy(recipe, Target.K8S, tmp_path / "t", log=lambda _m: None,
               options=Options(model_source=HUB, model_size_gib=70.0))
    text = str(err.value)
    assert f"(build.backend {offered})." in text and f"build.backend {recipe.build.backend.value}) also reads" in text
    assert "llmapi)" not in text.split("Next:")[1]


@pytest.mark.parametrize("name", ["llama70b_fp8kv_attnhead_vllm", "llama70b_fp8kv_sglang"])
def test_a_hub_load_installs_nothing_at_run_time(name: str, tmp_path: Path) -> None:
    """Before: the Job ran `pip install huggingface_hub` in python:3.12-slim, which fails on a cluster without egress
    to PyPI. Now it runs in the server's own image (which loads HF models with huggingface_hub), installing
    nothing."""
    recipe = load_recipe(name)
    out = deploy(recipe, Target.K8S, tmp_path / "k", log=lambda _m: None,
                 options=Options(model_source=HUB, model_size_gib=70.0))
    models = {d["kind"]: d for d in yaml.safe_load_all((out / "models.yaml").read_text()) if d}
    server = next(d for d in yaml.safe_load_all((out / "server.yaml").read_text())
                  if d and d["kind"] in ("Deployment", "LeaderWorkerSet"))
    spec = server["spec"]["template"]["spec"] if server["kind"] == "Deployment" else \
        server["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    loader_c = models["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert loader_c["image"] == spec["containers"][0]["image"]
    script = loader_c["command"][2]
    assert "pip" not in script and "PYTHONPATH" not in script and "snapshot_download" in script
    assert not [e for e in loader_c["env"] if e["name"].startswith("PIP")]
    mirrored = deploy(recipe, Target.K8S, tmp_path / "m", log=lambda _m: None,
                      options=Options(model_source=HUB, model_size_gib=70.0, loader_image="mirror.example/hub:1"))
    assert "image: mirror.example/hub:1" in (mirrored / "models.yaml").read_text()


def test_the_hub_call_imports_where_vllm_is_installed() -> None:
    """The loader's python line needs only huggingface_hub, which vLLM depends on: its import checked in trtkv's vLLM
    venv (the packages the vLLM image ships)."""
    venv = Path(__file__).parents[2] / ".venv-vllm" / "bin" / "python"
    if not venv.exists():
        pytest.skip("no .venv-vllm here (make install-vllm)")
    done = subprocess.run([str(venv), "-c", "from huggingface_hub import snapshot_download"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_hub_volume_is_sized_for_what_the_repository_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the volume followed the planned export whatever the hub repository held. Now: --model-size, else the
    total_size of the export's index built here, else a refusal that says what to pass."""
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    recipe = load_recipe("llama70b_fp8kv_attnhead_vllm")
    with pytest.raises(StageError, match="--model-size GIB"):
        deploy(recipe, Target.K8S, tmp_path / "a", log=lambda _m: None, options=Options(model_source=HUB))
    index = tmp_path / "engines" / recipe.name / "checkpoint" / "hf" / "model.safetensors.index.json"
    index.parent.mkdir(parents=True)
    index.write_text(json.dumps({"metadata": {"total_size": 150 * 2**30}, "weight_map": {}}))
    out = deploy(recipe, Target.K8S, tmp_path / "b", log=lambda _m: None, options=Options(model_source=HUB))
    assert "storage: 385Gi" in (out / "models.yaml").read_text()  # 2 x (150 x 1.25 + 5)
    assert json.loads((out / "sizing.json").read_text())["source_gib"] == 150.0
    given = deploy(recipe, Target.K8S, tmp_path / "c", log=lambda _m: None,
                   options=Options(model_source=HUB, model_size_gib=40.0))
    assert "storage: 110Gi" in (given / "models.yaml").read_text()  # 2 x (40 x 1.25 + 5)


def test_a_hub_volume_for_a_checkpoint_used_as_stored_is_sized_from_its_weights(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 51: a pre-quantized checkpoint used as stored (quantization.weights none, model.checkpoint_quant) is
    what the hub repository holds, and `trtkv init` counted its weights as stored (model.checkpoint_weights_gib, from
    its safetensors headers): the volume follows them. Before: refused for want of --model-size or a built export."""
    monkeypatch.setenv("TRTKV_ENGINES", str(tmp_path / "engines"))
    recipe = load_recipe("llama70b_fp8kv_attnhead_vllm", ["quantization.weights=none", "model.checkpoint_quant=fp8",
                                                          "model.checkpoint_weights_gib=66.0"])
    out = deploy(recipe, Target.K8S, tmp_path / "a", log=lambda _m: None, options=Options(model_source=HUB))
    assert "storage: 175Gi" in (out / "models.yaml").read_text()  # 2 x (66 x 1.25 + 5)
    assert json.loads((out / "sizing.json").read_text())["source_gib"] == 66.0


def _local(script: str, root: Path) -> str:
    """The script with the volume (/models) and the NFS export (/source) moved under `root`."""
    return script.replace("/models", str(root / "models")).replace("/source", str(root / "source"))


def _load(recipe_name: str, source: str, subs: list[str], lid: str, root: Path) -> subprocess.CompletedProcess[str]:
    """The generated loader script run here by bash, the volume and the NFS export under `root`."""
    text = loader.script(load_recipe(recipe_name), loader.parse_source(source), subs, lid)
    return subprocess.run(["bash", "-c", _local(text, root)], capture_output=True, text=True, timeout=60)


def _source(root: Path, subs: list[str], tag: str) -> None:
    for sub in subs:
        (root / "source" / sub).mkdir(parents=True, exist_ok=True)
        (root / "source" / sub / "file").write_text(f"{sub} {tag}")


def test_the_loader_copies_then_marks_and_the_server_waits_for_its_marker(tmp_path: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv")
    subs = ["engine", "checkpoint/tokenizer", "triton_repo"]
    _source(tmp_path, subs, "v1")
    lid = "0123456789ab"
    run = _load(recipe.name, "nfs://nas.lan/export/llama", subs, lid, tmp_path)
    assert run.returncode == 0, run.stderr
    root = tmp_path / "models" / recipe.name
    assert all((root / sub / "file").read_text() == f"{sub} v1" for sub in subs)
    assert (root / pods.LOAD_MARKER).read_text().strip() == lid
    assert root.is_symlink() and not Path(os.readlink(root)).is_absolute()  # the servers mount the volume elsewhere
    wait = pods.wait_for_load(recipe, "img", lid)["command"][2]
    done = subprocess.run(["sh", "-c", _local(wait, tmp_path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and f"models loaded ({lid})" in done.stdout
    # a later load that fails (an empty folder at the source) marks nothing new: no server starts on it
    (tmp_path / "source" / "engine" / "file").unlink()
    failed = _load(recipe.name, "nfs://nas.lan/export/llama", subs, "feedfacecafe", tmp_path)
    assert failed.returncode == 1 and "engine is empty" in failed.stderr
    assert (root / pods.LOAD_MARKER).read_text().strip() == lid


@pytest.mark.parametrize("layout", ["linked", "in place"])
def test_a_load_that_fails_half_way_keeps_the_previous_load_and_its_marker(tmp_path: Path, layout: str) -> None:
    """Before: the script removed the marker first and replaced each folder in place, so a copy failing at its second
    folder left the first one new, the rest old and no marker: the old pods could never restart. Now the old load,
    marker included, stays whole until a new one is complete; a volume a trtkv before 2026-12 loaded in place (a
    folder, not a link) is kept too."""
    recipe = load_recipe("llama70b_fp8kv")
    subs = ["engine", "checkpoint/tokenizer", "triton_repo"]
    root = tmp_path / "models" / recipe.name
    if layout == "linked":
        _source(tmp_path, subs, "old")
        assert _load(recipe.name, "nfs://nas.lan/export/llama", subs, "aaaaaaaaaaaa", tmp_path).returncode == 0
    else:
        for sub in subs:
            (root / sub).mkdir(parents=True)
            (root / sub / "file").write_text(f"{sub} old")
        (root / pods.LOAD_MARKER).write_text("aaaaaaaaaaaa\n")
    _source(tmp_path, subs, "new")
    (tmp_path / "source" / "checkpoint" / "tokenizer" / "file").unlink()
    (tmp_path / "source" / "checkpoint" / "tokenizer").rmdir()  # the copy of the second folder fails
    failed = _load(recipe.name, "nfs://nas.lan/export/llama", subs, "bbbbbbbbbbbb", tmp_path)
    assert failed.returncode != 0
    assert (root / pods.LOAD_MARKER).read_text().strip() == "aaaaaaaaaaaa"
    assert all((root / sub / "file").read_text() == f"{sub} old" for sub in subs)
    loads = tmp_path / "models" / loader.LOADS_DIR / recipe.name
    assert len(list(loads.iterdir())) == 1  # the failed copy removed its own folder
    # the next complete load switches whole and only then removes the old one
    _source(tmp_path, subs, "new")
    assert _load(recipe.name, "nfs://nas.lan/export/llama", subs, "cccccccccccc", tmp_path).returncode == 0
    assert (root / pods.LOAD_MARKER).read_text().strip() == "cccccccccccc"
    assert all((root / sub / "file").read_text() == f"{sub} new" for sub in subs)
    assert [p.name for p in loads.iterdir()] == [os.readlink(root).rsplit("/", 1)[1]]


def test_the_wait_is_for_this_load_only(tmp_path: Path) -> None:
    """A marker of another load does not start the server (the init container keeps waiting: here, cut short)."""
    recipe = load_recipe("llama70b_fp8kv")
    root = tmp_path / "models" / recipe.name
    root.mkdir(parents=True)
    (root / pods.LOAD_MARKER).write_text("aaaaaaaaaaaa\n")
    wait = _local(pods.wait_for_load(recipe, "img", "0123456789ab")["command"][2], tmp_path).replace("sleep 10", "exit 3")
    assert subprocess.run(["sh", "-c", wait], capture_output=True, timeout=30).returncode == 3


def test_the_load_id_changes_with_the_build(tmp_path: Path, engines_tmp: Path) -> None:
    recipe = load_recipe("llama70b_fp8kv")
    src = loader.parse_source("s3://my-bucket/x")
    engine = engines_tmp / recipe.name / "engine"
    folders = [(engine, "engine")]
    before = loader.load_id(recipe, src, folders)
    from trtkv.contracts.artifacts import Manifest

    def build(key: str, finished: str) -> str:
        Manifest(stage="build", recipe=recipe.name, key={"recipe": key}, finished_at=finished).save(engine)
        return loader.load_id(recipe, src, folders)

    engine.mkdir(parents=True)
    built = build("a" * 64, "2026-12-01T10:00:00")
    assert built != before and loader.load_id(recipe, loader.parse_source("s3://my-bucket/y"), folders) != built
    assert build("a" * 64, "2026-12-02T11:00:00") == built  # the same build, another run time: the same load
    assert build("b" * 64, "2026-12-02T11:00:00") != built  # other inputs


def test_the_skip_list_is_docs_and_never_touches_the_guarded_checks() -> None:
    from trtkv.deploy.pods import NEVER_SKIPPED, SKIPPABLE, skips_markdown

    text = (Path(__file__).parents[2] / "docs" / "deploy.md").read_text()
    body = text.split("<!-- checkov-skips:start -->", 1)[1].split("<!-- checkov-skips:end -->", 1)[0].strip()
    assert body == skips_markdown().strip(), "docs/deploy.md's checkov skips are stale: python scripts/update_docs.py"
    assert not set(SKIPPABLE) & set(NEVER_SKIPPED) and all("=" not in reason for reason in SKIPPABLE.values())
    for guarded in ("CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13", "CKV_K8S_21",
                    "CKV_K8S_28", "CKV_K8S_31", "CKV_K8S_37"):  # probes, resources, namespace, capabilities, seccomp
        assert guarded in NEVER_SKIPPED
