"""What a chat request asks the sampler to obey: ``response_format`` and ``tool_choice`` as grammars.

- ``response_format`` ``json_schema`` sends its schema as ``SamplingParams.json_schema``; ``json_object`` sends
  ``{"type": "object"}``.
- ``tool_choice`` ``"required"`` (any offered function) or a named function sends an EBNF grammar of the chat
  template's Hermes blocks, ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``, one or more (one when
  ``parallel_tool_calls`` is false), whose JSON is the function's name and its ``parameters`` schema.
- Tools offered with ``tool_choice`` ``"auto"`` and a JSON response format: either tool calls or the JSON answer
  (openai-agents' ``output_type`` with tools sends exactly this; the JSON alone would forbid its tool calls).
- ``"none"`` is no constraint (and the router renders no tools for it).

Grammars are xgrammar's (SGLang's default grammar backend, so what is sent to an SGLang engine is what it compiles;
the embedded engine compiles it with the same library). Each is built and checked here, off the event loop and
cached, so a schema or a tool the library refuses is a 400 that says why before any engine sees the request.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from gyre.router.openai_types import ChatRequest, RouterError

_CHECKED_ENTRIES = (
    256  # distinct (schema, tools, choice) texts whose grammar is kept: a scaffold repeats its own
)
_LIBRARY_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


def constraint(req: ChatRequest) -> dict[str, str]:
    """The ``SamplingParams`` fields (``json_schema`` or ``ebnf``) ``req`` asks for; empty when it asks none.

    Raises `RouterError` (400) for a malformed ``response_format`` or ``tool_choice``, a named tool not offered, and
    a schema or tool the grammar library refuses. May take milliseconds the first time a schema is seen: call it off
    the event loop."""
    answer = _answer_schema(req.response_format)
    choice = _choice(req.tool_choice, req.tools)
    if choice == "none" or (choice == "auto" and (not req.tools or answer is None)):
        return {} if answer is None else {"json_schema": _checked_schema(answer)}
    tools = _tool_schemas(req.tools, None if choice in ("auto", "required") else choice)
    parallel = req.parallel_tool_calls is not False
    return {"ebnf": _grammar(tools, parallel, answer if choice == "auto" else None)}


def needs_grammar(req: ChatRequest) -> bool:
    """Whether `constraint` may have a grammar to build (otherwise it only checks ``tool_choice``: no library)."""
    return req.response_format is not None or req.tool_choice not in (None, "auto", "none")


def rendered_tools(req: ChatRequest) -> list[dict[str, Any]] | None:
    """The tools the prompt shows: none for ``tool_choice: "none"`` (as SGLang), whose reply is text."""
    return None if req.tool_choice == "none" else req.tools


def _answer_schema(fmt: Any) -> str | None:
    """The JSON schema text ``response_format`` asks the answer to match; None for plain text."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return '{"type": "object"}'
    if kind != "json_schema":
        raise RouterError(f"response_format.type must be text, json_object or json_schema; got {kind!r}", 400,
                          param="response_format")  # fmt: skip
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise RouterError("response_format json_schema needs a json_schema object (name, schema, strict)", 400,
                          param="response_format.json_schema")  # fmt: skip
    schema = spec.get("schema", {})  # OpenAI: without a schema, any JSON
    if not isinstance(schema, dict | bool):
        raise RouterError(f"response_format.json_schema.schema must be a JSON schema object; got "
                          f"{type(schema).__name__}", 400, param="response_format.json_schema.schema")  # fmt: skip
    return json.dumps(schema, sort_keys=False)


def _choice(choice: Any, tools: list[dict[str, Any]] | None) -> str:
    """``"auto"``, ``"none"``, ``"required"`` or the named function's name; a 400 for anything else."""
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise RouterError('tool_choice "required" needs tools', 400, param="tool_choice")
        return str(choice)
    name = None
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else choice.get("name")
    if not isinstance(name, str) or not name:
        raise RouterError('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                          '{"name": ...}}', 400, param="tool_choice")  # fmt: skip
    offered = [_function(t).get("name") for t in tools or []]
    if name not in offered:
        raise RouterError(f"tool_choice names the function {name!r}, which tools does not offer (offered: "
                          f"{', '.join(map(str, offered)) or 'none'})", 400, param="tool_choice")  # fmt: skip
    return name


def _function(tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function if isinstance(function, dict) else {}


def _tool_schemas(tools: list[dict[str, Any]] | None, only: str | None) -> str:
    """The JSON schema of one call object of the offered functions (or only the named one), as text."""
    calls = []
    for i, tool in enumerate(tools or []):
        function = _function(tool)
        name = function.get("name")
        if not isinstance(name, str) or (only is not None and name != only):
            continue
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise RouterError(f"tools[{i}].function.parameters must be a JSON schema object", 400,
                              param=f"tools[{i}].function.parameters")  # fmt: skip
        calls.append({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"],
        })  # fmt: skip
    if not calls:
        raise RouterError("tool_choice asks for a tool call, but tools offers no function with a name", 400,
                          param="tools")  # fmt: skip
    return json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls})


def _library_error(exc: Exception) -> str:
    return _LIBRARY_PREFIX.sub("", str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))


@functools.lru_cache(maxsize=_CHECKED_ENTRIES)
def _checked_schema(schema: str) -> str:
    """``schema`` once xgrammar has accepted it (a 400 saying why it did not)."""
    import xgrammar

    try:
        xgrammar.Grammar.from_json_schema(schema)
    except Exception as exc:  # xgrammar raises RuntimeError (and its own types) with the reason
        raise RouterError(f"response_format: the JSON schema cannot be enforced: {_library_error(exc)}", 400,
                          param="response_format.json_schema.schema") from None  # fmt: skip
    return schema


@functools.lru_cache(maxsize=_CHECKED_ENTRIES)
def _grammar(calls: str, parallel: bool, answer: str | None) -> str:
    """The EBNF text of one or more tool-call blocks (just one unless ``parallel``), or else ``answer``'s JSON."""
    import xgrammar

    try:
        call = str(xgrammar.Grammar.from_json_schema(calls, any_whitespace=False))  # json.dumps' separators
    except Exception as exc:
        raise RouterError(f"tools: a function's parameters cannot be enforced: {_library_error(exc)}", 400,
                          param="tools") from None  # fmt: skip
    more = ' ("\\n" gyre_block)*' if parallel else ""
    text = f'gyre_calls ::= gyre_block{more}\ngyre_block ::= "<tool_call>\\n" root "\\n</tool_call>"\n{call}'
    grammar = xgrammar.Grammar.from_ebnf(text, root_rule_name="gyre_calls")
    if answer is not None:
        try:
            grammar = xgrammar.Grammar.union(grammar, xgrammar.Grammar.from_json_schema(answer))
        except Exception as exc:
            raise RouterError(f"response_format: the JSON schema cannot be enforced: {_library_error(exc)}",
                              400, param="response_format.json_schema.schema") from None  # fmt: skip
    return str(grammar)
