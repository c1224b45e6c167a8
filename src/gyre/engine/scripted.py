"""An engine that answers with scripted text instead of sampling: a scripted expert at the engine edge.

``ScriptedEngine`` speaks the engine's HTTP API (``/generate`` and friends) and answers each request with
``script(input_ids)``, tokenized. The router, agents and records see a real engine: `gyre eval --agent oracle` runs a
suite's scripted expert through it (the records are demonstrations), and tests use it where they need a capable
model (tool calls, a solved task) that the tiny model cannot be. Every response says ``"gyre_source": "scripted"``,
so the router records its calls with source ``scripted``: their logprobs are made up, not a policy's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre.engine.launcher import free_port

Script = Callable[[list[int]], str]  # input ids -> the reply text


class ScriptedEngine:
    """An engine that answers each ``/generate`` with ``script(input_ids)``, tokenized, then end-of-sequence.

    ``stops`` are the texts of the tokens the model's turns end with (a family's terminators): a script that writes
    its reply's own terminator gets nothing appended."""

    def __init__(
        self, tokenizer: Any, script: Script, weight_version: int = 0, stops: tuple[str, ...] = ()
    ) -> None:
        self.tokenizer, self.script, self.weight_version = tokenizer, script, weight_version
        # a reply whose text ends with one of these tokens ends there; any other gets the model's end appended:
        # <|im_end|> where the tokenizer has it (the tiny model's), else its eos
        vocab = tokenizer.get_vocab()
        self.end_id = vocab.get("<|im_end|>", tokenizer.eos_token_id)
        self.stop_ids = {vocab[t] for t in stops if t in vocab} | {self.end_id}
        self.requests: list[dict[str, Any]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(routes=[
            Route("/generate", self._generate, methods=["POST"]),
            Route("/health", self._ok, methods=["GET"]),
            Route("/abort_request", self._ok, methods=["POST"]),
            Route("/model_info", self._info, methods=["GET"]),
        ])  # fmt: skip
        self._server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="error"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()), daemon=True)

    async def _generate(self, request: Request) -> Response:
        body = msgspec.json.decode(await request.body())
        self.requests.append(body)
        ids = self.tokenizer.encode(self.script(body["input_ids"]), add_special_tokens=False)
        if not ids or ids[-1] not in self.stop_ids:
            ids.append(self.end_id)
        limit = body.get("sampling_params", {}).get("max_new_tokens") or len(ids)
        ids = ids[:limit]
        finish = (
            {"type": "stop", "matched": ids[-1]}
            if ids[-1] in self.stop_ids
            else {"type": "length", "length": len(ids)}
        )
        logprobs = [
            [-0.25, t, None] for t in ids
        ]  # a fixed behaviour logprob: the script is not a distribution
        meta: dict[str, Any] = {
            "id": body.get("rid") or "x",
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(ids),
            "weight_version": str(self.weight_version),
            "output_token_logprobs": logprobs,
            "gyre_source": "scripted",
        }
        # Text as SGLang sends it: raw UTF-8 in the JSON, U+0085 and U+2028 included (json.dumps, ensure_ascii off).
        if not body.get("stream"):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            return Response(msgspec.json.encode({"text": text, "output_ids": ids, "meta_info": meta}))
        chunks = []  # cumulative, as SGLang streams: one chunk per token, the last one finished
        for n in range(1, len(ids) + 1):
            part = {
                **meta,
                "completion_tokens": n,
                "output_token_logprobs": logprobs[:n],
            }
            part["finish_reason"] = finish if n == len(ids) else None
            text = self.tokenizer.decode(ids[:n], skip_special_tokens=True)
            chunks.append(
                b"data: " + msgspec.json.encode({"text": text, "output_ids": ids[:n], "meta_info": part})
            )
        return Response(b"\n\n".join([*chunks, b"data: [DONE]"]) + b"\n\n", media_type="text/event-stream")

    async def _ok(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _info(self, request: Request) -> Response:
        return Response(msgspec.json.encode({"weight_version": str(self.weight_version)}))

    def __enter__(self) -> ScriptedEngine:
        self._thread.start()
        while not self._server.started:
            threading.Event().wait(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
