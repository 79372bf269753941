"""The safetensors header reader: files written by the safetensors library itself are listed exactly as
safetensors reads them back, and every malformed index or header is a SafetensorsError naming the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from trtkv.checkpoints.safetensors_headers import (
    SafetensorsError,
    TensorEntry,
    holds_weights,
    read_header,
    read_tensors,
    weight_files,
)


def _shards(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    shards = {
        "model-00001-of-00002.safetensors": {
            "model.embed_tokens.weight": torch.zeros(96, 64, dtype=torch.bfloat16),
            "model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64, dtype=torch.float8_e4m3fn),
            "model.layers.0.self_attn.q_proj.weight_scale": torch.ones((), dtype=torch.float32),
        },
        "model-00002-of-00002.safetensors": {
            "model.layers.0.mlp.experts.gate_up_proj_blocks": torch.zeros(4, 128, 2, 16, dtype=torch.uint8),
            "lm_head.weight": torch.zeros(96, 64, dtype=torch.bfloat16),
        },
    }
    folder.mkdir(exist_ok=True)
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return shards


def test_sharded_folder_lists_what_safetensors_reads_back(tmp_path: Path) -> None:
    shards = _shards(tmp_path)
    entries = read_tensors(tmp_path)
    assert [e.name for e in entries] == sorted(n for t in shards.values() for n in t)
    assert weight_files(tmp_path) == sorted(shards) and holds_weights(tmp_path)
    for e in entries:
        with safe_open(str(tmp_path / e.shard), "pt") as fh:
            tensor = fh.get_tensor(e.name)
        assert e.shape == tuple(tensor.shape)
        assert e.nbytes == tensor.numel() * tensor.element_size()
    by_name = {e.name: e for e in entries}
    assert by_name["model.layers.0.self_attn.q_proj.weight"] == TensorEntry(
        "model.layers.0.self_attn.q_proj.weight", "F8_E4M3", (64, 64), 4096, "model-00001-of-00002.safetensors")
    assert by_name["model.layers.0.self_attn.q_proj.weight_scale"].shape == ()
    assert by_name["model.layers.0.mlp.experts.gate_up_proj_blocks"].dtype == "U8"


def test_single_file_and_config_only_folders(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(3, 5, dtype=torch.float16)}, str(tmp_path / "model.safetensors"))
    assert read_tensors(tmp_path) == [TensorEntry("w", "F16", (3, 5), 30, "model.safetensors")]
    only_config = tmp_path / "cfg"
    only_config.mkdir()
    (only_config / "config.json").write_text("{}")
    assert not holds_weights(only_config)
    with pytest.raises(SafetensorsError, match="no model.safetensors.index.json"):
        read_tensors(only_config)


def _h(header: bytes) -> bytes:
    """A header with its true 8-byte length in front."""
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize(("content", "problem"), [
    (b"\x01\x02", "shorter than the 8-byte header length"),
    (struct.pack("<Q", 1 << 40) + b"{}", "header length 1099511627776 is beyond the file"),
    (struct.pack("<Q", 4) + b"{no}", "not readable JSON"),
    (struct.pack("<Q", 2) + b"[]", "a list, not an object"),
    (_h(b'{"w":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}') + b"\0", "dtype 'Q9'"),
    (_h(b'{"w":{"dtype":"F16","shape":[-1],"data_offsets":[0,2]}}') + b"\0\0",
     "is not a list of sizes"),
    (_h(b'{"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}') + b"\0\0",
     "are not inside the file's 2 data bytes"),
    (_h(b'{"w":{"dtype":"F16","shape":[3],"data_offsets":[0,2]}}') + b"\0\0",
     "2 bytes stored for F16 \\[3\\] \\(6 expected\\)"),
    (_h(b'{"__metadata__":{"a":1}, }'), "not readable JSON"),
    (_h(b'{"__metadata__":{"a":1}} '), "__metadata__ is not an object of strings"),
])
def test_malformed_header_names_the_file(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(SafetensorsError, match=problem) as caught:
        read_header(path)
    assert str(path) in str(caught.value) and "Next:" in str(caught.value)


def test_not_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").mkdir()
    with pytest.raises(SafetensorsError, match="a directory, not a regular file"):
        read_header(tmp_path / "model.safetensors")


@pytest.mark.parametrize(("index", "problem"), [
    ({"weight_map": {"w": "../../etc/passwd.safetensors"}}, "a shard must be a \\*.safetensors file name"),
    ({"weight_map": {"w": "sub/model.safetensors"}}, "a shard must be a \\*.safetensors file name"),
    ({"weight_map": ["w"]}, "weight_map is not an object"),
    ({"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}},
     "weight_map puts 1 tensor\\(s\\) in a shard whose header does not list them"),
])
def test_malformed_index_names_the_file(tmp_path: Path, index: dict, problem: str) -> None:
    _shards(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SafetensorsError, match=problem) as caught:
        read_tensors(tmp_path)
    assert "model.safetensors.index.json" in str(caught.value)


def test_index_naming_a_missing_shard(tmp_path: Path) -> None:
    _shards(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(SafetensorsError, match="model-00002-of-00002.safetensors: cannot open"):
        read_tensors(tmp_path)
