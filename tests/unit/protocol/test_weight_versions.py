"""gyre.protocol weight versions: integers inside Gyre, decimal strings on SGLang's wire, nothing else accepted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.errors import ProtocolError
from gyre.protocol import MAX_WEIGHT_VERSION, format_weight_version, parse_weight_version


@pytest.mark.parametrize(("wire", "version"), [("0", 0), ("3", 3), ("0042", 42), (str(2**63 - 1), 2**63 - 1)])
def test_decimal_strings_are_versions(wire: str, version: int) -> None:
    assert parse_weight_version(wire, "engine-0") == version


@pytest.mark.parametrize(
    "wire",
    ["default", "", "-1", "+1", " 3", "3 ", "3.0", "1e3", "v2", "0x1f", "٣", "²", str(2**63), "9" * 5000],
)
def test_anything_else_is_refused_naming_where_and_what(wire: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_weight_version(wire, "engine engine-0 (http://127.0.0.1:1)")
    message = str(info.value)
    assert message.startswith("engine engine-0 (http://127.0.0.1:1): weight version ")
    assert "not a non-negative integer" in message and "--weight-version 0" in message
    assert (repr(wire) if len(wire) <= 40 else repr(wire[:40]) + "...") in message  # a long value is cut


@pytest.mark.parametrize("version", [-1, True, 2**63, 3.0, "3"])
def test_only_non_negative_integers_go_on_the_wire(version: object) -> None:
    with pytest.raises(ProtocolError, match="not a non-negative integer"):
        format_weight_version(version)  # type: ignore[arg-type]


@given(st.integers(0, MAX_WEIGHT_VERSION))
def test_wire_round_trip(version: int) -> None:
    assert parse_weight_version(format_weight_version(version), "x") == version
