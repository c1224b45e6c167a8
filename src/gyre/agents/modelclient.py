"""The model client an agent gets: OpenAI chat completions on its execution's router session.

``InProcessModelClient`` calls a ``Router`` in the same event loop (built-in agents in the driver);
``HttpModelClient`` speaks HTTP to ``/s/{token}/v1`` (the same thing an external scaffold uses).
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx
import msgspec

from gyre.errors import AgentError, ContextOverflow
from gyre.journal.records import Role
from gyre.router.openai_types import ChatRequest, RouterError
from gyre.router.routing import Router


class ModelClient(Protocol):
    """What an agent may do with the model."""

    async def chat(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, role: Role = "main",
        **params: Any,
    ) -> dict[str, Any]:  # fmt: skip
        """One ``chat.completion`` body, as the OpenAI API returns it."""
        ...


class InProcessModelClient:
    """Calls the router directly: no HTTP, the same semantics and the same records."""

    def __init__(self, router: Router, token: str, model: str = "") -> None:
        self.router, self.token, self.model = router, token, model or router.model_name

    async def chat(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, role: Role = "main",
        **params: Any,
    ) -> dict[str, Any]:  # fmt: skip
        try:
            req = msgspec.convert(
                {"model": self.model, "messages": messages, "tools": tools, **params}, ChatRequest
            )
        except msgspec.ValidationError as exc:
            raise AgentError(f"the agent built an invalid request: {exc}") from None
        try:
            return await self.router.chat(self.token, req, role)
        except RouterError as exc:
            kind = ContextOverflow if exc.status == 413 else AgentError
            raise kind(f"model call failed ({exc.status}): {exc}") from None


class HttpModelClient:
    """Calls a router over HTTP on ``base_url`` (``http://host:port/s/{token}/v1``)."""

    def __init__(self, base_url: str, model: str = "default", timeout_s: float = 3600.0) -> None:
        self.base_url, self.model = base_url.rstrip("/"), model
        self._http = httpx.AsyncClient(timeout=timeout_s)

    async def chat(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, role: Role = "main",
        **params: Any,
    ) -> dict[str, Any]:  # fmt: skip
        body = {"model": self.model, "messages": messages, **params}
        if tools:
            body["tools"] = tools
        resp = await self._http.post(
            f"{self.base_url}/chat/completions", json=body, headers={"X-Gyre-Role": role}
        )
        if resp.status_code != 200:
            kind = ContextOverflow if resp.status_code == 413 else AgentError
            raise kind(f"model call failed ({resp.status_code}): {resp.text[:500]}")
        data: dict[str, Any] = resp.json()
        return data

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()
