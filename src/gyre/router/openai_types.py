"""OpenAI request bodies the router accepts (msgspec Structs) and the error type it answers with."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from gyre.errors import GyreError

Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
MaxTokens = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class RouterError(GyreError):
    """An OpenAI-style error answered to the client: HTTP ``status``, ``type`` and optional ``param``."""

    def __init__(
        self, message: str, status: int = 400, type_: str = "invalid_request_error", param: str | None = None
    ):
        super().__init__(message)
        self.status, self.type, self.param = status, type_, param

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.status}}


class ChatRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/chat/completions``. Unknown fields are ignored, as scaffolds send vendor extras."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1)] | None = (
        None  # SGLang's and vLLM's extension; -1 or 0: no limit
    )
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: Annotated[int, msgspec.Meta(ge=1)] = 1
    logprobs: bool = False
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None  # {"type": "text" | "json_object" | "json_schema", ...}
    user: str | None = None
    return_token_ids: bool = False  # Gyre extension: prompt_token_ids and token_ids in the response
    chat_template_kwargs: dict[str, Any] | None = (
        None  # passed to the chat template (SGLang's and vLLM's field)
    )


class CompletionRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/completions``: a raw prompt (text or token ids), no chat template."""

    model: str
    prompt: str | list[int | str]  # text, token ids, or a list holding one text
    max_tokens: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] | None = 16
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    stream: bool = False
    n: Annotated[int, msgspec.Meta(ge=1)] = 1
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    echo: bool = False
    user: str | None = None
    return_token_ids: bool = False


# ---- admin bodies: as strict as agent bodies; what is accepted here ends up in records and the journal --------------
ExecutionId = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
EngineName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class OpenSessionRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /admin/sessions`` (an empty body opens a session named after its token)."""

    execution_id: ExecutionId | None = None


class AddEngineRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /admin/engines``."""

    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]  # http(s)://host:port[/path]
    name: EngineName | None = None
