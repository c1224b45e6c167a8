"""``EngineClient``: the one async client every Gyre component uses to talk to an inference engine.

It speaks SGLang's native HTTP API, so it serves the embedded engine and a real SGLang server alike. Failures are
classified once, here: a 4xx is the caller's fault (``EngineRequestError``), everything else means the engine cannot
serve now (``EngineUnavailable``) and the router may retry elsewhere.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

import httpx
import msgspec

from gyre.engine.http import HttpPool, HttpResponse, LocalResourceError, local_cause, sse_lines
from gyre.errors import EngineCapacityError, EngineRequestError, EngineUnavailable, ProtocolError
from gyre.protocol import (
    GenerateRequest,
    GenerateResponse,
    SamplingParams,
    format_weight_version,
    parse_weight_version,
)

T = TypeVar("T")
_encoder = msgspec.json.Encoder()
_response_decoder = msgspec.json.Decoder(GenerateResponse)


class EngineClient:
    """Async client for one engine at ``base_url`` (``http://host:port``)."""

    def __init__(self, base_url: str, timeout_s: float = 600.0, connect_timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._httpx: httpx.AsyncClient | None = None  # streams, https, health: made at first use
        self._pool = (
            HttpPool(self.base_url, timeout_s, connect_timeout_s) if base_url.startswith("http:") else None
        )

    @property
    def _http(self) -> httpx.AsyncClient:
        """httpx's client, made at first use: making one loads the TLS certificates (about 80 ms on this project's
        machine), which 1,000 cells joining the controller at once would otherwise pay on the driver's loop."""
        if self._httpx is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
            self._httpx = httpx.AsyncClient(base_url=self.base_url, timeout=self._timeout, limits=limits)
        return self._httpx

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pools."""
        if self._pool is not None:
            self._pool.close()
        if self._httpx is not None:
            await self._httpx.aclose()

    # ---- transport ------------------------------------------------------------------------------------------
    async def _request(
        self, method: str, path: str, body: Any = None, content: bytes | None = None
    ) -> httpx.Response | HttpResponse:
        if content is None and body is not None:
            content = _encoder.encode(body)
        if self._pool is not None:
            fast = await self._pool.request(method, path, content, json_body=body is not None)
            _raise_for_status(fast, f"{self.base_url}{path}")
            return fast
        try:
            headers = {"content-type": "application/json"} if body is not None else None
            resp = await self._http.request(method, path, content=content, headers=headers)
        except httpx.TimeoutException as exc:
            raise EngineUnavailable(f"{self.base_url}{path} timed out: {exc!r}") from exc
        except httpx.TransportError as exc:
            if local_cause(exc) is not None:
                raise LocalResourceError(f"cannot open a connection to {self.base_url}: {exc!r}") from exc
            raise EngineUnavailable(f"{self.base_url}{path} unreachable: {exc!r}") from exc
        _raise_for_status(resp, f"{self.base_url}{path}")
        return resp

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        resp = await self._request(method, path, body)
        return resp.json() if resp.content.strip() else None

    async def _result(self, path: str, body: Any) -> str:
        data = await self._json("POST", path, body)
        if isinstance(data, dict) and data.get("success") is False:
            raise EngineRequestError(f"{path}: {data.get('message')}")
        return str((data or {}).get("message", ""))

    # ---- generation -------------------------------------------------------------------------------------------
    async def generate(
        self,
        input_ids: list[int] | None = None,
        sampling_params: SamplingParams | None = None,
        *,
        text: str | None = None,
        rid: str | None = None,
        return_logprob: bool = True,
        top_logprobs_num: int = 0,
    ) -> GenerateResponse:
        """One ``/generate`` call to its end; an aborted request returns normally with what it generated."""
        body = GenerateRequest(
            text=text,
            input_ids=input_ids,
            sampling_params=sampling_params or SamplingParams(),
            rid=rid,
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs_num,
        )
        resp = await self._request("POST", "/generate", body)
        return _decode_response(resp.content, f"{self.base_url}/generate")

    async def generate_stream(
        self,
        input_ids: list[int] | None = None,
        sampling_params: SamplingParams | None = None,
        *,
        text: str | None = None,
        rid: str | None = None,
        return_logprob: bool = True,
        top_logprobs_num: int = 0,
    ) -> AsyncGenerator[GenerateResponse, None]:
        """Stream cumulative responses; the last one carries the finish reason."""
        body = GenerateRequest(
            text=text,
            input_ids=input_ids,
            sampling_params=sampling_params or SamplingParams(),
            rid=rid,
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs_num,
            stream=True,
        )
        url = f"{self.base_url}/generate"
        try:
            async with self._http.stream("POST", "/generate", content=_encoder.encode(body)) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _raise_for_status(resp, url)
                buffer = bytearray()
                async for data in resp.aiter_bytes():
                    for line in sse_lines(buffer, data):
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            return
                        yield _decode_chunk(payload, url)
        except httpx.TimeoutException as exc:
            raise EngineUnavailable(f"{url} timed out: {exc!r}") from exc
        except httpx.TransportError as exc:
            if local_cause(exc) is not None:
                raise LocalResourceError(f"cannot open a connection to {url}: {exc!r}") from exc
            raise EngineUnavailable(f"{url} failed mid-stream: {exc!r}") from exc

    async def abort(self, rid: str = "", abort_all: bool = False) -> None:
        """Abort one request, or all; the aborted ``generate`` returns its partial output."""
        await self._request("POST", "/abort_request", {"rid": rid, "abort_all": abort_all})

    # ---- control ----------------------------------------------------------------------------------------------
    async def pause_generation(self, mode: str = "abort") -> None:
        """Stop generating: ``abort``, ``retract`` or ``in_place``."""
        await self._request("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> None:
        """Resume after ``pause_generation``."""
        await self._request("POST", "/continue_generation", {})

    async def flush_cache(self) -> None:
        """Drop the engine's prefix cache."""
        await self._request("POST", "/flush_cache")

    async def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Free weights and/or KV cache (``weights``, ``kv_cache``) without stopping the process."""
        await self._request("POST", "/release_memory_occupation", {"tags": tags})

    async def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Rebuild what ``release_memory_occupation`` freed."""
        await self._request("POST", "/resume_memory_occupation", {"tags": tags})

    async def update_weights_from_disk(self, model_path: str, weight_version: int | None = None) -> str:
        """Load weights from a Hugging Face directory the engine can read (None: the version stays)."""
        body = {"model_path": model_path, "weight_version": _wire(weight_version)}
        return await self._result("/update_weights_from_disk", body)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
    ) -> str:
        """Have the engine join a weight-transfer group (returns once every rank joined)."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return await self._result("/init_weights_update_group", body)

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        weight_version: int | None = None,
        flush_cache: bool = True,
        load_format: str | None = None,
        buckets_left: int = 0,
    ) -> str:
        """Tell the engine to receive these tensors from rank 0 (see ``weight_sync.push_weights``, which also opens
        the `weight_update` session newer SGLang servers require around the calls of one push). ``buckets_left``:
        how many more calls this push makes after this one (Gyre's engine holds its version until the last)."""
        body: dict[str, Any] = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
            "weight_version": _wire(weight_version),
            "flush_cache": flush_cache,
        }
        if load_format is not None:  # older SGLang servers do not know the field
            body["load_format"] = load_format
        if buckets_left:  # nor this one (Gyre's own); sent only where a push has several calls
            body["buckets_left"] = buckets_left
        return await self._result("/update_weights_from_distributed", body)

    @contextlib.asynccontextmanager
    async def weight_update(self) -> AsyncIterator[None]:
        """SGLang's weight-update session (``/begin_weight_update`` .. ``/end_weight_update``, required by SGLang
        >= 0.5.22 and absent before) around all the calls of one push: the server finishes loading at its end."""
        await self._optional("/begin_weight_update", {"selector": "all"})
        try:
            yield
        finally:
            await self._optional("/end_weight_update", {})

    async def _optional(self, path: str, body: Any) -> None:
        """An endpoint newer SGLang versions require and older ones lack."""
        try:
            await self._request("POST", path, body)
        except EngineRequestError as exc:
            if exc.status != 404:
                raise

    async def get_weight_version(self) -> int:
        """The weight version the engine serves now; ProtocolError if the engine reports no integer."""
        info = await self.get_model_info()
        return parse_weight_version(str(info.get("weight_version")), f"{self.base_url}/model_info")

    async def get_model_info(self) -> dict[str, Any]:
        """Model path, architecture, weight version and more."""
        data: dict[str, Any] = await self._json("GET", "/model_info")
        return data

    async def health(self) -> bool:
        """True when the engine answers ``/health`` with 200."""
        try:
            resp = await self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    # ---- KV hand-over (embedded engine extension) -------------------------------------------------------------
    async def export_kv(self, input_ids: list[int]) -> bytes:
        """KV of the longest cached prefix of ``input_ids`` (safetensors bytes)."""
        resp = await self._request("POST", "/gyre/export_kv", {"input_ids": input_ids})
        return resp.content

    async def import_kv(self, data: bytes) -> int:
        """Insert an export into this engine's prefix cache; returns the number of tokens it covers."""
        resp = await self._request("POST", "/gyre/import_kv", content=data)
        return int(resp.json()["cached_tokens"])

    async def statistics(self) -> dict[str, Any]:
        """The embedded engine's load and counters."""
        data: dict[str, Any] = await self._json("GET", "/gyre/statistics")
        return data


def _decode_response(content: bytes, url: str) -> GenerateResponse:
    try:
        return _response_decoder.decode(content)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise ProtocolError(f"{url} answered what is not a generate response: {exc}") from None


def _decode_chunk(payload: bytes, url: str) -> GenerateResponse:
    """One streamed chunk; an error event ends the stream as the engine failing."""
    if payload.startswith(b'{"error"'):
        try:
            message = json.loads(payload)["error"].get("message")
        except (ValueError, KeyError, TypeError, AttributeError):
            message = payload[:300].decode("utf-8", "replace")
        raise EngineUnavailable(f"{url}: {message}")
    return _decode_response(payload, url)


def _wire(weight_version: int | None) -> str | None:
    return None if weight_version is None else format_weight_version(weight_version)


def _raise_for_status(resp: httpx.Response | HttpResponse, url: str) -> None:
    if resp.status_code < 400:
        return
    try:
        err = resp.json().get("error", resp.text)
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        message = resp.text
    if resp.status_code >= 500:
        raise EngineUnavailable(f"{url} answered {resp.status_code}: {message}")
    if resp.status_code in (413, 507):
        raise EngineCapacityError(f"{url}: {message}", status=resp.status_code)
    raise EngineRequestError(f"{url} answered {resp.status_code}: {message}", status=resp.status_code)
