"""The model families under hostile input (issue 55): no 5xx, every call recorded, every continuation chained.

    python benchmarks/fuzz_families.py [--requests 3000] [--families qwen3,gpt-oss,glm45] [--seed 0]

Each family (``--families``, default Qwen3, gpt-oss and GLM-4.5; ``all`` for every one) gets a model directory with
its real chat template and markers (``tests/model_families.py``), a scripted model whose replies are hostile in the
family's own format (cut mid-call and mid-reasoning, malformed calls, unknown tools and odd names and arguments, huge
arguments and reasoning, reasoning only, markers nested, random marker soup, its terminator mid-reply, multi-byte
characters a cut splits, an echo of the prompt), and a router in front of it. ``--requests`` seeded requests go to
those routers, ``--concurrency`` at once (3% hung up on mid-call): chat, Messages, Responses and completions bodies
with the family's markers typed in user text, reasoning sent back (``reasoning_content``, ``thinking`` and
``redacted_thinking`` blocks, ``reasoning`` items) right and wrong, ``chat_template_kwargs`` right and wrong (not an
object, huge, deep, keys that clash with what the template is always given or names it calls), each naming the reply
it gets (``pick:N``); the hostile values beneath them are ``fuzz_router.py``'s generator's. Beside them, on each
family's router, chained conversations through every face, streamed and not, send each reply back as the client got
it. Once the routers stop, every call the scripted model was sent must have a record whose input, expanded through
its parents, is exactly what was sent (none lost, none phantom), and every later call of a conversation must extend
the one before it (none mis-chained, none broken without saying why). Prints the tables and writes
``benchmarks/results/fuzz_families.json``.

``fuzz_router.py`` runs this part after its own (``--targets families``, in its default targets), through `run`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import re
import shutil
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from fuzz_router import HOSTILE_TEXT, Generator
from gyre.engine.scripted import ScriptedEngine
from gyre.journal import read_journal
from gyre.journal.records import CallRecord, expand_inputs
from gyre.router.spawn import launch_router

BASH: Any = {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}  # fmt: skip
ANTHROPIC_BASH: Any = {
    "name": "bash",
    "description": "Run a command.",
    "input_schema": BASH["function"]["parameters"],
}
BARE_BASH: Any = {"name": "bash", "input_schema": {}}  # no description: gpt-oss's template refuses it
DEFAULT_FAMILIES = (
    "qwen3,gpt-oss,glm45"  # the reasoning families, three call formats (tests/model_families.py)
)


@dataclass(frozen=True)
class FamilyTarget:
    """What the generator knows of one family's router: its fuzz session, markers and replies."""

    token: str  # the fuzz session on that router
    markers: tuple[str, ...]  # every text that is one token in the family's tokenizer
    replies: int  # hostile replies the model has (`family_replies`), picked by ``pick:N`` in the last message
    cheap: int  # the first ``cheap`` of them stream cheaply; the rest are asked for only unstreamed


# the reply a request asks the family's model for: the last one its prompt names
PICK = re.compile(r"pick:(\d{1,6})")
ECHO = "\x00echo\x00"  # the reply that copies the end of its prompt, markers and terminators included
MALFORMED: dict[str, list[str]] = {  # per family: broken calls and reasoning its parser must survive
    "qwen3": ['<tool_call>\n{"name": "bash", "arguments": {</tool_call>', "<tool_call>\n[1, 2]\n</tool_call>",
              '<tool_call>\n{"name": 5, "arguments": []}\n</tool_call>', '<tool_call>\n{"arguments": {}}\n</tool_call>',
              "<tool_call>", "</tool_call>", "<think>", "</think>", "</think></think><think>",
              '<think>\n<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>\n</think>\n\n',
              '<tool_call>\n<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>\n</tool_call>'],
    "glm45": ["<tool_call>bash\n<arg_key>command</arg_key>\n</tool_call>",
              "<tool_call>\n<arg_value>x</arg_value>\n</tool_call>",
              "<tool_call>bash\n<arg_key>a</arg_key><arg_key>b</arg_key><arg_value>1</arg_value></tool_call>",
              '<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>{"unclosed": </arg_value>\n</tool_call>',
              "<tool_call>bash\n<arg_key>c</arg_key>\n<arg_value>1</arg_value>\n<arg_key>c</arg_key>\n"
              "<arg_value>2</arg_value>\n</tool_call>",
              "<tool_call></tool_call>", "<arg_key>", "\n<think>", "</think>\n<think></think></think>",
              "\n<think><tool_call>bash\n</tool_call></think>\n<tool_call><tool_call>bash\n</tool_call>"],
    "gpt-oss": ["<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{not json",
                "<|channel|>commentary to=<|message|>{}", "<|channel|><|message|>", "<|message|>x",
                "<|start|>assistant<|start|>assistant", "<|channel|>analysis<|message|>never ended",
                "<|channel|>final<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b",
                '<|channel|>commentary to=functions.bash<|message|>{"command":"ls"}',
                '<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{"path":"/"}',
                "<|channel|>analysis<|message|><|channel|>final<|message|>x<|end|>",
                "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>[1,2]",
                "<|channel|>nonsense<|message|>x<|end|>", "<|end|><|end|><|start|>"],
}  # fmt: skip


def _tests_on_path() -> None:
    """`tests/` importable: the families' templates, tokenizers and replies (`model_families`)."""
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def family_replies(family: str) -> tuple[list[str], int]:
    """The replies of ``family``'s model, most of them hostile, and how many come first that stream cheaply (under
    ~600 tokens: the scripted engine's stream is quadratic in the reply); the rest are huge (100,000 characters: cut
    at the context). The first reasons again after its text (`chain_probe` opens with it); then cut mid-call and
    mid-reasoning, malformed, unknown tools and names, odd arguments, only reasoning, markers nested, random marker
    soup, a terminator mid-reply, multi-byte characters, an empty reply, an echo of the prompt."""
    _tests_on_path()
    from model_families import FAMILIES, reply_text

    fam = FAMILIES[family]

    def reply(reasoning: str | None = None, content: str = "", calls: Any = ()) -> str:
        """`reply_text`, or "" where the family cannot write it (reasoning where it never reasons, two calls for
        gpt-oss)."""
        try:
            return reply_text(family, reasoning=reasoning, content=content, calls=calls)
        except ValueError:
            return ""

    reasons = family in ("qwen3", "glm45", "gpt-oss", "deepseekv31")

    def think(text: str) -> str | None:
        return text if reasons else None

    call = [("bash", {"command": "ls"})]
    whole = reply(think("I should look first."), "Looking.", call)
    answer = reply(think("That is all."), "All done.")
    # reasoning again after the text, then the call: gpt-oss's harmony writes its messages in any order (analysis,
    # a commentary preamble, analysis, the call); the tag formats write it only when hostile
    interleaved = whole
    if family == "gpt-oss":
        interleaved = "<|start|>assistant".join([
            "<|channel|>analysis<|message|>I should look first.<|end|>",
            "<|channel|>commentary<|message|>Looking.<|end|>",
            "<|channel|>analysis<|message|>Then ls.<|end|>",
            '<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{"command":"ls"}<|call|>',
        ])  # fmt: skip
    elif reasons:
        head = reply_text(family, reasoning="I should look first.", content="Looking.", end=False)
        interleaved = head + reply("Then ls.", "", call)
    rng = random.Random(family)  # the same replies every run
    soup = [*fam.markers, "x", "\n", '{"name": "bash", "arguments": ', "}", "bash", "functions.bash", " "]
    odd_arguments = [{}, {"command": None}, {"command": [1, {"a": []}]}, json.loads('{"a":' * 50 + "1" + "}" * 50),
                     {"command": "".join(fam.markers)}]  # fmt: skip
    cheap = [
        interleaved, whole, answer, reply(think("Only thinking.")), reply(content="No thinking."),
        answer[: answer.find("That is") + 4],  # cut in the reasoning (the engine appends its end)
        *[whole[: len(whole) * k // 5] for k in range(1, 5)],  # cut in the call
        reply(content="Cleaning up.", calls=[("rm_rf", {"path": "/"})]),  # a tool nobody offered
        *[reply(calls=[(n, {"command": "ls"})]) for n in ("", "functions.bash", "bash\n<arg_key>", "b" * 300)],
        *[reply(calls=[("bash", arguments)]) for arguments in odd_arguments],
        reply(think("Many."), calls=[("bash", {"command": f"echo {i}"}) for i in range(8)]),
        reply(think(whole), answer),  # a whole reply inside the reasoning and the text
        reply(content=whole), reply(calls=[("bash", {"command": whole})]),
        *[m + end for m in MALFORMED.get(family, []) for end in ("", fam.reply_end)],
        *["".join(rng.choice(soup) for _ in range(rng.randint(1, 30))) for _ in range(12)],
        "Before." + fam.reply_end + "After.",  # its terminator in mid-reply
        whole + answer,  # a second turn after the first's terminator
        # characters of several bytes, which a cut (max_tokens) splits: every byte is a token here
        reply(think("思考😀\u2028"), "答え😀\u0085", [("bash", {"command": "echo 😀 \u2029 é"})]),
        fam.reply_end,  # an empty reply
        ECHO,
    ]  # fmt: skip
    huge = [
        reply(think("Big."), calls=[("bash", {"command": "x" * 100_000})]),
        reply(think("y" * 100_000), "Done."),
        reply(content="z" * 100_000),
    ]
    cheap = [r for r in cheap if r]
    return cheap + [r for r in huge if r], len(cheap)


def family_script(tokenizer: Any, replies: list[str], cheap: int) -> Callable[[list[int]], str]:
    """The family's model: the reply the prompt's last ``pick:N`` names (where none does, a cheap one chosen by the
    prompt's hash); `ECHO` copies the prompt's last 300 characters."""

    def reply(ids: list[int]) -> str:
        text = tokenizer.decode(ids, skip_special_tokens=False)
        found = PICK.findall(text)
        chosen = (
            replies[int(found[-1]) % len(replies)]
            if found
            else replies[zlib.crc32(str(ids).encode()) % cheap]
        )
        return text[-300:] if chosen == ECHO else chosen

    return reply


@dataclass(frozen=True)
class ServedFamily:
    """One family's router in front of its scripted model; the engine keeps every request it was sent."""

    name: str
    engine: ScriptedEngine
    url: str
    admin: str
    journal: Path  # the router's calls.jsonl
    markers: tuple[str, ...]
    replies: int
    cheap: int


@contextlib.contextmanager
def serve_family(name: str, tmp: Path, overrides: list[str]) -> Iterator[ServedFamily]:
    """Family ``name``'s model directory (its tokenizer and real chat template; no weights), its scripted model, and
    a router in front of it journaling to a folder of its own."""
    _tests_on_path()
    from model_families import FAMILIES, family_tokenizer

    model = tmp / f"family-{name}"
    tokenizer = family_tokenizer(name)
    tokenizer.save_pretrained(model)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))  # the context it reads
    replies, cheap = family_replies(name)
    script = family_script(tokenizer, replies, cheap)
    with ScriptedEngine(tokenizer, script, stops=FAMILIES[name].stops) as engine:
        proc, admin = launch_router(model, [engine.url], journal_dir=model / "journal", overrides=overrides,
                                    log_path=model / "router.log")  # fmt: skip
        with proc:
            yield ServedFamily(name, engine, proc.url, admin, model / "journal" / "calls.jsonl",
                               FAMILIES[name].markers, len(replies), cheap)  # fmt: skip


class FamilyGenerator(Generator):
    """`Generator`'s hostile values in requests to the families' routers, each naming the (hostile) reply it gets."""

    def __init__(self, seed: int, families: dict[str, FamilyTarget]) -> None:
        super().__init__(seed, "")
        self.targets = set()  # the main router's targets: none here
        self.families = families  # the family routers' requests go to, by family

    def family(self) -> tuple[str, str, str, dict[str, str], bytes]:
        """A request to a family's router: near-valid chat, Messages, Responses or completions bodies with the
        family's markers typed in user text, reasoning sent back (``reasoning_content``, ``thinking`` blocks,
        ``reasoning`` items) right and wrong, ``chat_template_kwargs`` right and wrong, and the pick of the model's
        (hostile) reply; a few malformed."""
        rng = self.rng
        name = rng.choice(sorted(self.families))
        fam = self.families[name]
        path = rng.choice(["chat/completions"] * 5 + ["messages"] * 2 + ["responses"] * 3 + ["completions"])
        stream = rng.random() < 0.3
        pick = f" pick:{rng.randrange(fam.cheap if stream else fam.replies)}"  # huge replies only unstreamed
        if path == "messages":
            body: Any = self.family_messages(fam, pick, stream)
        elif path == "responses":
            body = self.family_responses(fam, pick, stream)
        elif path == "completions":
            body = {"model": "default", "prompt": self.family_text(fam) + pick, "stream": stream,
                    "max_tokens": rng.choice([None, 1, 16, 512])}  # fmt: skip
        else:
            body = self.family_chat(fam, pick, stream)
        raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()
        if rng.random() < 0.03:
            raw = raw[: rng.randint(0, len(raw))]
        return name, "POST", f"/s/{fam.token}/v1/{path}", {"content-type": "application/json"}, raw

    def family_text(self, fam: FamilyTarget) -> str:
        """Text with the family's markers typed in: unbalanced, nested, beside JSON and hostile text."""
        rng = self.rng
        bits = ["", "x", "\n", '{"name": "bash", "arguments": {"command": "ls"}}', "bash\n", "functions.bash"]
        pieces = [rng.choice(fam.markers) + rng.choice(bits) for _ in range(rng.randint(0, 6))]
        return rng.choice(HOSTILE_TEXT) + "".join(pieces) + "hi"

    def reasoning(self, fam: FamilyTarget) -> Any:
        """A reasoning text sent back: plain, marked, empty, long, or not text at all."""
        rng = self.rng
        return rng.choice(["I thought.", "", self.family_text(fam), "r" * 20_000, None, self.junk(), ["a"],
                           {"text": "a"}])  # fmt: skip

    def template_kwargs(self, fam: FamilyTarget) -> Any:
        """``chat_template_kwargs``: switches the templates read, values of other types, not an object, huge, deep,
        and keys that clash with what the template is always given or names it calls."""
        rng = self.rng
        kind = rng.random()
        if kind < 0.3:
            key = rng.choice(
                ["enable_thinking", "thinking", "reasoning_effort", "builtin_tools", "model_identity"]
            )
            return {
                key: rng.choice([True, False, "high", None, self.family_text(fam), ["browser"], self.junk()])
            }
        if kind < 0.45:
            return self.junk()  # mostly not an object
        if kind < 0.5:
            return rng.choice([{f"k{i}": i for i in range(20_000)}, {"pad": "x" * 1_000_000},
                               json.loads('{"a":' * 200 + "1" + "}" * 200)])  # fmt: skip
        clash = rng.choice(["messages", "tools", "documents", "add_generation_prompt", "tokenize", "bos_token",
                            "eos_token", "pad_token", "chat_template", "continue_final_message", "return_dict",
                            "raise_exception", "strftime_now", "tojson", "namespace", "range", "loop", "custom_tools",
                            "tools_in_user_message", "date_string", "add_vision_id", ""])  # fmt: skip
        return {clash: rng.choice([self.junk(), self.family_text(fam), [{"role": "user", "content": "x"}]])}

    def family_chat(self, fam: FamilyTarget, pick: str, stream: bool) -> dict[str, Any]:
        rng = self.rng
        messages: list[Any] = [{"role": "user", "content": self.family_text(fam)}]
        if rng.random() < 0.5:  # a history: an assistant turn with its reasoning, maybe a call and its result
            call_id = rng.choice(["c1", "call_0", "abcDEF000", "", 5])
            content = rng.choice(["", None, "Looking.", self.family_text(fam)])
            assistant: dict[str, Any] = {
                "role": "assistant",
                "reasoning_content": self.reasoning(fam),
                "content": content,
            }
            messages.append(assistant)
            if rng.random() < 0.7:
                arguments = rng.choice(['{"command": "ls"}', "{", self.family_text(fam), {"command": "ls"},
                                        self.junk()])  # fmt: skip
                name = rng.choice(["bash", "bash", "rm_rf", "", self.family_text(fam)])
                assistant["tool_calls"] = [{"id": call_id, "type": "function",
                                            "function": {"name": name, "arguments": arguments}}]  # fmt: skip
                messages.append({"role": "tool", "tool_call_id": call_id, "content": self.family_text(fam)})
            messages.append({"role": "user", "content": self.family_text(fam)})
        messages[-1]["content"] += pick
        body: dict[str, Any] = {"model": "default", "messages": messages, "stream": stream,
                                "tools": [BASH] if rng.random() < 0.8 else self.junk(),
                                "max_tokens": rng.choice([None, None, None, 1, 2, 5, 17, 64, 4096])}  # fmt: skip
        if rng.random() < 0.4:
            body["chat_template_kwargs"] = self.template_kwargs(fam)
        if stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": rng.random() < 0.5}
        for name in ("top_k", "tool_choice", "separate_reasoning", "return_token_ids", "logprobs"):
            if rng.random() < 0.05:
                body[name] = self.junk()
        return body

    def family_messages(self, fam: FamilyTarget, pick: str, stream: bool) -> dict[str, Any]:
        rng = self.rng
        messages: list[Any] = [{"role": "user", "content": self.family_text(fam)}]
        if rng.random() < 0.6:  # an assistant turn sent back: thinking blocks (signed or not), text, tool use
            blocks = [{"type": "thinking", "thinking": self.reasoning(fam),
                       "signature": rng.choice(["", "sig", self.junk()])}]  # fmt: skip
            if rng.random() < 0.2:
                blocks.append({"type": "redacted_thinking", "data": rng.choice(["abc", self.junk()])})
            if rng.random() < 0.3:
                blocks.append(blocks[0])  # two thinking blocks
            blocks.append({"type": "text", "text": self.family_text(fam)})
            use = rng.random() < 0.6
            if use:
                blocks.append({"type": "tool_use", "id": "t1", "name": rng.choice(["bash", "rm_rf", ""]),
                               "input": rng.choice([{"command": "ls"}, self.junk()])})  # fmt: skip
            if rng.random() < 0.2:
                rng.shuffle(blocks)  # thinking after the text, the call before it
            messages.append({"role": "assistant", "content": blocks})
            after: list[Any] = [{"type": "text", "text": self.family_text(fam)}]
            if use:
                after.insert(
                    0, {"type": "tool_result", "tool_use_id": "t1", "content": self.family_text(fam)}
                )
            messages.append({"role": "user", "content": after})
        last = messages[-1]
        if isinstance(last["content"], str):
            last["content"] += pick
        else:
            last["content"].append({"type": "text", "text": pick})
        body: dict[str, Any] = {"model": "default", "messages": messages, "stream": stream,
                                "max_tokens": rng.choice([1, 16, 512, 4096]),
                                "tools": [ANTHROPIC_BASH if rng.random() < 0.8 else BARE_BASH]}  # fmt: skip
        if rng.random() < 0.4:
            body["thinking"] = rng.choice([{"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"},
                                           {"type": "enabled", "budget_tokens": -1}, self.junk()])  # fmt: skip
        if rng.random() < 0.1:
            body["system"] = self.family_text(fam)
        return body

    def family_responses(self, fam: FamilyTarget, pick: str, stream: bool) -> dict[str, Any]:
        rng = self.rng
        items: list[Any] = [{"type": "message", "role": "user", "content": self.family_text(fam)}]
        if rng.random() < 0.6:  # a turn sent back: its reasoning item, a call and the call's output
            reasoning: dict[str, Any] = {"type": "reasoning", "id": rng.choice(["rs_1", "", 5])}
            for key, part in (("content", "reasoning_text"), ("summary", "summary_text")):
                if rng.random() < 0.6:
                    reasoning[key] = rng.choice([[{"type": part, "text": self.reasoning(fam)}], self.junk()])
            if rng.random() < 0.2:
                reasoning["encrypted_content"] = rng.choice(["gAAAA", self.junk()])
            items += [reasoning, {"type": "function_call", "call_id": "c1", "name": rng.choice(["bash", "rm_rf"]),
                                  "arguments": rng.choice(['{"command": "ls"}', "{", self.family_text(fam)])},
                      {"type": "function_call_output", "call_id": "c1", "output": self.family_text(fam)},
                      {"type": "message", "role": "user", "content": self.family_text(fam)}]  # fmt: skip
            if rng.random() < 0.2:
                items.insert(rng.randrange(len(items)), reasoning)  # a reasoning item out of place
        items[-1]["content"] += pick
        body: dict[str, Any] = {"model": "default", "input": items, "stream": stream,
                                "tools": [{"type": "function", **BASH["function"]}],
                                "max_output_tokens": rng.choice([None, None, 1, 16, 512])}  # fmt: skip
        if rng.random() < 0.3:
            body["reasoning"] = rng.choice([{"effort": "high", "summary": "auto"}, self.junk()])
        if rng.random() < 0.2:
            body["chat_template_kwargs"] = self.template_kwargs(fam)
        if rng.random() < 0.15:
            body["previous_response_id"] = rng.choice(self.response_ids or ["resp_nope"])
        return body


def _error_message(text: str) -> str:
    """An error answer's message (OpenAI's and Anthropic's bodies both hold ``error.message``)."""
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return str(json.loads(text)["error"]["message"])
    return text


def _events(text: str) -> list[Any]:
    """The JSON data of a server-sent event stream, in order ([DONE] left out)."""
    lines = [line[5:] for line in text.splitlines() if line.startswith("data:")]
    return [json.loads(line) for line in lines if line.strip() != "[DONE]"]


def _chat_message(events: list[Any]) -> dict[str, Any]:
    """A streamed chat reply's assistant message, its deltas joined."""
    content, reasoning = "", ""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in events:
        for choice in chunk.get("choices") or []:
            delta = choice["delta"]
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                empty = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                whole = calls.setdefault(call["index"], empty)
                whole["id"] += call.get("id") or ""
                for key in ("name", "arguments"):
                    whole["function"][key] += (call.get("function") or {}).get(key) or ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def _message_blocks(events: list[Any]) -> list[dict[str, Any]]:
    """A streamed Messages reply's content blocks, rebuilt from its events."""
    blocks: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.get("type") == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif event.get("type") == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            for key, field in (("text_delta", "text"), ("thinking_delta", "thinking"), ("signature_delta", "signature"),
                               ("input_json_delta", "partial_json")):  # fmt: skip
                if delta["type"] == key:
                    block[field] = block.get(field, "") + delta[field]
        elif event.get("type") == "content_block_stop" and "partial_json" in blocks[event["index"]]:
            block = blocks[event["index"]]
            block["input"] = json.loads(block.pop("partial_json") or "{}")
    return [blocks[i] for i in sorted(blocks)]


async def chain_probe(
    http: httpx.AsyncClient, served: ServedFamily, seed: int, stop: asyncio.Event
) -> list[dict[str, Any]]:
    """Conversations on one family's router until ``stop``, each in a session of its own and through one face (chat,
    Messages, or Responses continued by ``previous_response_id`` or by sending the output back; streamed or not):
    the client sends each reply back as it got it (or without its reasoning, as some clients do), then a result for
    each call or a user turn, each turn picking the model's next (hostile) reply; chat conversations sometimes turn
    thinking off or on (``chat_template_kwargs``). The first conversations, one per face, streamed and not, are held
    whatever ``stop`` says, and open with reply 0 (reasoning after text). Per session: its execution id, face, the
    replies picked, the calls answered 2xx, and what was refused."""
    rng = random.Random(seed)
    sessions: list[dict[str, Any]] = []
    faces = ["chat", "messages", "responses", "responses replayed"]
    openings = list(
        itertools.product(faces, [False, True])
    )  # each face, streamed and not, opens with reply 0 once
    while len(sessions) < len(openings) or not stop.is_set():  # the openings whatever ``stop`` says
        execution_id = f"chain-{len(sessions)}"
        opening = len(sessions) < len(openings)
        opened = (
            await http.post(f"{served.admin}/admin/sessions", json={"execution_id": execution_id})
        ).json()
        face, stream = openings[len(sessions)] if opening else (rng.choice(faces), rng.random() < 0.5)
        base = opened["base_url"]
        drop = rng.random() < 0.3  # the reasoning is not sent back
        kwargs = rng.choice(
            [None, None, {"enable_thinking": False}, {"enable_thinking": True}, {"thinking": True}]
        )
        label = (
            face
            + " streamed" * stream
            + " without reasoning" * drop
            + f" {kwargs}" * (face == "chat" and kwargs is not None)
        )
        entry: dict[str, Any] = {"execution_id": execution_id, "face": label, "answered": 0, "refused": [],
                                 "picks": []}  # fmt: skip
        sessions.append(entry)
        history: list[Any] = []
        calls: list[tuple[str, str]] = []  # (call id, name) of the last reply's calls
        previous = None  # the last response's id
        for turn in range(rng.randint(2, 4)):
            pick = f"pick:{0 if opening and not turn else rng.randrange(served.cheap if stream else served.replies)}"
            entry["picks"].append(pick)
            limit = rng.choice([None, None, None, 8, 64])
            if face == "chat":
                history += [{"role": "tool", "tool_call_id": i, "content": f"RESULT {pick}"} for i, _ in calls] or [
                    {"role": "user", "content": f"Go on. {pick}"}]  # fmt: skip
                body: dict[str, Any] = {"model": "default", "messages": history, "tools": [BASH], "max_tokens": limit,
                                        "chat_template_kwargs": kwargs}  # fmt: skip
                path = "chat/completions"
            elif face == "messages":
                results = [{"type": "tool_result", "tool_use_id": i, "content": "RESULT"} for i, _ in calls]
                history.append(
                    {"role": "user", "content": [*results, {"type": "text", "text": f"Go on. {pick}"}]}
                )
                body = {"model": "default", "messages": history, "max_tokens": limit or 4096,
                        "tools": [ANTHROPIC_BASH]}  # fmt: skip
                path = "messages"
            else:
                items = [{"type": "function_call_output", "call_id": i, "output": "RESULT"} for i, _ in calls]
                items.append({"type": "message", "role": "user", "content": f"Go on. {pick}"})
                history += items
                body = {"model": "default", "input": items if previous else history, "max_output_tokens": limit,
                        "tools": [{"type": "function", **BASH["function"]}]}  # fmt: skip
                if previous:
                    body["previous_response_id"] = previous
                path = "responses"
            body["stream"] = stream
            resp = await http.post(f"{base}/{path}", json=body)
            events = _events(resp.text) if stream and resp.status_code == 200 else []
            failed = [e for e in events if "error" in e or e.get("type") in ("error", "response.failed")]
            if resp.status_code != 200 or failed:
                entry["refused"].append(
                    {"turn": turn, "status": resp.status_code, "answer": resp.text[-300:]}
                )
                break
            entry["answered"] += 1
            if face == "chat":
                message = _chat_message(events) if stream else resp.json()["choices"][0]["message"]
                history.append({k: v for k, v in message.items() if not (drop and k == "reasoning_content")})
                calls = [(c["id"], c["function"]["name"]) for c in message.get("tool_calls") or []]
            elif face == "messages":
                blocks = _message_blocks(events) if stream else resp.json()["content"]
                history.append(
                    {
                        "role": "assistant",
                        "content": [b for b in blocks if not (drop and b["type"] == "thinking")],
                    }
                )
                calls = [(b["id"], b["name"]) for b in blocks if b["type"] == "tool_use"]
            else:
                response = events[-1]["response"] if stream else resp.json()
                previous = response["id"] if face == "responses" else None
                history += [
                    o for o in response["output"] if not (drop and o["type"] == "reasoning")
                ]  # replayed
                calls = [
                    (o["call_id"], o["name"]) for o in response["output"] if o["type"] == "function_call"
                ]
            if stop.is_set() and not opening:
                break
    return sessions


def check_family(served: ServedFamily, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """Once the router has stopped: every call the engine was sent has a record whose input, expanded through its
    parents, is exactly what was sent, and no record holds an input the engine never saw (lost and phantom calls);
    and in each chained conversation every call after the first extends the one before it (mis-chained: it names
    another parent; broken: it names none and does not say why; unchained: its record says why not)."""
    records = list(read_journal(served.journal, CallRecord))
    try:
        expanded = expand_inputs(records)
    except ValueError as exc:  # a parent later or missing, or a prefix of another length
        return {"records": len(records), "expand_error": str(exc), "lost": -1, "phantom": -1}
    sent = Counter(tuple(r["input_ids"]) for r in served.engine.requests)
    recorded = Counter(tuple(expanded[r.call_id]) for r in records)
    by_session: dict[str, list[CallRecord]] = {}
    for record in records:
        by_session.setdefault(record.session, []).append(record)
    chains: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    for entry in sessions:
        ours = by_session.get(entry["execution_id"], [])
        chains["lost"] += max(0, entry["answered"] - len(ours))
        for before, after in itertools.pairwise(ours):
            if after.parent_call_id == before.call_id:
                kind = "chained"
            elif after.parent_call_id is not None:
                kind = "mis-chained"
            elif after.divergence is not None:
                kind = f"unchained ({after.divergence.kind})"
            else:
                kind = "broken"
            chains[kind] += 1
            if kind in ("mis-chained", "broken"):
                examples.append(
                    {"face": entry["face"], "replies": entry["picks"], "call": after.call_id, "kind": kind}
                )
    refused = [dict(r, face=e["face"]) for e in sessions for r in e["refused"]]
    return {
        "engine_calls": sum(sent.values()),
        "records": len(records),
        "aborted": sum(r.finish_reason == "abort" for r in records),
        "lost": sum((sent - recorded).values()),
        "phantom": sum((recorded - sent).values()),
        "divergences": dict(Counter(r.divergence.kind for r in records if r.divergence is not None)),
        "conversations": len(sessions),
        "turns": sum(e["answered"] for e in sessions),
        "chains": dict(sorted(chains.items())),
        "chain_examples": examples[:5],
        "refused_echoes": len(refused),
        "refused_examples": refused[:5],
    }


async def fuzz(
    families: dict[str, ServedFamily], requests: int, concurrency: int, seed: int
) -> dict[str, Any]:
    """``requests`` generated requests to the families' routers (`FamilyGenerator.family`), ``concurrency`` at once,
    3% of them hung up on mid-call, while `chain_probe` holds conversations on each router. Per family: its
    statuses, its commonest refusals, and the conversations; any 5xx or request without an answer."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(120)) as http:
        targets: dict[str, FamilyTarget] = {}
        for name, served in families.items():
            opened = (await http.post(f"{served.admin}/admin/sessions", json={"execution_id": "fuzz"})).json()
            targets[name] = FamilyTarget(opened["token"], served.markers, served.replies, served.cheap)
        gen = FamilyGenerator(seed, targets)
        rng = random.Random(seed + 1)
        statuses: Counter[tuple[str, str]] = Counter()  # (family, status class)
        refusals: Counter[tuple[str, str]] = Counter()  # (family, a 4xx's message, its numbers as N)
        server_errors: list[dict[str, Any]] = []
        left = requests

        async def one() -> None:
            name, method, path, headers, body = gen.family()
            hang_up = rng.random() < 0.03  # mid-call, as the model replies
            try:
                resp = await http.request(method, families[name].url + path, headers=headers, content=body,
                                          timeout=0.05 if hang_up else httpx.USE_CLIENT_DEFAULT)  # fmt: skip
                status, text = resp.status_code, resp.text
            except httpx.HTTPError as exc:
                if hang_up and isinstance(exc, httpx.TimeoutException):  # as meant: not a failure
                    statuses[name, "hung up"] += 1
                    return
                status, text = 0, repr(exc)
            statuses[name, f"{status // 100}xx" if status else "no answer"] += 1
            if 400 <= status < 500:
                refusals[name, re.sub(r"\d+", "N", _error_message(text))[:100]] += 1
            if status == 200 and path.endswith("/v1/responses") and text.startswith('{"id":"resp_'):
                gen.response_ids.append(json.loads(text)["id"])  # later requests continue it
            if status >= 500 or not status:
                server_errors.append({"family": name, "path": path, "status": status, "answer": text[:300],
                                      "body": body[:300].decode("utf-8", "replace")})  # fmt: skip

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await one()

        stop = asyncio.Event()
        started = time.monotonic()
        probes = [
            asyncio.ensure_future(chain_probe(http, served, seed + 2 + i, stop))
            for i, served in enumerate(families.values())
        ]
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        stop.set()
        conversations = await asyncio.gather(*probes)
        wall_s = time.monotonic() - started
        alive = {name: (await http.get(f"{s.url}/health")).status_code == 200 for name, s in families.items()}
    return {
        "requests": requests,
        "wall_s": wall_s,
        "server_errors": len(server_errors),
        "server_error_examples": server_errors[:10],
        "families": {
            name: {
                "statuses": {bucket: n for (family, bucket), n in sorted(statuses.items()) if family == name},
                "refusals": [
                    [message, n] for (family, message), n in refusals.most_common() if family == name
                ][:8],
                "alive": alive[name],
                "conversations": sessions,
            }
            for name, sessions in zip(families, conversations, strict=True)
        },
    }


def run(names: list[str], tmp: Path, *, requests: int, concurrency: int, seed: int) -> dict[str, Any]:
    """Start each family's scripted model and router in ``tmp``, fuzz them (`fuzz`), and once the routers have
    stopped (their journals whole) check every record against what the models were sent (`check_family`)."""
    overrides = ["router.body_timeout_s=5"]
    with contextlib.ExitStack() as stack:
        served = {name: stack.enter_context(serve_family(name, tmp, overrides)) for name in names}
        result = asyncio.run(fuzz(served, requests, concurrency, seed))
    for name, family in result["families"].items():
        family |= check_family(served[name], family["conversations"])
    return result


def family_names(spec: str) -> list[str]:
    """The families ``spec`` names: comma-separated `tests/model_families.py` names, or ``all``."""
    if spec == "all":
        _tests_on_path()
        from model_families import FAMILIES

        return sorted(FAMILIES)
    return [name for name in spec.split(",") if name]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--families",
        default=DEFAULT_FAMILIES,
        help="the model families (tests/model_families.py names, or 'all') each given a router and a scripted model "
        "with hostile replies",
    )
    parser.add_argument("--requests", type=int, default=3000, help="requests to the families' routers")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fuzz_families.json")
    args = parser.parse_args()
    console = Console(width=120)
    tmp = Path(tempfile.mkdtemp(prefix="gyre-fuzz-families-"))
    try:
        result = run(family_names(args.families), tmp, requests=args.requests, concurrency=args.concurrency,
                     seed=args.seed)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(console, result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")


def report(console: Console, part: dict[str, Any]) -> None:
    """The families' tables: statuses (target: no 5xx), then calls against records (target: none lost, none
    phantom) and the chained conversations (target: none mis-chained or broken)."""
    families = part["families"]
    statuses = Table(
        title="Model families: hostile requests and replies, each family's router and scripted model"
    )
    for column in ("family", "requests", "2xx", "4xx", "5xx", "no answer", "hung up", "alive after"):
        statuses.add_column(column, justify="right")
    chains = Table(title="Model families: every engine call recorded, every continuation chained")
    for column in ("family", "engine calls", "records", "lost", "phantom", "turns", "chained", "unchained",
                   "mis-chained", "broken", "refused echoes"):  # fmt: skip
        chains.add_column(column, justify="right")
    for name, f in families.items():
        st, kinds = f["statuses"], f.get("chains", {})
        counts = (f"{st.get(k, 0):,}" for k in ("2xx", "4xx", "5xx", "no answer", "hung up"))
        statuses.add_row(name, f"{sum(st.values()):,}", *counts, str(f["alive"]))
        unchained = sum(n for kind, n in kinds.items() if kind.startswith("unchained"))
        figures = [f.get(k, "?") for k in ("engine_calls", "records", "lost", "phantom", "turns")]
        figures += [kinds.get("chained", 0), unchained, kinds.get("mis-chained", 0)]
        figures += [kinds.get("broken", 0) + kinds.get("lost", 0), f.get("refused_echoes", "?")]
        chains.add_row(name, *map(str, figures))
    console.print(statuses)
    console.print(
        f"{part['requests']:,} requests in {part['wall_s']:.0f} s; 5xx and no answer: {part['server_errors']}"
    )
    for example in part["server_error_examples"]:
        console.print(example)
    console.print(chains)
    for name, f in families.items():
        console.print(f"{name}: divergences {f.get('divergences')}; the commonest 4xx:")
        for message, n in f["refusals"]:
            console.print(f"  {n:4d}  {message}", markup=False)
        for example in [*f.get("chain_examples", []), *f.get("refused_examples", [])]:
            console.print(f"  {example}")
        if "expand_error" in f:
            console.print(f"  the journal does not expand: {f['expand_error']}")


if __name__ == "__main__":
    main()
