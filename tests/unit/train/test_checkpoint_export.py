"""The streamed Hugging Face export: files of bounded size, an index, the bytes exact; the flat layout of shards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from gyre.errors import ConfigError
from gyre.train.checkpoint import export_weights, flat_range, flat_state_keys, save_flat_state


def read_back(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}  # transformers refuses safetensors weights without it
            out.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118
    return out


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(64, 16, generator=g),  # 4096 bytes
        "layers.0.norm": torch.randn(16, generator=g),
        "layers.0.proj": torch.randn(16, 48, generator=g),  # 3072 bytes
        "layers.0.scale": torch.tensor(2.5),  # 0-d
        "layers.1.proj": torch.randn(16, 48, generator=g),
        "head.bias": torch.randn(1, generator=g),
    }


def test_tensors_stream_into_bounded_files_with_an_index_and_read_back_exactly(tmp_path: Path) -> None:
    expected = tensors()
    files = export_weights(tmp_path, iter(expected.items()), max_shard_bytes=3500)
    assert [f.name for f in files] == [f"model-{k:05d}-of-00003.safetensors" for k in range(1, 4)]
    assert not (tmp_path / "model.safetensors").exists()
    got = read_back(tmp_path)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[n], t) and got[n].dtype == t.dtype for n, t in expected.items())
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in expected.values())
    assert set(index["weight_map"]) == set(expected) and set(index["weight_map"].values()) == {
        f.name for f in files
    }
    with safe_open(
        str(files[0]), framework="pt"
    ) as f:  # the 4096-byte tensor, bigger than a file, goes alone
        assert list(f.keys()) == ["embed.weight"]
    for file in files[1:]:  # the rest within the bound: data + 8-byte length + reserved header
        assert file.stat().st_size <= 3500 + 8 + 256 * 1024


def test_a_model_that_fits_one_file_keeps_the_single_file_layout(tmp_path: Path) -> None:
    expected = tensors()
    files = export_weights(tmp_path, expected.items(), dtype=torch.bfloat16)
    assert (
        files == [tmp_path / "model.safetensors"] and not (tmp_path / "model.safetensors.index.json").exists()
    )
    got = read_back(tmp_path)
    assert all(torch.equal(got[n], t.to(torch.bfloat16)) for n, t in expected.items())


def test_a_full_header_closes_a_file_early(tmp_path: Path) -> None:
    many = {f"model.layers.{i}.mlp.down_proj.weight": torch.full((3,), float(i)) for i in range(40)}
    files = export_weights(tmp_path, many.items(), header_reserve_bytes=1024)
    assert len(files) > 2  # ~80 bytes a header entry: about a dozen tensors a file, though the data is tiny
    got = read_back(tmp_path)
    assert all(torch.equal(got[n], t) for n, t in many.items())


def test_a_failed_export_leaves_no_weights_and_names_are_unique(tmp_path: Path) -> None:
    def failing() -> Iterator[tuple[str, torch.Tensor]]:
        yield "a", torch.ones(4)
        raise RuntimeError("a rank died while gathering")

    with pytest.raises(RuntimeError, match="rank died"):
        export_weights(tmp_path, failing())
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="exported twice"):
        export_weights(tmp_path, [("a", torch.ones(1)), ("a", torch.ones(1))])


def test_flat_ranges_are_dtensors_chunks_and_cover_the_buffer() -> None:
    for numel in (1, 5, 7, 64, 1001):
        for world in (1, 2, 3, 4, 8):
            ranges = [flat_range(numel, r, world) for r in range(world)]
            chunks = torch.arange(numel).chunk(world)
            sizes = [b - a for a, b in ranges]
            assert sizes[: len(chunks)] == [len(c) for c in chunks] and sum(sizes) == numel
            assert all(ranges[r][1] == ranges[r + 1][0] for r in range(world - 1)), (numel, world)


def test_a_flat_state_for_another_model_size_is_refused_saying_why(tmp_path: Path) -> None:
    save_flat_state(tmp_path / "opt", {"exp_avg": torch.zeros(10), "step": torch.tensor(3.0)}, 10)
    assert flat_state_keys(tmp_path / "opt", 10) == {
        "exp_avg": (torch.float32, True),
        "step": (torch.float32, False),
    }
    with pytest.raises(ConfigError, match="model of \\(10,\\) values; this one has 12"):
        flat_state_keys(tmp_path / "opt", 12)
    with pytest.raises(ConfigError, match="not a sharded optimizer state"):
        flat_state_keys(tmp_path, 10)
