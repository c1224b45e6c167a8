"""Tiny Qwen3-architecture models with a byte-level tokenizer, written as Hugging Face directories.

``init_model`` gives tests, examples and benchmarks a real model to run offline on CPU: randomly initialised
weights, a tokenizer in which every byte is a token (so any UTF-8 text round-trips exactly) plus Qwen's special
tokens, and a ChatML chat template that renders conversations and tool calls the way Qwen3 instruct models do.
torch and transformers are imported inside the functions that need them, so importing this module is cheap.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Special tokens as Qwen uses them: <|endoftext|> pads, <|im_end|> ends a turn (the eos).
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
# Single tokens the model sees and emits as text: not special, so decode keeps them.
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

# Architecture presets; vocab_size is derived from the tokenizer (rounded up to a multiple of 8) unless a preset
# sets it (ids the tokenizer never produces just get embedding rows).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "hidden_size": 192,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 48,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
    },
    # ~25 M parameters (~100 MB in fp32): big enough that moving weights is bandwidth, not latency
    "small": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
    },
    # 1 layer, 1 query and 1 key/value head of 16 with Qwen's vocabulary: long-context tests and benchmarks on CPU,
    # where attention's compute sets what fits and the chunked loss meets a real vocabulary
    "micro": {
        "hidden_size": 16,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "tie_word_embeddings": True,
        "max_position_embeddings": 1048576,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
        "vocab_size": 151936,
    },
}

# ChatML as Qwen3 instruct models render it (system / user / assistant / tool, Hermes-style tool calls).
CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
        '<tool_call></tool_call> XML tags:\\n<tool_call>\\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + content }}
        {%- for tool_call in message.tool_calls %}
            {%- if content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {%- if tool_call.function %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def build_tokenizer(model_max_length: int = 32768) -> PreTrainedTokenizerBase:
    """The byte-level tokenizer: ids 0-255 are the bytes, then Qwen's special tokens, then tool/think tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in enumerate(_byte_chars())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,  # decode(encode(text)) == text, spaces included
        model_max_length=model_max_length,
    )


def _byte_chars() -> list[str]:
    """The printable character ByteLevel uses for each byte 0-255, in byte order (GPT-2's bytes_to_unicode)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars: list[str] = []
    shifted = 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:  # unprintable bytes map to 256, 257, ... in byte order
            chars.append(chr(256 + shifted))
            shifted += 1
    return chars


def init_model(directory: str | Path, preset: str = "tiny", seed: int = 0, overwrite: bool = False) -> Path:
    """Write a randomly initialised Qwen3 model with its tokenizer to ``directory``; return the path.

    The same ``preset`` and ``seed`` always give the same weights. The directory loads offline with
    ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``. A non-empty ``directory`` is
    refused unless ``overwrite``; then the new files replace the old ones and earlier weight files are removed.
    """
    path = Path(directory)
    if preset not in PRESETS:
        raise ConfigError(f"unknown model preset {preset!r}; choose one of: {', '.join(sorted(PRESETS))}")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"model directory {path} is a file; choose a directory path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ConfigError(
            f"model directory {path} exists and is not empty; choose an empty path or pass overwrite=True"
        )

    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    arch = dict(PRESETS[preset])
    tokenizer = build_tokenizer(arch["max_position_embeddings"])
    rope_theta = arch.pop("rope_theta")
    vocab_size = arch.pop("vocab_size", 8 * math.ceil(len(tokenizer) / 8))
    token_ids = tokenizer.get_vocab()
    pad_id, eos_id = token_ids[PAD_TOKEN], token_ids[IM_END]
    config = Qwen3Config(
        **arch,
        vocab_size=vocab_size,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        architectures=["Qwen3ForCausalLM"],
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)

    path.mkdir(parents=True, exist_ok=True)
    for stale in [*path.glob("*.safetensors"), *path.glob("*.bin"), *path.glob("*.index.json")]:
        stale.unlink()  # a previous model's weights (or shards) would be loaded alongside the new ones
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a one-shard "Writing model shards" bar is noise
    try:
        model.save_pretrained(path, safe_serialization=True)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(path)
    # Readers older than transformers 5 (and SGLang) take rope_theta from the top level and don't know the
    # TokenizersBackend class; transformers 5 folds rope_theta into rope_parameters and maps the class back.
    _update_json(path / "config.json", rope_theta=rope_theta)
    _update_json(path / "tokenizer_config.json", tokenizer_class="PreTrainedTokenizerFast")
    return path


def _update_json(file: Path, **updates: Any) -> None:
    """Set top-level keys of a JSON object file."""
    data = json.loads(file.read_text(encoding="utf-8"))
    data.update(updates)
    file.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``model_dir``, loaded from local files only."""
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return tokenizer


def count_parameters(model_dir: str | Path) -> int:
    """Number of stored parameters, read from the safetensors headers (tied weights are stored, so counted, once)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors file in {model_dir}; is it a Hugging Face model directory?")
    total = 0
    for file in files:
        with file.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))  # little-endian u64, then that many bytes of JSON
            header = json.loads(f.read(header_len))
        total += sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    return total
