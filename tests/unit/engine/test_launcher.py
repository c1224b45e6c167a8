"""gyre.engine.launcher: the SGLang command line numbers the served weights (built without sglang installed)."""

from __future__ import annotations

import pytest

from gyre.engine.launcher import sglang_command
from gyre.errors import ProtocolError


def _flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, args
    return args[args.index(name) + 1]


def test_sglang_serves_weight_version_0_unless_told_otherwise() -> None:
    args = sglang_command("/models/qwen", 30001)
    assert args[1:3] == ["-m", "sglang.launch_server"]
    assert (
        _flag(args, "--weight-version") == "0"
    )  # not SGLang's "default", which the router refuses to record
    assert (_flag(args, "--model-path"), _flag(args, "--port")) == ("/models/qwen", "30001")
    assert "--enable-memory-saver" in args


def test_a_resumed_run_serves_its_checkpoints_version_and_extra_args_come_last() -> None:
    args = sglang_command("/m", 1, weight_version=12, extra_args=["--log-level", "debug"])
    assert _flag(args, "--weight-version") == "12"
    assert args[-2:] == ["--log-level", "debug"]
    with pytest.raises(ProtocolError):
        sglang_command("/m", 1, weight_version=-1)
