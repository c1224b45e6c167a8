"""A router whose model is an outside OpenAI-compatible endpoint (a hosted model, a local SGLang's ``/v1``).

It gives executions the same sessions, roles and agent API as `Router`, but forwards each call to ``base_url`` and
keeps an `ApiCallRecord` (request and response as text) instead of token-exact records: without the model's tokens
and logprobs such calls serve evaluation (`gyre eval --base-url`), never training. Transient upstream failures
(connection errors, 429, 5xx) are retried with backoff within the retry budget; anything else is answered to the
agent with the upstream's status and message.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec

from gyre.config import RouterConfig
from gyre.journal import Journal
from gyre.journal.records import ApiCallRecord, CallTiming, Role
from gyre.router.openai_types import ChatRequest, CompletionRequest, RouterError
from gyre.router.pool import CallControl, EnginePool
from gyre.router.routing import Router
from gyre.router.sessions import SessionStore

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
GYRE_ONLY_FIELDS = ("return_token_ids",)  # our extensions, not sent to an outside model


class UpstreamRouter(Router):
    """`Router`'s agent-facing surface over an outside OpenAI-compatible model (see the module)."""

    def __init__(self, cfg: RouterConfig, base_url: str, api_key: str = "", model: str = "") -> None:
        """``base_url`` ends before ``/chat/completions`` (e.g. ``https://host/v1``); ``model`` is sent upstream."""
        if not base_url.startswith(("http://", "https://")):
            raise RouterError(f"upstream base URL {base_url!r} must start with http:// or https://", 400)
        self.cfg = cfg
        self.base_url = base_url.rstrip("/")
        self.upstream_model = model or cfg.model_name or "default"
        self.model_name = cfg.model_name or self.upstream_model
        self.pool = EnginePool.from_config(cfg)  # stays empty
        self.sessions = SessionStore()
        self.journal = (
            Journal(cfg.journal_dir, "api_calls.jsonl", cfg.journal_fsync) if cfg.journal_dir else None
        )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=cfg.request_timeout_s)

    async def aclose(self) -> None:
        """Close the HTTP client and the journal."""
        await self._http.aclose()
        if self.journal is not None:
            self.journal.close()

    async def chat(
        self, token: str, req: ChatRequest, role: Role = "main", control: CallControl | None = None
    ) -> dict[str, Any]:
        """One ``chat.completion`` from the outside model."""
        return await self._call(token, "chat/completions", req, role)

    async def chat_stream(
        self, token: str, req: ChatRequest, role: Role = "main", control: CallControl | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The call made whole upstream, then handed out as chunks (content, tool calls, finish, usage)."""
        body = await self._call(token, "chat/completions", msgspec.structs.replace(req, stream=False), role)
        base = {k: body.get(k) for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        choice = body["choices"][0]
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        yield {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        if message.get("tool_calls"):
            calls = [{"index": i, **tc} for i, tc in enumerate(message["tool_calls"])]
            yield {**base, "choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]}
        yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]}
        if (req.stream_options or {}).get("include_usage") and body.get("usage"):
            yield {**base, "choices": [], "usage": body["usage"]}

    async def complete(
        self, token: str, req: CompletionRequest, role: Role = "main", control: CallControl | None = None
    ) -> dict[str, Any]:
        """One ``text_completion`` from the outside model."""
        return await self._call(token, "completions", req, role)

    async def _call(
        self, token: str, endpoint: str, req: ChatRequest | CompletionRequest, role: Role
    ) -> dict[str, Any]:
        session = self.session(token)
        self._check_model(req.model)
        submitted = time.time()
        body = {
            k: v for k, v in msgspec.to_builtins(req).items() if v is not None and k not in GYRE_ONLY_FIELDS
        }
        body["model"] = self.upstream_model
        response = await self._post(endpoint, body)
        usage = response.get("usage") or {}
        record = ApiCallRecord(
            call_id=str(response.get("id") or uuid.uuid4().hex),
            session=session.execution_id,
            role=role,
            endpoint="completions" if endpoint == "completions" else "chat/completions",
            request=body,
            response=response,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            timing=CallTiming(submitted_s=submitted, first_token_s=None, finished_s=time.time()),
        )
        if self.journal is not None:  # journaled before the agent sees the response
            self.journal.append(record)
        session.api_calls.append(record)
        session.calls += 1
        return response

    async def _post(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/{endpoint}"
        failure = ""
        for attempt in range(self.cfg.retry_budget + 1):
            if attempt:
                await asyncio.sleep(min(0.5 * 2 ** (attempt - 1), 30.0))
            try:
                resp = await self._http.post(url, json=body)
            except httpx.HTTPError as exc:
                failure = f"cannot reach {url}: {exc!r}"
                continue
            if resp.status_code in RETRY_STATUSES:
                failure = f"{url} answered {resp.status_code}: {resp.text[:300]}"
                continue
            if resp.status_code != 200:
                raise RouterError(f"the upstream model refused the call: {_message(resp)}", resp.status_code)
            try:
                data: dict[str, Any] = resp.json()
                data["choices"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                raise RouterError(
                    f"{url} answered with no choices: {resp.text[:300]}", 502, "api_error"
                ) from None
            return data
        raise RouterError(
            f"the upstream model failed {self.cfg.retry_budget + 1} times; last: {failure}", 503, "api_error"
        )


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:300]
