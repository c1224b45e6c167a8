"""The router and engine under hostile input (issue 14): each test is one finding of the security review.

Two routers: one in front of a ``ScriptedEngine`` that replies with whatever follows ``say:`` in the last user
message (exact text, any characters), one in front of the real embedded engine slowed to 20 ms a step, so a call
is still generating when its client goes away.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fakes import ScriptedEngine
from gyre.engine.launcher import ServerProcess, launch_embedded
from gyre.engine.models import load_tokenizer
from gyre.journal import read_journal
from gyre.journal.records import CallRecord
from gyre.router.spawn import launch_router

BODY_TIMEOUT_S = 1.0  # the `impatient` router's: only the half-sent requests, its victims, go there


@dataclass
class Served:
    """A router subprocess: its agent-facing URL, admin URL and journal directory."""

    proc: ServerProcess
    admin: str
    journal: Path

    @property
    def url(self) -> str:
        return self.proc.url

    def session(self, execution_id: str = "hostile") -> tuple[str, str]:
        """A fresh session: (token, base_url)."""
        resp = httpx.post(f"{self.admin}/admin/sessions", json={"execution_id": execution_id})
        assert resp.status_code == 200, resp.text
        return resp.json()["token"], resp.json()["base_url"]

    def records(self, token: str) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.admin}/admin/sessions/{token}/records").json()["records"])

    def wait_records(self, token: str, n: int = 1, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """This session's records once there are ``n`` (polls the admin API; fails after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while len(records := self.records(token)) < n:
            if time.monotonic() > deadline:
                pytest.fail(f"no record within {timeout_s} s")
            time.sleep(0.1)
        return records


def _say(tokenizer: Any) -> Any:
    def script(ids: list[int]) -> str:
        text = tokenizer.decode(ids[-400:])  # the end is enough; a long prompt is not decoded whole
        at = text.rfind("say:")
        return text[at + 4 :].split("<|im_end|>")[0] if at >= 0 else "hello"

    return script


@pytest.fixture(scope="module")
def scripted(tiny_model: Path) -> Iterator[ScriptedEngine]:
    tokenizer = load_tokenizer(tiny_model)
    with ScriptedEngine(tokenizer, _say(tokenizer)) as engine:
        yield engine


@contextlib.contextmanager
def _scripted_router(
    model: Path, scripted: ScriptedEngine, factory: pytest.TempPathFactory, name: str, overrides: list[str]
) -> Iterator[Served]:
    journal = factory.mktemp(name)
    proc, admin = launch_router(
        model, [scripted.url], journal_dir=journal, overrides=overrides, log_path=journal / "router.log"
    )
    with proc:
        yield Served(proc, admin, journal)


@pytest.fixture(scope="module")
def router(
    tiny_model: Path, scripted: ScriptedEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The default body timeout (30 s): its clients send megabytes, which a loaded machine can take seconds over."""
    with _scripted_router(tiny_model, scripted, tmp_path_factory, "hostile", []) as served:
        yield served


@pytest.fixture(scope="module")
def impatient(
    tiny_model: Path, scripted: ScriptedEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """A router whose request heads and bodies must arrive within `BODY_TIMEOUT_S`, for the half-sent ones."""
    overrides = [f"router.body_timeout_s={BODY_TIMEOUT_S}"]
    with _scripted_router(tiny_model, scripted, tmp_path_factory, "hostile-impatient", overrides) as served:
        yield served


@pytest.fixture(scope="module")
def roomy(
    tiny_model: Path, scripted: ScriptedEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """A router that takes the scripted model's context to be 4M tokens: long requests get rendered."""
    overrides = ["router.context_length=4000000"]
    with _scripted_router(tiny_model, scripted, tmp_path_factory, "hostile-roomy", overrides) as served:
        yield served


@pytest.fixture(scope="module")
def slow(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    """A router in front of the embedded engine at 20 ms a step; yields it and the engine's URL."""
    logs = tmp_path_factory.mktemp("hostile-slow")
    overrides = ["engine.kv_cache_mem_gib=0.05", "engine.modelled_step_s=0.02"]
    with launch_embedded(tiny_model, overrides=overrides, log_path=logs / "engine.log") as engine:
        proc, admin = launch_router(tiny_model, [engine.url], journal_dir=logs, log_path=logs / "router.log")
        with proc:
            yield Served(proc, admin, logs), engine.url


def chat(content: str = "hi", **fields: Any) -> dict[str, Any]:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 64,
        **fields,
    }


def journal_records(served: Served) -> list[CallRecord]:
    return list(read_journal(served.journal / "calls.jsonl", CallRecord))


def assert_error(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return str(body["error"]["message"])


# ---- 5xx ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_json_nested_ten_thousand_deep_is_400(router: Served, path: str) -> None:
    _, base = router.session()
    deep = b"[" * 10_000 + b"]" * 10_000
    for body in (
        deep,
        b'{"model": "default", "messages": ' + deep + b"}",
        b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
    ):
        assert_error(httpx.post(f"{base}/{path}", content=body), 400)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("sessions", b"{not json"),
        ("sessions", b"[" * 10_000),
        ("sessions", b"[" * 10_000 + b"]" * 10_000),
        ("sessions", b"\xff\xfe"),
        ("sessions", b'{"execution_id": 5}'),
        ("sessions", b'{"execution_id": {"nested": [1]}}'),
        ("sessions", b'{"execution_id": ""}'),
        ("sessions", b'{"execution_id": "a\\nb"}'),
        ("sessions", b'{"execution_id": "x", "extra": 1}'),
        ("sessions", b"[]"),
        ("engines", b"{not json"),
        ("engines", b'{"url": 5}'),
        ("engines", b'{"url": "not a url"}'),
        ("engines", b'{"url": "ftp://127.0.0.1:1"}'),
        ("engines", b'{"url": "http://"}'),
        ("engines", b'{"url": "http://127.0.0.1:99999"}'),
        ("engines", b'{"url": "http://127.0.0.1:1/?q=1"}'),
        ("engines", b'{"url": "http://127.0.0.1:1", "name": "../etc"}'),
        ("engines", b'{"url": "http://127.0.0.1:1", "name": 3}'),
    ],
)
def test_malformed_admin_bodies_are_400(router: Served, path: str, body: bytes) -> None:
    assert_error(httpx.post(f"{router.admin}/admin/{path}", content=body), 400)
    assert list(httpx.get(f"{router.admin}/admin/engines").json()["engines"]) == ["engine-0"]


def test_nothing_the_admin_api_accepts_makes_the_journal_unreadable(router: Served) -> None:
    for execution_id in ("exec-ü-世界", "a\u2028b\u0085c", "x" * 256, "'; DROP TABLE", "\\u0000"):
        token, base = router.session(execution_id)
        assert httpx.post(f"{base}/chat/completions", json=chat()).status_code == 200
        assert router.records(token)[0]["session"] == execution_id
    sessions = {r.session for r in journal_records(router)}  # every line of the journal still loads
    assert {"exec-ü-世界", "a\u2028b\u0085c", "x" * 256} <= sessions


# ---- streaming is byte-safe ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text", ["a\u0085b", "line\u2028sep\u2029para", "cr\rlf\n\nend", "\u0085\u2028\u2029"]
)
def test_streamed_text_with_unicode_line_breaks_arrives_whole(router: Served, text: str) -> None:
    token, base = router.session()
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": f"say:{text}"}], stream=True
        )
        chunks = list(stream)
        whole = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": f"say:{text}"}]
        )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == (whole.choices[0].message.content or "") == text.strip()
    assert chunks[-1].choices[0].finish_reason == "stop"
    records = router.records(token)
    assert [r["finish_reason"] for r in records] == ["stop", "stop"]
    assert records[0]["output_ids"] == records[1]["output_ids"]


# ---- stalls ------------------------------------------------------------------------------------------------------
def test_a_body_that_cannot_fit_the_context_is_413_unrendered(
    router: Served, scripted: ScriptedEngine
) -> None:
    """7 MiB of text (under the 8 MiB limit) is refused at once, not rendered for seconds: by the check of its
    characters ("holds at least"; a rendered one "renders to"), and nothing reaches the engine."""
    _, base = router.session()
    sent = len(scripted.requests)
    resp = httpx.post(f"{base}/chat/completions", json=chat("x" * (7 * 2**20)), timeout=60)
    assert "context length" in (said := assert_error(resp, 413)) and "holds at least" in said, said
    resp = httpx.post(
        f"{base}/completions", json={"model": "default", "prompt": "x" * (7 * 2**20)}, timeout=60
    )
    assert "context length" in (said := assert_error(resp, 413)) and "holds at least" in said, said
    assert len(scripted.requests) == sent
    resp = httpx.post(f"{base}/chat/completions", json=chat("x" * (9 * 2**20)), timeout=60)
    assert "limit" in assert_error(resp, 413)  # the default limit is below the old 64 MiB


def test_a_long_render_does_not_stall_other_sessions(roomy: Served) -> None:
    """A request that fits but takes seconds to render is rendered off the event loop."""
    _, base = roomy.session("long")
    _, other = roomy.session("other")
    done = threading.Event()
    result: list[int] = []

    def long_call() -> None:
        try:
            body = chat("say:ok " + "word " * 400_000, max_tokens=2)  # 2M characters: seconds to render
            result.append(httpx.post(f"{base}/chat/completions", json=body, timeout=120).status_code)
        finally:
            done.set()

    thread = threading.Thread(target=long_call)
    latencies: list[float] = []
    with httpx.Client(timeout=60) as http:
        assert http.post(f"{other}/chat/completions", json=chat("say:quick")).status_code == 200
        thread.start()
        while not done.is_set():
            started = time.monotonic()
            assert http.post(f"{other}/chat/completions", json=chat("say:quick")).status_code == 200
            latencies.append(time.monotonic() - started)
    thread.join()
    assert result == [200]
    # calls of another session were answered while the long one rendered (their seconds are not asserted: a loaded
    # machine stretches them)
    assert len(latencies) >= 3, latencies


def _raw_request(port: int, head: bytes, body: bytes) -> bytes:
    """Send ``head`` and a part of the body the head promises more of; return all the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):  # the server must answer and close
            answer += chunk
        return answer


@pytest.mark.slow(reason="waits out the router's body timeout (7 s)")
def test_a_half_sent_body_times_out_and_frees_its_connection(impatient: Served) -> None:
    # the 408 is the body timeout's answer; closed by anything else, the connection would answer nothing
    token, _ = impatient.session()
    head = (
        f"POST /s/{token}/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        "content-length: 1000\r\n\r\n"
    ).encode()
    try:
        answer = _raw_request(impatient.proc.port, head, b'{"model": "default", ')
    except TimeoutError:
        pytest.fail("a half-sent body held its connection for 60 s")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    admin_port = int(impatient.admin.rsplit(":", 1)[1])
    head = b"POST /admin/sessions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n"
    try:
        answer = _raw_request(admin_port, head, b'{"execution_id": ')
    except TimeoutError:
        pytest.fail("a half-sent admin body held its connection for 60 s")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n", b"GET /heal"])
def test_a_half_sent_request_head_is_closed_in_time(impatient: Served, sent: bytes) -> None:
    """Nothing, half a request line, or headers without their end: the connection is closed, not held (nothing
    else closes it: held, it would time out this side's 60 s)."""
    admin_port = int(impatient.admin.rsplit(":", 1)[1])
    for port in (impatient.proc.port, admin_port):
        try:
            answer = _raw_request(port, b"", sent)
        except TimeoutError:
            pytest.fail(f"a half-sent head ({sent!r}) held its connection on port {port} for 60 s")
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
    with (
        httpx.Client() as http
    ):  # a keep-alive connection's second request is timed too; the first is answered
        assert http.get(f"{impatient.url}/health").status_code == 200


# ---- client disconnects ------------------------------------------------------------------------------------------
LONG = {
    "max_tokens": 4000,
    "temperature": 0.0,
}  # greedy: the tiny model runs to the limit, 80 s at 20 ms a step


def _assert_aborted(served: Served, engine_url: str, token: str) -> None:
    records = served.wait_records(token, timeout_s=20.0)
    assert records[0]["finish_reason"] == "abort", records[0]["finish_reason"]
    assert 0 < len(records[0]["output_ids"]) < 4000
    assert len(records[0]["output_logprobs"]) == len(records[0]["output_ids"])
    assert httpx.get(f"{engine_url}/gyre/statistics").json()["running_requests"] == 0
    assert any(
        r.finish_reason == "abort" and r.call_id == records[0]["call_id"] for r in journal_records(served)
    )


def test_a_client_that_disconnects_mid_call_aborts_its_engine_request(slow: tuple[Served, str]) -> None:
    served, engine_url = slow
    token, base = served.session("gone-mid-call")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}/chat/completions", json=chat(**LONG), timeout=httpx.Timeout(60, read=1.5))
    _assert_aborted(served, engine_url, token)


def test_a_client_that_disconnects_mid_stream_aborts_its_engine_request(slow: tuple[Served, str]) -> None:
    served, engine_url = slow
    token, base = served.session("gone-mid-stream")
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], stream=True, **LONG
        )
        for _, _chunk in zip(range(5), stream, strict=False):
            pass
        stream.close()
    _assert_aborted(served, engine_url, token)


# ---- stop strings ------------------------------------------------------------------------------------------------
SEEDED = {"max_tokens": 40, "temperature": 1.0, "seed": 1}  # the same tokens on every call


def _a_stop_in(text: str) -> str:
    """Two characters first found past the start of ``text``: a stop string the seeded call will meet."""
    for i in range(4, len(text) - 2):
        stop = text[i : i + 2]
        if "\ufffd" not in stop and stop.strip() == stop and text.find(stop) == i:
            return stop
    raise AssertionError(f"no stop string in {text!r}")


def test_stop_strings_are_cut_from_the_content_but_kept_in_the_record(
    slow: tuple[Served, str], tiny_model: Path
) -> None:
    served, _ = slow
    token, base = served.session("stops")
    hi = [{"role": "user", "content": "hi"}]
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
        full = (
            client.chat.completions.create(model="default", messages=hi, **SEEDED).choices[0].message.content
        )
        assert full is not None
        stop = _a_stop_in(full)
        reply = client.chat.completions.create(model="default", messages=hi, stop=[stop], **SEEDED)
        stream = client.chat.completions.create(
            model="default", messages=hi, stop=stop, stream=True, **SEEDED
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        text = client.completions.create(model="default", prompt="hi", **SEEDED).choices[0].text
        cut = client.completions.create(model="default", prompt="hi", stop=_a_stop_in(text), **SEEDED)
    expected = full[: full.find(stop)].strip()
    assert reply.choices[0].message.content == (expected or None)
    assert reply.choices[0].finish_reason == "stop"
    assert streamed == expected
    assert cut.choices[0].text == text[: text.find(_a_stop_in(text))]
    records = served.records(token)
    assert [r["finish_reason"] for r in records[1:3]] == ["stop", "stop"]
    tokenizer = load_tokenizer(tiny_model)
    for record in records[1:3]:  # the record keeps the sampled tokens, stop string included
        assert stop in tokenizer.decode(record["output_ids"])


# ---- burst load: the engine marked gone --------------------------------------------------------------------------
# Diagnosis: under a burst of thousands of calls the router's own process ran out of file descriptors (each waiting
# call holds a socket; each sandbox command its pipes). socket() failing with EMFILE was taken for the engine being
# unreachable: the engine was marked gone, then revived by the next health probe once descriptors were free again.
OUT_OF_DESCRIPTORS = """
import asyncio, json, os, resource, sys
from gyre.protocol import SamplingParams
from gyre.router.pool import EnginePool

async def main() -> None:
    pool = EnginePool(wait_for_engine_s=20.0)
    pool.add(sys.argv[1])
    params = SamplingParams(max_new_tokens=4)
    await pool.generate([1, 2, 3], params)  # one pooled connection
    hog = []
    while True:  # take every descriptor left
        try:
            hog.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    calls = [asyncio.ensure_future(pool.generate([1, 2, 3], params)) for _ in range(4)]
    while pool.statistics().local_connect_failures + pool.statistics().engine_failures == 0:
        await asyncio.sleep(0.01)  # until a call has met the shortage
    for fd in hog:
        os.close(fd)
    done = await asyncio.gather(*calls, return_exceptions=True)
    stats = pool.statistics()
    print(json.dumps({"ok": sum(not isinstance(d, BaseException) for d in done),
                      "engine_failures": stats.engine_failures, "states": stats.engines}))

resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
asyncio.run(main())
"""


def test_running_out_of_descriptors_does_not_mark_the_engine_gone(scripted: ScriptedEngine) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS, scripted.url], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"ok": 4, "engine_failures": 0, "states": {"engine-0": "serving"}}, proc.stderr[-2000:]


# ---- issue 31: hostile but valid tool schemas, absurd limits, huge headers -------------------------------------
def _tool(parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "description": "", "parameters": parameters}}


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        ([_tool({"type": "object", "enum": list(range(300_000))})], "JSON values"),  # 2 MB of numbers
        ([_tool({"type": "object", "x": [{}] * 300_000})], "JSON values"),  # 300,000 empty objects
        (
            [_tool(json.loads('{"a":' * 900 + "1" + "}" * 900))],
            "nested deeper",
        ),  # 900 deep, under JSON's limit
        ([_tool({"type": "object"})] * 1000, "at most 512"),
    ],
    ids=["numbers", "empty-objects", "deep", "many-tools"],
)
def test_hostile_tool_schemas_are_refused_at_once_naming_the_limit(
    roomy: Served, scripted: ScriptedEngine, tools: list[dict[str, Any]], says: str
) -> None:
    """Before issue 31 numbers and empty objects did not count toward the pre-check, so the request rendered on the
    event loop (2 MB of numbers stalled every session 3.8 s) and shipped a 10 M-token input to the engine. Refused
    by the check of the tools (its message names the limit), nothing reaches the engine."""
    _, base = roomy.session("schemas")
    sent = len(scripted.requests)
    resp = httpx.post(f"{base}/chat/completions", json=chat("hi", tools=tools), timeout=60)
    assert says in assert_error(resp, 400)
    assert len(scripted.requests) == sent


def test_a_tools_payload_of_numbers_counts_toward_the_context(
    router: Served, scripted: ScriptedEngine
) -> None:
    # under the tools limits, but far more than the tiny model's context once rendered: 413 before rendering (the
    # check of its characters says "holds at least"; a rendered request's "renders to"), nothing sent to the engine
    tools = [_tool({"type": "object", "enum": list(range(10**6, 10**6 + 90_000))}) for _ in range(1)]
    _, base = router.session("numbers")
    sent = len(scripted.requests)
    resp = httpx.post(f"{base}/chat/completions", json=chat("hi", tools=tools), timeout=60)
    assert "context length" in (said := assert_error(resp, 413)) and "holds at least" in said, said
    assert len(scripted.requests) == sent


def test_absurd_max_tokens_and_huge_headers_are_4xx_naming_the_limit(router: Served) -> None:
    _, base = router.session("limits")
    resp = httpx.post(f"{base}/chat/completions", json=chat("hi", max_tokens=10**30), timeout=30)
    assert "2147483647" in assert_error(resp, 400)
    resp = httpx.post(f"{base}/completions", json={"model": "default", "prompt": "hi", "max_tokens": 10**30})
    assert "2147483647" in assert_error(resp, 400)
    resp = httpx.post(
        f"{base}/chat/completions", json=chat("hi"), headers={"x-pad": "a" * 100_000}, timeout=30
    )
    assert "limit is 32768" in assert_error(resp, 431)
    assert httpx.post(f"{base}/chat/completions", json=chat("say:fine"), timeout=30).status_code == 200


# ---- issue 31: connections past the router's descriptors -----------------------------------------------------------
@pytest.mark.slow(reason="opens connections past the router's descriptor limit (6 s)")
def test_silent_connections_past_the_descriptor_limit_do_not_keep_a_polite_client_out(
    tiny_model: Path, scripted: ScriptedEngine, tmp_path: Path
) -> None:
    """A router at 256 descriptors; 400 connections that send half a request head and then nothing (their head
    timeout is 30 s). Before issue 31 the router ran out of descriptors and the polite call waited in the kernel's
    backlog until the silent ones timed out; now the longest-waiting connection is closed to make room."""
    proc, admin = launch_router(
        tiny_model, [scripted.url], journal_dir=tmp_path, log_path=tmp_path / "router.log", open_files=256
    )
    silent: list[socket.socket] = []
    with proc:
        served = Served(proc, admin, tmp_path)
        _, base = served.session("polite")
        try:
            for _ in range(400):
                sock = socket.create_connection(("127.0.0.1", proc.port), timeout=30)
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
                silent.append(sock)
            # served (its seconds are not asserted; the log below says connections were closed to make room)
            with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60) as client:
                reply = client.chat.completions.create(
                    model="default", messages=[{"role": "user", "content": "say:welcome"}], max_tokens=8
                )
            assert reply.choices[0].message.content == "welcome"
            for sock in silent[:100]:  # the earliest were closed to make room for the later ones
                sock.settimeout(5)
                with contextlib.suppress(ConnectionResetError):  # closed before the router read what it sent
                    answer = sock.recv(65536)  # else told why, when what it sent had been read
                    assert answer == b"" or (
                        answer.startswith(b"HTTP/1.1 408") and b"router.max_connections" in answer
                    ), answer[:300]
        finally:
            for sock in silent:
                sock.close()
        assert "agent connections at their cap" in (tmp_path / "router.log").read_text()
