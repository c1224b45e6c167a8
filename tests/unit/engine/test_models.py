"""gyre.engine.models: the tiny Qwen3 model directory, its byte-level tokenizer and its ChatML chat template."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gyre.engine.models import ADDED_TOKENS, SPECIAL_TOKENS, count_parameters, init_model, load_tokenizer
from gyre.errors import ConfigError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("models") / "tiny")


def test_importing_does_not_import_torch() -> None:
    code = "import sys, gyre.engine.models; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_directory_loads_offline_and_runs(model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.model_type == "qwen3"
    assert model.config.vocab_size % 8 == 0 and model.config.vocab_size >= len(tokenizer)
    assert model.config.rope_parameters["rope_theta"] == 1e6
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    ids = tokenizer("hello", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 5, model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_parameter_count(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    count = count_parameters(model_dir)
    assert 1_000_000 <= count <= 5_000_000
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    assert count == sum(p.numel() for p in model.parameters())  # tied embeddings counted once


@pytest.mark.parametrize(
    "text",
    [
        "héllo 世界",
        "  two  spaces , tabs\t\nand newlines\r\n",
        "emoji 🦀 and \x00 nul",
        "<tool_call>{}</tool_call>",
    ],
)
def test_text_round_trips_exactly(model_dir: Path, text: str) -> None:
    tokenizer = load_tokenizer(model_dir)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text  # tool tags are text, not special


def test_every_byte_is_one_token(model_dir: Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    assert tokenizer.encode("世", add_special_tokens=False) == list("世".encode())


def test_special_and_tool_tokens_are_single_ids(model_dir: Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    ids = [tokenizer.encode(token, add_special_tokens=False) for token in (*SPECIAL_TOKENS, *ADDED_TOKENS)]
    assert all(len(one) == 1 for one in ids)
    assert len({one[0] for one in ids}) == len(ids)
    assert all(one[0] >= 256 for one in ids)
    assert (
        tokenizer.decode(tokenizer.encode("a<|im_end|>", add_special_tokens=False), skip_special_tokens=True)
        == "a"
    )


def test_chat_template_renders_tools_calls_and_grouped_results(model_dir: Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    messages = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}},
            ],
        },
        {"role": "tool", "content": "18°C, sunny"},
        {"role": "tool", "content": "22°C, rain"},
    ]
    rendered = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    expected = (
        "<|im_start|>system\n"
        "You are a careful agent.\n"
        "\n"
        "# Tools\n"
        "\n"
        "You may call one or more functions to assist with the user query.\n"
        "\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
        "</tools>\n"
        "\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "Weather in Paris and Tokyo?<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>\n"
        "<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "18°C, sunny\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "22°C, rain\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert rendered == expected


def test_chat_template_plain_conversation(model_dir: Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    )


def test_same_seed_same_weights_different_seed_different(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    first = load_file(init_model(tmp_path / "a", seed=7) / "model.safetensors")
    again = load_file(init_model(tmp_path / "b", seed=7) / "model.safetensors")
    other = load_file(init_model(tmp_path / "c", seed=8) / "model.safetensors")
    assert first.keys() == again.keys() == other.keys()
    assert all(first[name].equal(again[name]) for name in first)
    assert not all(first[name].equal(other[name]) for name in first)


def test_non_empty_directory_is_refused_unless_overwrite(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not empty"):
        init_model(tmp_path)
    assert not (tmp_path / "config.json").exists()
    init_model(tmp_path, overwrite=True)
    assert (tmp_path / "config.json").exists()
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_unknown_preset_lists_the_presets(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'huge'.*tiny"):
        init_model(tmp_path / "m", preset="huge")
    assert not (tmp_path / "m").exists()
