"""The router's failures as an agent sees them: OpenAI-style error bodies with the right status, never a 500.

Most tests run against a router in front of a ``ScriptedEngine`` (fast, deterministic); the context-length and seed
cases need the real embedded engine, and the 413-body and 503 cases a router with a tiny body limit and no engines.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes import ScriptedEngine
from gyre.engine.launcher import ServerProcess, free_port, launch_embedded
from gyre.engine.models import load_tokenizer
from gyre.router.openai_types import ChatRequest, CompletionRequest
from gyre.router.spawn import launch_router

ALLOWED = {200, 400, 401, 404, 413, 422, 503}
HI = [{"role": "user", "content": "hi"}]


@dataclass
class Served:
    """A router subprocess: its agent-facing URL and its admin URL."""

    proc: ServerProcess
    admin: str

    @property
    def url(self) -> str:
        return self.proc.url

    def session(self, execution_id: str = "errors") -> tuple[str, str]:
        """A fresh session: (token, base_url)."""
        data = httpx.post(f"{self.admin}/admin/sessions", json={"execution_id": execution_id}).json()
        return data["token"], data["base_url"]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this module's servers write their logs."""
    return tmp_path_factory.mktemp("router-errors")


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """One HTTP client for the module's raw requests."""
    with httpx.Client(timeout=20.0) as client:
        yield client


@pytest.fixture(scope="module")
def scripted(tiny_model: Path) -> Iterator[ScriptedEngine]:
    """An engine that answers every call with "hello"."""
    with ScriptedEngine(load_tokenizer(tiny_model), lambda ids: "hello") as engine:
        yield engine


@pytest.fixture(scope="module")
def router(tiny_model: Path, scripted: ScriptedEngine, logs: Path) -> Iterator[Served]:
    """A router in front of the scripted engine."""
    proc, admin = launch_router(tiny_model, [scripted.url], log_path=logs / "router.log")
    with proc:
        yield Served(proc, admin)


@pytest.fixture(scope="module")
def limited(tiny_model: Path, logs: Path) -> Iterator[Served]:
    """A router with no engine, a 0.5 s wait for one, and a 10 KiB body limit."""
    overrides = ["router.wait_for_engine_s=0.5", "router.max_body_mib=0.01"]
    proc, admin = launch_router(tiny_model, [], overrides=overrides, log_path=logs / "limited.log")
    with proc:
        yield Served(proc, admin)


@pytest.fixture(scope="module")
def real(tiny_model: Path, logs: Path) -> Iterator[Served]:
    """A router in front of the real embedded engine (context 32768 tokens, KV cache ~17k tokens)."""
    engine = launch_embedded(
        tiny_model, overrides=["engine.kv_cache_mem_gib=0.05"], log_path=logs / "engine.log"
    )
    try:
        proc, admin = launch_router(tiny_model, [engine.url], log_path=logs / "real.log")
        try:
            yield Served(proc, admin)
        finally:
            proc.stop(timeout_s=3)  # a request hung in a broken engine must not hold the teardown
    finally:
        engine.stop(timeout_s=3)


def assert_error(
    resp: httpx.Response, status: int, type_: str | None = None, param: object = ...
) -> dict[str, Any]:
    """``resp`` is an OpenAI-style error with ``status``; returns the inner error object."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert list(body) == ["error"], body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] == status, err
    if type_ is not None:
        assert err["type"] == type_, err
    if param is not ...:
        assert err["param"] == param, err
    return err


def chat(**fields: Any) -> dict[str, Any]:
    """A valid chat request body, with ``fields`` replaced."""
    return {"model": "default", "messages": HI, "max_tokens": 4, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    """A valid completion request body, with ``fields`` replaced."""
    return {"model": "default", "prompt": "hi", "max_tokens": 4, **fields}


# ---- 400 ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["chat/completions", "completions"])
@pytest.mark.parametrize("raw", [b"{not json", b'{"model": "default",', b"", b"\xff\xfe"])
def test_malformed_json_is_400(router: Served, http: httpx.Client, path: str, raw: bytes) -> None:
    _, base = router.session()
    resp = http.post(f"{base}/{path}", content=raw, headers={"content-type": "application/json"})
    assert "JSON" in assert_error(resp, 400, "invalid_request_error")["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("messages", "hi"),
        ("messages", [1]),
        ("temperature", "hot"),
        ("temperature", 2.5),
        ("max_tokens", -1),
        ("max_tokens", 0),
        ("top_p", 0),
        ("model", 1),
        ("stop", [1]),
        ("n", 0),
    ],
)
def test_wrong_field_type_is_400_naming_the_field(
    router: Served, http: httpx.Client, field: str, value: Any
) -> None:
    _, base = router.session()
    resp = http.post(f"{base}/chat/completions", json=chat(**{field: value}))
    assert f"$.{field}" in assert_error(resp, 400, "invalid_request_error")["message"]


def test_body_that_is_not_an_object_is_400(router: Served, http: httpx.Client) -> None:
    _, base = router.session()
    for body in ([HI], "hi", 3, None):
        assert_error(http.post(f"{base}/chat/completions", content=json.dumps(body)), 400)
    assert_error(http.post(f"{base}/chat/completions", json={"messages": HI}), 400)  # no model


@pytest.mark.parametrize(
    ("messages", "where"),
    [
        ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ([*HI, {"role": "tool", "content": "42"}], "messages[1].tool_call_id"),
        ([{"role": "user", "content": 7}], "messages[0].content"),
        ([{"role": "user"}], "messages[0].content"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}],
            "messages[0].tool_calls[0].id",
        ),
        ([], "messages"),
    ],
)
def test_invalid_messages_are_400(
    router: Served, http: httpx.Client, messages: list[Any], where: str
) -> None:
    _, base = router.session()
    resp = http.post(f"{base}/chat/completions", json=chat(messages=messages))
    assert where in assert_error(resp, 400, "invalid_request_error", "messages")["message"]


def test_invalid_message_in_an_extending_request_names_its_index(router: Served, http: httpx.Client) -> None:
    """A later turn of a conversation reports the bad message by its index in the request, not in the delta."""
    _, base = router.session()
    reply = http.post(f"{base}/chat/completions", json=chat(max_tokens=16)).json()["choices"][0]["message"]
    messages = [*HI, reply, {"role": "tool", "content": "42"}]
    resp = http.post(f"{base}/chat/completions", json=chat(messages=messages))
    assert "messages[2].tool_call_id" in assert_error(resp, 400, param="messages")["message"]


def test_unknown_role_is_400(router: Served, http: httpx.Client) -> None:
    token, base = router.session()
    resp = http.post(f"{base}/chat/completions", json=chat(), headers={"x-gyre-role": "wizard"})
    assert "wizard" in assert_error(resp, 400, "invalid_request_error", "role")["message"]
    resp = http.post(f"{router.url}/s/{token}/wizard/v1/chat/completions", json=chat())
    assert_error(resp, 400, "invalid_request_error", "role")
    resp = http.post(f"{router.url}/s/{token}/sub-agent/v1/chat/completions", json=chat())
    assert resp.status_code == 200, resp.text
    assert [r["role"] for r in http.get(f"{base}/gyre/records").json()["records"]] == ["sub-agent"]


# ---- 401 ------------------------------------------------------------------------------------------------------------
def test_unknown_session_token_in_url_is_401(router: Served, http: httpx.Client) -> None:
    with openai.OpenAI(base_url=f"{router.url}/s/gyre-bogus/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as exc:
            client.chat.completions.create(model="default", messages=HI)  # type: ignore[arg-type]
        assert exc.value.status_code == 401 and exc.value.type == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
    for path in ("chat/completions", "completions"):
        resp = http.post(f"{router.url}/s/gyre-bogus/v1/{path}", json=chat())
        assert_error(resp, 401, "authentication_error")
    assert_error(http.get(f"{router.url}/s/gyre-bogus/v1/gyre/records"), 401, "authentication_error")


@pytest.mark.parametrize("auth", [None, "", "Bearer", "Basic abc", "gyre-token"])
def test_missing_or_malformed_authorization_is_401(
    router: Served, http: httpx.Client, auth: str | None
) -> None:
    headers = {} if auth is None else {"authorization": auth}
    for path in ("chat/completions", "completions"):
        resp = http.post(f"{router.url}/v1/{path}", json=chat(), headers=headers)
        assert "Bearer" in assert_error(resp, 401, "authentication_error")["message"]
    assert_error(http.get(f"{router.url}/v1/models", headers=headers), 401)


def test_bearer_token_authenticates_only_a_live_session(router: Served, tiny_model: Path) -> None:
    bogus = openai.OpenAI(base_url=f"{router.url}/v1", api_key="gyre-not-a-session", max_retries=0)
    with bogus, pytest.raises(openai.AuthenticationError):
        bogus.chat.completions.create(model="default", messages=HI)  # type: ignore[arg-type]
    token, _ = router.session()
    with openai.OpenAI(base_url=f"{router.url}/v1", api_key=token, max_retries=0) as client:
        reply = client.chat.completions.create(model="default", messages=HI)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "hello"
        assert [m.id for m in client.models.list().data] == [tiny_model.name]


def test_closed_session_is_401(router: Served, http: httpx.Client) -> None:
    token, base = router.session()
    assert http.post(f"{base}/chat/completions", json=chat()).status_code == 200
    assert http.delete(f"{router.admin}/admin/sessions/{token}").status_code == 200
    assert_error(http.post(f"{base}/chat/completions", json=chat()), 401, "authentication_error")


# ---- 404 ------------------------------------------------------------------------------------------------------------
def test_unknown_model_is_404(router: Served) -> None:
    _, base = router.session()
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as exc:
            client.chat.completions.create(model="gpt-4o", messages=HI)  # type: ignore[arg-type]
        assert exc.value.param == "model" and "gpt-4o" in exc.value.message
        with pytest.raises(openai.NotFoundError) as exc:
            client.completions.create(model="gpt-4o", prompt="hi")
        assert exc.value.param == "model"


def test_unknown_path_is_404(router: Served, http: httpx.Client) -> None:
    _, base = router.session()
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    with client, pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="default", input="hi")
    for url in (f"{router.url}/nope", f"{base}/embeddings", f"{router.url}/v2/chat/completions"):
        assert "no such path" in assert_error(http.post(url, json={}), 404, "not_found_error")["message"]


def test_admin_is_not_on_the_agent_port(router: Served, http: httpx.Client) -> None:
    token, _ = router.session()
    assert_error(http.post(f"{router.url}/admin/sessions", json={"execution_id": "x"}), 404)
    assert_error(http.get(f"{router.url}/admin/engines"), 404)
    assert_error(http.post(f"{router.url}/admin/engines/engine-0/drain"), 404)
    assert_error(http.delete(f"{router.url}/admin/sessions/{token}"), 404)
    assert http.get(f"{router.admin}/admin/engines").json()["engines"] == {"engine-0": "serving"}


# ---- 413 ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("chat/completions", chat(messages=[{"role": "user", "content": "x" * 20_000}])),
        ("completions", completion(prompt="x" * 20_000)),
    ],
)
def test_body_over_the_limit_is_413(
    limited: Served, http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    _, base = limited.session()
    assert "limit" in assert_error(http.post(f"{base}/{path}", json=body), 413)["message"]


def test_prompt_longer_than_the_context_is_413(real: Served, http: httpx.Client) -> None:
    _, base = real.session()
    long_chat = chat(messages=[{"role": "user", "content": "a" * 40_000}])  # byte tokens: > 32768
    assert (
        "context length"
        in assert_error(http.post(f"{base}/chat/completions", json=long_chat), 413)["message"]
    )
    resp = http.post(f"{base}/completions", json=completion(prompt=[65] * 40_000))
    assert "context length" in assert_error(resp, 413)["message"]
    resp = http.post(f"{base}/chat/completions", json=chat(max_tokens=2))
    assert resp.status_code == 200, resp.text  # the engine still serves


def test_out_of_range_seed_leaves_the_engine_serving(real: Served, http: httpx.Client) -> None:
    """A seed no generator takes is refused (or wrapped), never a request that hangs or a dead engine."""
    _, base = real.session()
    try:  # a hang is what this guards against: 60 s, which a healthy engine on a loaded machine still meets
        resp = http.post(f"{base}/chat/completions", json=chat(max_tokens=2, seed=2**70), timeout=60)
        after = http.post(f"{base}/chat/completions", json=chat(max_tokens=2), timeout=60)
    except httpx.ReadTimeout:
        pytest.fail("a chat request with seed=2**70 left the engine unable to answer within 60 s")
    if resp.status_code != 200:
        assert "seed" in assert_error(resp, 400)["message"]
    assert after.status_code == 200, after.text


# ---- 422 ------------------------------------------------------------------------------------------------------------
def test_n_above_one_is_422(router: Served, http: httpx.Client) -> None:
    _, base = router.session()
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.UnprocessableEntityError) as exc:
            client.chat.completions.create(model="default", messages=HI, n=2)  # type: ignore[arg-type]
        assert exc.value.param == "n"
    assert_error(http.post(f"{base}/completions", json=completion(n=2)), 422, param="n")


def test_streaming_completions_is_422(router: Served, http: httpx.Client) -> None:
    _, base = router.session()
    err = assert_error(http.post(f"{base}/completions", json=completion(stream=True)), 422, param="stream")
    assert "chat/completions" in err["message"]


# ---- 503 ------------------------------------------------------------------------------------------------------------
def _timed_503(http: httpx.Client, base: str) -> tuple[float, str]:
    """A call's 503: its seconds and its message."""
    start = time.monotonic()
    resp = http.post(f"{base}/chat/completions", json=chat())
    elapsed = time.monotonic() - start
    return elapsed, str(assert_error(resp, 503, "service_unavailable")["message"])


# the wait ended the call: at least its 0.5 s (a lower bound a loaded machine cannot break), and its message says so
WAITED = "no engine is serving (waited 0.5 s)"


def test_no_engine_is_503_after_the_wait(limited: Served, http: httpx.Client) -> None:
    _, base = limited.session()
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as exc:
            client.chat.completions.create(model="default", messages=HI)  # type: ignore[arg-type]
        assert exc.value.status_code == 503
    elapsed, said = _timed_503(http, base)
    assert elapsed >= 0.45 and WAITED in said, said


def test_drained_engine_is_503_after_the_wait(
    limited: Served, scripted: ScriptedEngine, http: httpx.Client
) -> None:
    _, base = limited.session()
    name = "errors-drained"
    assert (
        http.post(f"{limited.admin}/admin/engines", json={"url": scripted.url, "name": name}).status_code
        == 200
    )
    try:
        assert http.post(f"{base}/chat/completions", json=chat()).status_code == 200
        assert http.post(f"{limited.admin}/admin/engines/{name}/drain").status_code == 200
        elapsed, said = _timed_503(http, base)
        assert elapsed >= 0.45 and WAITED in said, said
    finally:
        http.delete(f"{limited.admin}/admin/engines/{name}")


def test_unreachable_engine_is_503(limited: Served, http: httpx.Client) -> None:
    _, base = limited.session()
    name = "errors-closed-port"
    dead = f"http://127.0.0.1:{free_port()}"
    assert http.post(f"{limited.admin}/admin/engines", json={"url": dead, "name": name}).status_code == 200
    try:
        # a 503, not a hang (the module's client gives up after 20 s): the engine is gone, the wait ended the call
        _, said = _timed_503(http, base)
        assert WAITED in said, said
        assert http.get(f"{limited.admin}/admin/engines").json()["engines"][name] == "gone"
    finally:
        http.delete(f"{limited.admin}/admin/engines/{name}")


# ---- isolation ------------------------------------------------------------------------------------------------------
def test_a_session_reads_only_its_own_records(router: Served, http: httpx.Client) -> None:
    token_a, base_a = router.session("exec-a")
    token_b, base_b = router.session("exec-b")

    def call(base: str, text: str) -> str:
        messages = [{"role": "user", "content": text}]
        return str(http.post(f"{base}/chat/completions", json=chat(messages=messages)).json()["id"])

    def call_ids(url: str, token: str | None = None) -> list[str]:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        records = http.get(f"{url}/gyre/records", headers=headers).json()["records"]
        assert {r["session"] for r in records} <= {"exec-a", "exec-b"}
        return [r["call_id"] for r in records]

    ids_a = [call(base_a, "a"), call(base_a, "a again"), call(base_a, "hi")]
    ids_b = [call(base_b, "b")]
    assert call_ids(base_a) == ids_a
    assert call_ids(base_b) == ids_b
    assert call_ids(f"{router.url}/v1", token_b) == ids_b
    assert call_ids(base_a, token_b) == ids_a  # the path's token wins over a Bearer naming another session
    assert http.get(f"{base_b}/gyre/records").json()["records"][0]["session"] == "exec-b"
    assert token_a != token_b


# ---- fuzzing --------------------------------------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
SCALAR = st.none() | st.booleans() | st.integers(-3, 40) | st.floats(-1.0, 3.0) | st.text(max_size=10)
NAME = st.text(min_size=1, max_size=6)
ROLE = st.sampled_from(["system", "developer", "user", "assistant", "tool"])


def _tool_call(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    arguments = st.text(max_size=12) | st.dictionaries(st.text(max_size=4), SCALAR, max_size=3) | value
    function = st.fixed_dictionaries({"name": NAME | value}, optional={"arguments": arguments})
    return st.fixed_dictionaries(
        {"id": NAME | value, "function": function | value}, optional={"type": st.just("function") | value}
    )


def _message(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    part = st.fixed_dictionaries({"type": st.just("text") | value, "text": st.text(max_size=12) | value})
    return st.fixed_dictionaries(
        {
            "role": ROLE | value,
            "content": st.none() | st.text(max_size=24) | st.lists(part, max_size=3) | value,
        },
        optional={
            "name": NAME | value,
            "tool_calls": st.lists(_tool_call(value), max_size=2) | value,
            "tool_call_id": NAME | value,
        },
    )


# Values of one field: plausible for its type, or anything.
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["default", "", "tiny", "gpt-4o"]),
    "messages": st.lists(_message(st.nothing()), min_size=1, max_size=4),
    "prompt": st.text(max_size=24)
    | st.lists(st.integers(0, 300), max_size=8)
    | st.lists(st.text(max_size=6), max_size=3),
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3),
    "tools": st.lists(st.dictionaries(st.text(max_size=6), JSON, max_size=3), max_size=2),
}
ANY_MESSAGES = st.lists(_message(JSON) | JSON, max_size=4)


def _request_bodies(fields: tuple[str, ...], required: tuple[str, ...]) -> st.SearchStrategy[bytes]:
    """Raw bytes; any JSON value; objects over the request's field names with values of any type (nested messages
    included); and near-valid requests (``required`` fields plausible, up to three other fields of random type)."""
    plausible = {name: PLAUSIBLE.get(name, st.nothing()) | SCALAR for name in fields}
    anything = {name: plausible[name] | JSON for name in fields} | {"vendor_extra": JSON}
    if "messages" in fields:
        anything["messages"] |= ANY_MESSAGES
    near_valid = st.builds(
        lambda base, extra: {**base, **extra},
        st.fixed_dictionaries({name: PLAUSIBLE[name] for name in required}),
        st.dictionaries(st.sampled_from(sorted(fields)), st.one_of(*plausible.values()), max_size=3),
    )
    objects = st.fixed_dictionaries({}, optional=anything) | near_valid
    return st.one_of(
        st.binary(max_size=40),
        JSON.map(lambda value: json.dumps(value).encode()),
        objects.map(lambda value: json.dumps(value).encode()),
        near_valid.map(lambda value: json.dumps(value).encode()),
    )


def _fuzz(served: Served, http: httpx.Client, path: str, body: st.SearchStrategy[bytes]) -> None:
    _, base = served.session()
    statuses: list[int] = []

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(body=body)
    def check(body: bytes) -> None:
        resp = http.post(f"{base}/{path}", content=body, headers={"content-type": "application/json"})
        statuses.append(resp.status_code)
        assert resp.status_code in ALLOWED, resp.text
        if resp.status_code != 200:
            assert_error(resp, resp.status_code)

    check()
    assert served.proc.proc.poll() is None
    assert http.post(f"{base}/chat/completions", json=chat()).status_code == 200
    counts = {status: statuses.count(status) for status in sorted(set(statuses))}
    assert counts.get(200, 0) >= 5 and counts.get(400, 0) >= 5, counts  # the fuzz reached the engine, too


def test_fuzzed_chat_bodies_never_500(router: Served, http: httpx.Client) -> None:
    _fuzz(
        router,
        http,
        "chat/completions",
        _request_bodies(ChatRequest.__struct_fields__, ("model", "messages")),
    )


def test_fuzzed_completion_bodies_never_500(router: Served, http: httpx.Client) -> None:
    _fuzz(
        router, http, "completions", _request_bodies(CompletionRequest.__struct_fields__, ("model", "prompt"))
    )
