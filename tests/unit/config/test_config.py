"""gyre.config: one TOML file, dotted-key overrides, errors that name the field, and a dump that parses back."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.config import EngineConfig, GyreConfig, apply_overrides, dump_config, load_config
from gyre.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_no_file_gives_the_defaults() -> None:
    assert load_config() == GyreConfig()


def test_load_config_reads_the_toml_file(tmp_path: Path) -> None:
    path = _write(tmp_path, '[engine]\nmodel_path = "/models/tiny"\nport = 8123\nkv_cache_mem_gib = 0.5\n')
    engine = load_config(path).engine
    assert engine.model_path == "/models/tiny"
    assert engine.port == 8123
    assert engine.kv_cache_mem_gib == 0.5
    assert engine.max_running_requests == EngineConfig().max_running_requests  # unset fields keep defaults


def test_overrides_parse_ints_strings_booleans_and_floats() -> None:
    overrides = [
        "engine.port=123",
        "engine.model_path=/models/tiny",  # not a TOML literal: taken as the bare string
        'engine.host="0.0.0.0"',
        "engine.enable_prefix_cache=false",
        "engine.kv_cache_mem_gib=2.5",
        "engine.device = cpu",  # whitespace around key and value is ignored
    ]
    engine = load_config(overrides=overrides).engine
    assert engine.port == 123
    assert engine.model_path == "/models/tiny"
    assert engine.host == "0.0.0.0"
    assert engine.enable_prefix_cache is False
    assert engine.kv_cache_mem_gib == 2.5
    assert engine.device == "cpu"


def test_an_integer_is_accepted_for_a_float_field() -> None:
    assert load_config(overrides=["engine.kv_cache_mem_gib=2"]).engine.kv_cache_mem_gib == 2.0


def test_a_value_may_contain_an_equals_sign() -> None:
    assert load_config(overrides=["engine.model_path=a=b"]).engine.model_path == "a=b"


def test_overrides_win_over_the_file_and_later_overrides_win(tmp_path: Path) -> None:
    path = _write(tmp_path, "[engine]\nport = 1\nseed = 7\n")
    engine = load_config(path, ["engine.port=2", "engine.port=3"]).engine
    assert engine.port == 3
    assert engine.seed == 7


def test_overrides_create_nested_sections() -> None:
    data = apply_overrides({}, ["a.b.c=1", "a.b.d=true", "a.e=x"])
    assert data == {"a": {"b": {"c": 1, "d": True}, "e": "x"}}


@pytest.mark.parametrize("override", ["engine.port", "=3", "  =3", ""])
def test_override_without_key_or_equals_is_an_error(override: str) -> None:
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        load_config(overrides=[override])


def test_override_through_a_value_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "[engine]\nport = 1\n")
    with pytest.raises(ConfigError, match="'port' is a value, not a section"):
        load_config(path, ["engine.port.x=1"])


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("engine.kv_cache_mem_gib=lots", "engine.kv_cache_mem_gib"),
        ("engine.kv_cache_mem_gib=0", "engine.kv_cache_mem_gib"),  # bound gt=0
        ("engine.port=70000", "engine.port"),  # bound le=65535
        ("engine.max_running_requests=0", "engine.max_running_requests"),
        ("engine.device=tpu", "engine.device"),  # not one of the literals
        ("engine.enable_prefix_cache=1", "engine.enable_prefix_cache"),
    ],
)
def test_wrong_type_or_out_of_bounds_names_the_field(override: str, field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)):
        load_config(overrides=[override])


def test_unknown_field_names_the_field_and_its_section() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["engine.kv_cache_gb=2"])
    assert "kv_cache_gb" in str(info.value)
    assert "engine" in str(info.value)


def test_unknown_section_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "[trainer]\nlr = 1e-5\n")
    with pytest.raises(ConfigError, match="trainer") as info:
        load_config(path)
    assert str(path) in str(info.value)  # the file is named as the source


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_invalid_toml_names_the_path(tmp_path: Path) -> None:
    path = _write(tmp_path, "[engine\nport = \n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_bytes(b'[engine]\nmodel_path = "\xff"\n')
    with pytest.raises(ConfigError):
        load_config(path)


def test_dump_parses_back_into_an_equal_config(tmp_path: Path) -> None:
    config = load_config(
        overrides=['engine.model_path="/m/a \\"b\\"\\n"', "engine.kv_cache_mem_gib=1e-05", "engine.seed=-3"]
    )
    text = dump_config(config)
    assert msgspec.convert(tomllib.loads(text), GyreConfig) == config
    path = _write(tmp_path, text)
    assert load_config(path) == config  # a run directory's config.toml reproduces the run


_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)


@given(
    model_path=_text,
    weight_version=st.integers(0, 2**63 - 1),
    kv_cache_mem_gib=st.floats(min_value=1e-300, allow_nan=False),
    seed=st.integers(-(2**63), 2**63 - 1),
    enable_prefix_cache=st.booleans(),
)
def test_dump_round_trips_any_values(
    model_path: str, weight_version: int, kv_cache_mem_gib: float, seed: int, enable_prefix_cache: bool
) -> None:
    engine = EngineConfig(
        model_path=model_path,
        weight_version=weight_version,
        kv_cache_mem_gib=kv_cache_mem_gib,
        seed=seed,
        enable_prefix_cache=enable_prefix_cache,
    )
    config = GyreConfig(engine=engine)
    assert msgspec.convert(tomllib.loads(dump_config(config)), GyreConfig) == config


def test_dump_escapes_delete() -> None:
    config = GyreConfig(engine=EngineConfig(model_path="a\x7fb"))
    assert msgspec.convert(tomllib.loads(dump_config(config)), GyreConfig) == config


def test_a_config_from_before_the_megatron_backend_is_told_where_the_collective_went(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[trainer]\nbackend = "nccl"\n')
    with pytest.raises(ConfigError, match=r"gloo/nccl moved to trainer\.collective"):
        load_config(path)
    cfg = load_config(
        path, ['trainer.backend="megatron"', 'trainer.collective="nccl"', "trainer.tensor_parallel=2"]
    )
    assert (cfg.trainer.backend, cfg.trainer.collective, cfg.trainer.tensor_parallel) == (
        "megatron",
        "nccl",
        2,
    )


def test_the_renamed_trainer_shards_is_refused_naming_trainer_ranks(tmp_path: Path) -> None:
    """``trainer.shards`` (the core cell's ranks, before) is refused from a file and from an override alike, saying
    what to write instead; ``[shards]``, the runtime's shards, is untouched."""
    path = tmp_path / "run.toml"
    path.write_text("[trainer]\nshards = 4\n\n[shards]\ncount = 2\n")
    with pytest.raises(ConfigError, match=r"trainer\.shards is now trainer\.ranks \(the core cell"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"trainer\.shards is now trainer\.ranks"):
        load_config(None, ["trainer.shards=2"])
    cfg = load_config(None, ["trainer.ranks=2", "shards.count=3"])
    assert cfg.trainer.ranks == 2 and cfg.shards.count == 3
