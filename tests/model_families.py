"""The major model families' real chat templates, tokenizers shaped like theirs, and the replies they emit.

The templates are not in this repository: `templates_dir` takes them from the pinned llama-cpp-python sdist
(llama.cpp keeps the families' own templates in ``vendor/llama.cpp/models/templates``), checks the sdist's sha256,
and caches the ``*.jinja`` files. `family_tokenizer` builds Gyre's byte-level tokenizer (every byte one id, no
merges) with exactly the family's single-token markers, each special or not as in the real tokenizer: "special"
means the real tokenizer's ``decode(..., skip_special_tokens=True)`` drops it. `reply_text` is the text the real
model samples for a reply, its turn terminator included, in the form SGLang's detectors read
(``python/sglang/srt/function_call/*_detector.py``, ``python/sglang/srt/parser/reasoning_parser.py``).
Keys of `FAMILIES` are SGLang's ``--tool-call-parser`` names.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SDIST = "llama-cpp-python==0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_TEMPLATES_IN_SDIST = ("vendor", "llama.cpp", "models", "templates")  # under the sdist's top folder
Calls = Sequence[tuple[str, dict[str, Any]]]  # a reply's tool calls: (name, arguments)
_OFFLINE_HINT = (
    "the model-family tests need network access to PyPI once (about 75 MB), or GYRE_TEST_CACHE set to a folder "
    f"holding the *.jinja files of {SDIST}'s vendor/llama.cpp/models/templates"
)


# ---- the templates ---------------------------------------------------------------------------------------------
def templates_dir() -> Path:
    """The folder of llama.cpp's ``*.jinja`` chat templates from the pinned sdist, downloaded once and cached.

    The folder is ``$GYRE_TEST_CACHE`` when set, else ``~/.cache/gyre-tests/llama-cpp-python-0.3.36/templates``;
    one that already holds templates is used as it is (no network). Concurrent callers (pytest-xdist workers) take
    a file lock; the folder appears whole or not at all (extracted beside it, then renamed)."""
    env = os.environ.get("GYRE_TEST_CACHE")
    target = Path(env) if env else Path.home() / ".cache/gyre-tests/llama-cpp-python-0.3.36/templates"
    if _holds_templates(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        if _holds_templates(target):  # another process finished while this one waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
            sdist = _download_sdist(Path(tmp) / "sdist")
            check_sdist(sdist)
            staged = Path(tmp) / "templates"
            _extract_templates(sdist, staged)
            if target.exists():  # an empty or template-less folder: replaced
                shutil.rmtree(target) if target.is_dir() else target.unlink()
            staged.rename(target)
    return target


def check_sdist(path: Path) -> None:
    """Raise `RuntimeError` unless ``path`` is the pinned sdist, byte for byte (its sha256)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != SDIST_SHA256:
        raise RuntimeError(
            f"{path.name} has sha256 {digest.hexdigest()}, but the pinned {SDIST} sdist has {SDIST_SHA256}: the "
            "package index served other bytes; nothing was cached. Check the index (pip config, a mirror) or set "
            "GYRE_TEST_CACHE to a folder holding the templates of the real sdist"
        )


def _holds_templates(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*.jinja"))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        yield


def _download_sdist(dest: Path) -> Path:
    """The pinned sdist, downloaded by pip (its index settings apply) into ``dest``."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        SDIST,
        "-d",
        str(dest),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"could not run pip to download {SDIST} ({e}); {_OFFLINE_HINT}") from e
    found = sorted(dest.glob("*.tar.gz")) if dest.is_dir() else []
    if done.returncode != 0 or len(found) != 1:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"downloading the {SDIST} sdist failed:\n{tail}\n{_OFFLINE_HINT}")
    return found[0]


def _extract_templates(sdist: Path, dest: Path) -> None:
    """Only ``*/vendor/llama.cpp/models/templates/*.jinja``, written by name (no paths from the archive are used)."""
    dest.mkdir()
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            if member.isfile() and parts[1:-1] == _TEMPLATES_IN_SDIST and parts[-1].endswith(".jinja"):
                source = tar.extractfile(member)
                assert source is not None
                (dest / parts[-1]).write_bytes(source.read())
    if not _holds_templates(dest):
        raise RuntimeError(f"the {SDIST} sdist holds no {'/'.join(_TEMPLATES_IN_SDIST)}/*.jinja")


# ---- the families ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """One model family: its template, its tokenizer's single-token markers, and how its replies end."""

    name: str  # SGLang's --tool-call-parser name
    template: str  # file name in templates_dir()
    special: tuple[str, ...]  # texts decode(skip_special_tokens=True) drops; eos, bos and pad among them
    added: tuple[str, ...]  # single tokens decode keeps (added tokens with special=False)
    eos: str  # the real tokenizer's eos_token
    bos: str | None  # the real bos_token where the template writes {{ bos_token }}
    pad: str | None  # the real pad_token, where it has one
    stops: tuple[str, ...]  # every token generation stops at (generation_config's eos_token_id, and eos)
    call_end: str  # the token the model stops at after tool calls
    reply_end: str  # the token the model stops at after a final reply
    write: Callable[[str | None, str, Calls], str]  # (reasoning, content, calls) -> the reply before its end

    @property
    def markers(self) -> tuple[str, ...]:
        """Every text that is one token in this family's tokenizer."""
        return self.special + self.added


def mistral_call_id(index: int) -> str:
    """The ``index``-th call's id in a Mistral reply: 9 alphanumerics, as Mistral's template demands."""
    return f"abcDEF{index:03d}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # as the templates' tojson writes it


def _no_reasoning(family: str, reasoning: str | None) -> None:
    if reasoning is not None:
        raise ValueError(f"{family} writes no reasoning; pass reasoning=None")


def _hermes(content: str, calls: Calls) -> str:
    parts = [content] if content else []
    parts += [f"<tool_call>\n{_json({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls]
    return "\n".join(parts)


def _write_qwen25(reasoning: str | None, content: str, calls: Calls) -> str:
    """Hermes calls, no reasoning (SGLang's qwen25_detector; the template's own call rendering).

    ``CONTENT\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, calls one per line."""
    _no_reasoning("qwen25", reasoning)
    return _hermes(content, calls)


def _write_qwen3(reasoning: str | None, content: str, calls: Calls) -> str:
    """Hermes calls after ``<think>\\nREASONING\\n</think>\\n\\n`` (SGLang's qwen25_detector and qwen3 reasoning
    parser; the template's rendering of the turn after the last user message).

    ``reasoning=None`` is thinking off: the generation prompt already holds the empty think block."""
    head = "" if reasoning is None else f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n"
    return head + _hermes(content, calls)


def _write_qwen3_coder(reasoning: str | None, content: str, calls: Calls) -> str:
    """XML calls (SGLang's qwen3_coder_detector; Qwen3-Coder.jinja's call rendering): ``CONTENT\\n\\n`` then
    ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`` per call,
    a string value as it is, others as JSON. Qwen3-Coder is an instruct model: no reasoning."""
    _no_reasoning("qwen3_coder", reasoning)
    blocks = []
    for name, arguments in calls:
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else _json(v)}\n</parameter>\n"
            for k, v in arguments.items()
        )
        blocks.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
    head = content.strip()
    return (head + "\n\n" if head and blocks else head) + "\n".join(blocks)


def _write_glm45(reasoning: str | None, content: str, calls: Calls) -> str:
    """GLM-4.5/4.6 (SGLang's glm4_moe_detector and glm45 reasoning parser; GLM-4.6.jinja's assistant turn):
    ``\\n<think>REASONING</think>\\nCONTENT`` then ``\\n<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V
    </arg_value>\\n</tool_call>`` per call, a string value as it is, others as JSON.

    ``reasoning=None`` is thinking off (``enable_thinking=False``: the generation prompt holds ``\\n<think></think>``).
    """
    text = "" if reasoning is None else f"\n<think>{reasoning.strip()}</think>"
    if content.strip():
        text += "\n" + content.strip()
    for name, arguments in calls:
        pairs = "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else _json(v)}</arg_value>\n"
            for k, v in arguments.items()
        )
        text += f"\n<tool_call>{name}\n{pairs}</tool_call>"
    return text


def _write_kimi_k2(reasoning: str | None, content: str, calls: Calls) -> str:
    """Kimi-K2-Instruct (SGLang's kimik2_detector; Kimi's docs/tool_call_guidance.md; the template): content, then
    ``<|tool_calls_section_begin|>`` and per call ``<|tool_call_begin|>functions.NAME:i<|tool_call_argument_begin|>
    {...}<|tool_call_end|>`` (``i`` counts the reply's calls), then ``<|tool_calls_section_end|>``. No reasoning."""
    _no_reasoning("kimi_k2", reasoning)
    if not calls:
        return content
    body = "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_json(a)}<|tool_call_end|>"
        for i, (n, a) in enumerate(calls)
    )
    return f"{content}<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def _write_deepseekv31(reasoning: str | None, content: str, calls: Calls) -> str:
    """DeepSeek-V3.1 (SGLang's deepseekv31_detector and deepseek-v3 reasoning parser; the template): ``REASONING
    </think>`` (thinking mode: the generation prompt opened ``<think>``), content, then ``<｜tool▁calls▁begin｜>``,
    per call ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``, and ``<｜tool▁calls▁end｜>``."""
    text = "" if reasoning is None else f"{reasoning}</think>"
    text += content
    if calls:
        body = "".join(
            f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{_json(a)}<｜tool▁call▁end｜>" for n, a in calls
        )
        text += f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"
    return text


def _write_gpt_oss(reasoning: str | None, content: str, calls: Calls) -> str:
    """Harmony (OpenAI's harmony format guide; SGLang's gpt_oss_detector and HarmonyParser): messages after the
    generation prompt's ``<|start|>assistant``, each later one opened by ``<|start|>assistant``: reasoning as
    ``<|channel|>analysis<|message|>...<|end|>``; with a call, content as a commentary preamble and the call as
    ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`` (compact JSON, as the guide);
    without, ``<|channel|>final<|message|>CONTENT``. ``<|call|>`` ends the turn, so one call per reply."""
    if len(calls) > 1:
        raise ValueError("gpt-oss ends its turn at the first call's <|call|>: one call per reply")
    messages = [] if reasoning is None else [f"<|channel|>analysis<|message|>{reasoning}<|end|>"]
    if calls:
        if content:
            messages.append(f"<|channel|>commentary<|message|>{content}<|end|>")
        name, arguments = calls[0]
        compact = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        messages.append(f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{compact}")
    else:
        messages.append(f"<|channel|>final<|message|>{content}")
    return "<|start|>assistant".join(messages)


def _write_llama3(reasoning: str | None, content: str, calls: Calls) -> str:
    """Llama 3.1 JSON tool calling (Meta's prompt-format docs; SGLang's llama32_detector; the template, which writes
    custom-tool calls as ``{"name": ..., "parameters": {...}}`` with no ``<|python_tag|>`` and ends them with
    ``<|eot_id|>``: ``<|python_tag|>`` and ``<|eom_id|>`` belong to built-in tools). A reply is a call or text."""
    _no_reasoning("llama3", reasoning)
    if len(calls) > 1 or (calls and content):
        raise ValueError("Llama 3.1 replies with one call and nothing else (the template refuses more)")
    return _json({"name": calls[0][0], "parameters": calls[0][1]}) if calls else content


def _write_mistral(reasoning: str | None, content: str, calls: Calls) -> str:
    """Mistral-Nemo (mistral-common's v3 tekken encoding of tool calls; the template's ``[TOOL_CALLS][...]``):
    ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abcDEF000"}, ...]``, no space after ``[TOOL_CALLS]``
    (tekken adds no prefix space; SGLang's mistral_detector expects ``[TOOL_CALLS] [`` as SentencePiece Mistrals
    write it). Ids from `mistral_call_id`. No reasoning."""
    _no_reasoning("mistral", reasoning)
    if not calls:
        return content
    items = [{"name": n, "arguments": a, "id": mistral_call_id(i)} for i, (n, a) in enumerate(calls)]
    return f"{content}[TOOL_CALLS]{_json(items)}"


_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN3_ADDED = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
_QWEN_STOPS = ("<|im_end|>", "<|endoftext|>")
_DS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        # Qwen2.5-7B-Instruct: <tool_call> pair added with special=False; no <tool_response> or <think> tokens yet
        Family("qwen25", "Qwen-Qwen2.5-7B-Instruct.jinja", _QWEN_SPECIAL, ("<tool_call>", "</tool_call>"),
               "<|im_end|>", None, "<|endoftext|>", _QWEN_STOPS, "<|im_end|>", "<|im_end|>", _write_qwen25),
        # Qwen3 (and Qwen3-Coder, the same vocabulary): tool, tool-response and think tags added, special=False
        Family("qwen3", "Qwen-Qwen3-0.6B.jinja", _QWEN_SPECIAL, _QWEN3_ADDED,
               "<|im_end|>", None, "<|endoftext|>", _QWEN_STOPS, "<|im_end|>", "<|im_end|>", _write_qwen3),
        Family("qwen3_coder", "Qwen3-Coder.jinja", _QWEN_SPECIAL, _QWEN3_ADDED,
               "<|im_end|>", None, "<|endoftext|>", _QWEN_STOPS, "<|im_end|>", "<|im_end|>", _write_qwen3_coder),
        # GLM-4.6: role tokens special; think/tool/arg tags kept by decode (SGLang's glm45 parsers read them in
        # text); generation_config stops at <|endoftext|>, <|user|>, <|observation|>
        Family("glm45", "GLM-4.6.jinja",
               ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                "/nothink"),
               ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
               "<|endoftext|>", None, "<|endoftext|>", ("<|endoftext|>", "<|user|>", "<|observation|>"),
               "<|observation|>", "<|user|>", _write_glm45),
        # Kimi-K2-Instruct: eos [EOS], but generation_config stops at <|im_end|>; the role tokens are its
        # additional_special_tokens, the tool-call tokens are not (decode keeps them)
        Family("kimi_k2", "moonshotai-Kimi-K2.jinja",
               ("[EOS]", "[PAD]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"),
               ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
               "[EOS]", None, "[PAD]", ("<|im_end|>", "[EOS]"), "<|im_end|>", "<|im_end|>", _write_kimi_k2),
        # DeepSeek-V3.1: only bos/eos/pad special; role, think and tool tokens are added with special=False
        Family("deepseekv31", "deepseek-ai-DeepSeek-V3.1.jinja",
               ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"),
               ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", *_DS, "<｜tool▁output▁begin｜>",
                "<｜tool▁output▁end｜>"),
               "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<｜▁pad▁｜>", ("<｜end▁of▁sentence｜>",),
               "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>", _write_deepseekv31),
        # gpt-oss (o200k_harmony): every harmony token special; eos <|return|>, generation_config adds
        # <|call|> and <|endoftext|>
        Family("gpt-oss", "openai-gpt-oss-120b.jinja",
               ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>",
                "<|endoftext|>"),
               (), "<|return|>", None, "<|endoftext|>", ("<|return|>", "<|call|>", "<|endoftext|>"),
               "<|call|>", "<|return|>", _write_gpt_oss),
        # Llama-3.1-8B-Instruct: all special; eos <|eot_id|>, generation_config adds <|end_of_text|>, <|eom_id|>
        Family("llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja",
               ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|eom_id|>", "<|python_tag|>"),
               (), "<|eot_id|>", "<|begin_of_text|>", None, ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
               "<|eot_id|>", "<|eot_id|>", _write_llama3),
        # Mistral-Nemo-Instruct-2407 (tekken): the control tokens are all special
        Family("mistral", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
               ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
               (), "</s>", "<s>", None, ("</s>",), "</s>", "</s>", _write_mistral),
    )
}  # fmt: skip


@dataclass(frozen=True)
class HistoryNeeds:
    """What a family's template wants of the conversation it renders; a template not given it raises or garbles."""

    arguments_object: bool = True  # tool_calls[].function.arguments a dict, not a JSON string
    content_string: bool = False  # an assistant message's content a string ("" beside calls), never None
    call_id: str | None = None  # the pattern every call's id and every tool_call_id must match
    one_call: bool = False  # at most one call per assistant message
    reply_before_user: bool = False  # an assistant reply between tool results and the next user message
    note: str = ""


HISTORY_NEEDS: dict[str, HistoryNeeds] = {
    "qwen25": HistoryNeeds(note="a string's arguments are written quoted (tojson)"),
    "qwen3": HistoryNeeds(arguments_object=False, content_string=True, note="a None content raises"),
    "qwen3_coder": HistoryNeeds(note="the template iterates the arguments' items: a string raises"),
    "glm45": HistoryNeeds(note="the template raises on arguments that are not a mapping"),
    "kimi_k2": HistoryNeeds(note="calls are written functions.NAME:i whatever their ids; a tool message shows "
                            "its tool_call_id as '## Return of ID'"),
    "deepseekv31": HistoryNeeds(note="a string's arguments are written quoted (tojson)"),
    "gpt-oss": HistoryNeeds(one_call=True, note="only a message's first call is written; a tool message needs "
                            "an assistant call before it; reasoning goes in 'thinking'"),
    "llama3": HistoryNeeds(one_call=True, note="more calls raise; the tools are written into the first user "
                           "message, so one must follow the system message"),
    "mistral": HistoryNeeds(call_id="[A-Za-z0-9]{9}", reply_before_user=True,
                            note="user and assistant alternate apart from calls and results: a user message "
                            "right after tool results raises; ids of another length raise (mistral_call_id)"),
}  # fmt: skip


# ---- tokenizers and replies ------------------------------------------------------------------------------------
@functools.cache
def family_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """Gyre's byte-level tokenizer with the family's markers and its real chat template (shared: only read it)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from gyre.engine.models import _byte_chars

    family = FAMILIES[name]
    path = templates_dir() / family.template
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: {_OFFLINE_HINT}")
    tok = Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(_byte_chars())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in family.special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.added])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=family.eos,
        bos_token=family.bos,
        pad_token=family.pad,
        chat_template=path.read_text(encoding="utf-8"),
        clean_up_tokenization_spaces=False,
    )


def reply_text(
    name: str,
    *,
    reasoning: str | None = None,
    content: str = "",
    calls: Calls = (),
    end: bool = True,
) -> str:
    """The text family ``name``'s model samples for a reply, with the token it stops at when ``end``.

    ``reasoning=None`` writes no reasoning block (thinking off); families that never reason refuse reasoning.
    Markers are written as their text; `family_tokenizer` encodes each to its one id."""
    family = FAMILIES[name]
    text = family.write(reasoning, content, calls)
    return text + (family.call_end if calls else family.reply_end) if end else text
