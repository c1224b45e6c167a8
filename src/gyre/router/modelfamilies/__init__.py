"""Model families: per family, how replies hold tool calls and reasoning and how turns end (`registry`), parsed
from sampled ids with special tokens kept, whole or streamed (`replyparser`, `harmony`, `marked`).

`choose_format` picks a family by SGLang's parser names or from the chat template, and refuses a template whose
tool markup no family claims.
"""

from __future__ import annotations

from gyre.errors import ConfigError
from gyre.router.modelfamilies.harmony import HarmonyParser
from gyre.router.modelfamilies.marked import MarkedDecoder, marked_text
from gyre.router.modelfamilies.registry import FORMATS, BoundFormat, ModelFormat, detect
from gyre.router.modelfamilies.replyparser import Delta, ParsedReply, ReplyParser, ToolCall

# SGLang's reasoning parser names -> the markers that open and close reasoning
REASONING_PARSERS: dict[str, tuple[str, str]] = {
    "qwen3": ("<think>", "</think>"),
    "qwen3-thinking": ("<think>", "</think>"),
    "deepseek-r1": ("<think>", "</think>"),
    "deepseek-v3": ("<think>", "</think>"),
    "glm45": ("<think>", "</think>"),
    "kimi_k2": ("<think>", "</think>"),
    "kimi": ("◁think▷", "◁/think▷"),
    "mistral": ("[THINK]", "[/THINK]"),
}

__all__ = [
    "FORMATS",
    "REASONING_PARSERS",
    "BoundFormat",
    "Delta",
    "HarmonyParser",
    "MarkedDecoder",
    "ModelFormat",
    "ParsedReply",
    "ReplyParser",
    "ToolCall",
    "choose_format",
    "marked_text",
]


def choose_format(
    template: str, added: set[str], tool_parser: str = "", reasoning_parser: str = ""
) -> ModelFormat:
    """The format for a chat template: ``tool_parser`` / ``reasoning_parser`` by name (SGLang's), else detected.

    Reasoning is parsed when named, or when the family's reasoning opening appears in the template or is one of the
    tokenizer's ``added`` tokens; ``"none"`` turns it off. Raises `ConfigError` saying what to set."""
    import dataclasses

    if tool_parser:
        if tool_parser not in FORMATS:
            raise ConfigError(f"router.tool_parser {tool_parser!r} is not known; choose one of: "
                              f"{', '.join(sorted(FORMATS))}")  # fmt: skip
        name: str | None = tool_parser
    else:
        try:
            name = detect(template)
        except LookupError:
            raise ConfigError(
                "the chat template renders tool calls in a form Gyre does not detect; set router.tool_parser to "
                f"one of: {', '.join(sorted(FORMATS))}"
            ) from None
    fmt = FORMATS[name or "hermes"]
    if fmt.custom:
        return fmt  # harmony carries its reasoning in its channels
    if reasoning_parser == "none":
        return dataclasses.replace(fmt, reasoning=None, reasoning_parser=None)
    if reasoning_parser:
        if reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(f"router.reasoning_parser {reasoning_parser!r} is not known; choose one of: none, "
                              f"{', '.join(sorted(REASONING_PARSERS))}")  # fmt: skip
        return dataclasses.replace(fmt, reasoning=REASONING_PARSERS[reasoning_parser],
                                   reasoning_parser=reasoning_parser)  # fmt: skip
    if fmt.reasoning is not None and fmt.reasoning[0] not in template and fmt.reasoning[0] not in added:
        return dataclasses.replace(fmt, reasoning=None, reasoning_parser=None)
    return fmt
