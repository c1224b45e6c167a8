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


def constraint(req: ChatRequest, family: str = "hermes") -> dict[str, str]:
    """The ``SamplingParams`` fields (``json_schema`` or ``ebnf``) ``req`` asks for; empty when it asks none.

    ``family`` is the model's (`gyre.router.modelfamilies`): a forced call is written in its own syntax. Raises
    `RouterError` (400) for a malformed ``response_format`` or ``tool_choice``, a named tool not offered, a schema or
    tool the grammar library refuses, and a forced call in a family whose markers a grammar cannot write (special
    tokens). May take milliseconds the first time a schema is seen: call it off the event loop."""
    answer = _answer_schema(req.response_format)
    choice = _choice(req.tool_choice, req.tools)
    if choice == "none" or (choice == "auto" and (not req.tools or answer is None)):
        return {} if answer is None else {"json_schema": _checked_schema(answer)}
    only = None if choice in ("auto", "required") else choice
    parallel = req.parallel_tool_calls is not False
    answer = answer if choice == "auto" else None
    if family in ("hermes", "qwen25", "qwen"):
        return {"ebnf": _grammar(_tool_schemas(req.tools, only), parallel, answer)}
    if family not in _SHAPES:
        raise RouterError(
            f"tool_choice {req.tool_choice!r} (and a JSON answer beside tools) is enforced with a grammar of the "
            f"model's call syntax; {family} writes its calls with special tokens, which a grammar cannot write: use "
            "tool_choice 'auto'", 400, param="tool_choice",
        )  # fmt: skip
    functions = json.dumps(_functions(req.tools, only))
    return {"ebnf": _family_grammar(functions, family, parallel, answer)}


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
    calls = [
        {"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
         "required": ["name", "arguments"]}
        for name, parameters in _functions(tools, only)
    ]  # fmt: skip
    return json.dumps(calls[0] if len(calls) == 1 else {"anyOf": calls})


def _functions(tools: list[dict[str, Any]] | None, only: str | None) -> list[tuple[str, Any]]:
    """(name, parameters schema) of the offered functions (or only the named one)."""
    out = []
    for i, tool in enumerate(tools or []):
        function = _function(tool)
        name = function.get("name")
        if not isinstance(name, str) or (only is not None and name != only):
            continue
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise RouterError(f"tools[{i}].function.parameters must be a JSON schema object", 400,
                              param=f"tools[{i}].function.parameters")  # fmt: skip
        out.append((name, parameters))
    if not out:
        raise RouterError("tool_choice asks for a tool call, but tools offers no function with a name", 400,
                          param="tools")  # fmt: skip
    return out


# How each family writes forced calls: (section opening, section closing, a call's opening with {name} (and {index}:
# a number), its closing,
# several calls allowed, arguments as "json" or as XML pairs "glm"/"coder"); markers as text (the grammar lets the
# engine write each as its token; the router reads such replies with markers as text too)
_SHAPES: dict[str, tuple[str, str, str, str, bool, str]] = {
    "kimi_k2": ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                "<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>", "<|tool_call_end|>", True,
                "json"),
    "deepseekv31": ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>",
                    "<｜tool▁call▁end｜>", True, "json"),
    "deepseekv3": ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                   "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n", "\n```<｜tool▁call▁end｜>", True,
                   "json"),
    "llama3": ("", "", '{"name": "{name}", "parameters": ', "}", False, "json"),
    "glm45": ("", "", "<tool_call>{name}\n", "</tool_call>", True, "glm"),
    "qwen3_coder": ("", "", "<tool_call>\n<function={name}>\n", "</function>\n</tool_call>", True, "coder"),
}  # fmt: skip


@functools.lru_cache(maxsize=_CHECKED_ENTRIES)
def _family_grammar(functions: str, family: str, parallel: bool, answer: str | None) -> str:
    """The EBNF text of one or more calls (just one unless ``parallel`` and the family allows more) in ``family``'s
    syntax, each to an offered function with arguments matching its schema; or else ``answer``'s JSON."""
    import xgrammar

    opening, closing, head, tail, several, arguments = _SHAPES[family]
    calls = []
    for name, schema in json.loads(functions):
        try:
            if arguments == "json":
                body = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
            else:
                body = _pairs_grammar(schema, arguments)
        except RouterError:
            raise
        except Exception as exc:
            raise RouterError(f"tools: the parameters of {name!r} cannot be enforced: {_library_error(exc)}", 400,
                              param="tools") from None  # fmt: skip
        written = (
            json.dumps(name, ensure_ascii=False)[1:-1] if family == "llama3" else name
        )  # inside a JSON string
        before, _, after = head.replace("{name}", written).partition("{index}")
        index = [xgrammar.Grammar.from_ebnf("root ::= [0-9]+"), _text(after)] if "{index}" in head else []
        calls.append(xgrammar.Grammar.concat(_text(before), *index, body, _text(tail)))
    call = calls[0] if len(calls) == 1 else xgrammar.Grammar.union(*calls)
    more = ' ("\\n"? root)*' if parallel and several else ""
    text = f"gyre_calls ::= {_literal(opening)} root{more} {_literal(closing)}\n{call}"
    grammar = xgrammar.Grammar.from_ebnf(text, root_rule_name="gyre_calls")
    if answer is not None:
        grammar = xgrammar.Grammar.union(grammar, xgrammar.Grammar.from_json_schema(answer))
    return str(grammar)


def _pairs_grammar(schema: dict[str, Any], style: str) -> Any:
    """GLM's ``<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n`` or Qwen3-Coder's ``<parameter=K>\nV\n</parameter>\n``
    for each property in order (the required ones always, the others optionally); a string's value is text without
    ``</``, any other a JSON value of its schema."""
    import xgrammar

    given = schema.get("properties")
    properties: dict[str, Any] = given if isinstance(given, dict) else {}
    required = set(schema.get("required") or [])
    parts = [_text("")]
    for key, sub in properties.items():
        sub = sub if isinstance(sub, dict) else {}
        if sub.get("type") == "string":
            value = xgrammar.Grammar.from_ebnf('root ::= ([^<] | "<" [^/])*')
        else:
            value = xgrammar.Grammar.from_json_schema(json.dumps(sub), any_whitespace=False)
        if style == "glm":
            pair = [_text(f"<arg_key>{key}</arg_key>\n<arg_value>"), value, _text("</arg_value>\n")]
        else:
            pair = [_text(f"<parameter={key}>\n"), value, _text("\n</parameter>\n")]
        joined = xgrammar.Grammar.concat(*pair)
        parts.append(joined if key in required else xgrammar.Grammar.union(joined, _text("")))
    return xgrammar.Grammar.concat(*parts) if len(parts) > 1 else parts[0]


def _literal(text: str) -> str:
    """``text`` as an EBNF string literal (JSON's escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _text(text: str) -> Any:
    import xgrammar

    return xgrammar.Grammar.from_ebnf(f"root ::= {_literal(text)}")


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
