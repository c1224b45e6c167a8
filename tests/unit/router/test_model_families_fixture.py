"""tests/model_families.py: the pinned real templates, the family tokenizers and the replies the router tests use."""

from __future__ import annotations

import io
import re
import tarfile
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import jinja2
import pytest

import model_families as mf
from model_families import FAMILIES, HISTORY_NEEDS, family_tokenizer, mistral_call_id, reply_text

NAMES = sorted(FAMILIES)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
ARGS = {"city": "Paris", "days": 3}
THINKERS = ("qwen3", "glm45", "deepseekv31", "gpt-oss")  # the families whose models write reasoning


def _refuse_download(dest: Path) -> Path:
    raise AssertionError("templates_dir downloaded although the templates were there")


def _fake_sdist(dest: Path) -> Path:
    """A tarball laid out like the sdist: two templates where llama.cpp keeps them, and files that must stay out."""
    dest.mkdir(parents=True)
    path = dest / "llama_cpp_python-0.3.36.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in ("pkg/vendor/llama.cpp/models/templates/a.jinja", "pkg/vendor/llama.cpp/models/templates/b.jinja",
                     "pkg/vendor/llama.cpp/models/templates/README.md", "pkg/other/c.jinja"):  # fmt: skip
            data = name.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_download_with_another_sha256_is_refused_and_nothing_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "templates"
    monkeypatch.setenv("GYRE_TEST_CACHE", str(target))
    monkeypatch.setattr(mf, "_download_sdist", _fake_sdist)
    with pytest.raises(RuntimeError, match=f"sha256.*{mf.SDIST_SHA256}"):
        mf.templates_dir()
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == [".templates.lock"]  # the staging folder went too


def test_the_cached_templates_are_used_without_a_download(monkeypatch: pytest.MonkeyPatch) -> None:
    first = mf.templates_dir()  # the real sdist: downloaded and checked on this machine's first run
    monkeypatch.setattr(mf, "_download_sdist", _refuse_download)
    assert mf.templates_dir() == first
    assert all((first / family.template).is_file() for family in FAMILIES.values())


def test_gyre_test_cache_naming_a_folder_of_templates_needs_no_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "x.jinja").write_text("{{ messages }}")
    monkeypatch.setenv("GYRE_TEST_CACHE", str(tmp_path))
    monkeypatch.setattr(mf, "_download_sdist", _refuse_download)
    assert mf.templates_dir() == tmp_path


def test_two_callers_at_once_download_once_and_see_the_whole_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cache" / "templates"
    monkeypatch.setenv("GYRE_TEST_CACHE", str(target))
    monkeypatch.setattr(mf, "check_sdist", lambda path: None)
    both_at_the_lock = threading.Barrier(2, timeout=30)
    real_locked = mf._locked
    downloads: list[Path] = []

    def locked(path: Path) -> AbstractContextManager[None]:
        both_at_the_lock.wait()  # neither takes the lock before both have found no templates
        return real_locked(path)

    def download(dest: Path) -> Path:
        downloads.append(dest)
        return _fake_sdist(dest)

    monkeypatch.setattr(mf, "_locked", locked)
    monkeypatch.setattr(mf, "_download_sdist", download)
    results: list[Any] = []

    def call() -> None:
        try:
            results.append(mf.templates_dir())
        except BaseException as e:
            results.append(e)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [target, target]
    assert len(downloads) == 1
    assert sorted(p.name for p in target.iterdir()) == ["a.jinja", "b.jinja"]
    assert sorted(p.name for p in target.parent.iterdir()) == [".templates.lock", "templates"]


@pytest.mark.parametrize("name", NAMES)
def test_each_marker_is_one_id_and_special_as_in_the_real_tokenizer(name: str) -> None:
    family = FAMILIES[name]
    tok = family_tokenizer(name)
    for marker in family.markers:
        assert tok.encode(marker, add_special_tokens=False) == [tok.convert_tokens_to_ids(marker)], marker
    ids = tok.encode("".join(family.markers), add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "".join(family.added)  # decode drops only the special
    assert tok.eos_token == family.eos and tok.bos_token == family.bos and tok.pad_token == family.pad
    assert {t for t in (family.eos, family.bos, family.pad) if t} <= set(family.special)
    assert (
        {family.eos, family.call_end, family.reply_end}
        <= set(family.stops)
        <= set(family.special + family.added)
    )


def _conversation(name: str, reply: bool) -> list[dict[str, Any]]:
    """System, user, a call, its result, (a reply,) user: as the family's template wants them."""
    needs = HISTORY_NEEDS[name]
    call_id = mistral_call_id(0) if needs.call_id else "call_weather_1"
    assert needs.call_id is None or re.fullmatch(needs.call_id, call_id)
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "The weather in Paris?"},
        {"role": "assistant", "content": "" if needs.content_string else None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
    ]
    if reply or needs.reply_before_user:
        messages.append({"role": "assistant", "content": "Sunny."})
    return [*messages, {"role": "user", "content": "Thanks."}]


@pytest.mark.parametrize("name", NAMES)
def test_each_template_renders_a_conversation_with_a_tool_call(name: str) -> None:
    tok = family_tokenizer(name)
    text = tok.apply_chat_template(_conversation(name, reply=False), tools=TOOLS, tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    assert isinstance(text, str) and "get_weather" in text and "Thanks." in text


def test_mistral_needs_a_reply_between_a_tool_result_and_the_next_user_message() -> None:
    messages = _conversation("mistral", reply=False)
    del messages[-2]  # the reply HISTORY_NEEDS asks for
    with pytest.raises(jinja2.TemplateError, match="alternate"):
        family_tokenizer("mistral").apply_chat_template(messages, tools=TOOLS, tokenize=False)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "gpt-oss"])
def test_replies_are_what_the_template_writes_for_them_in_history(name: str) -> None:
    """gpt-oss is left out: its template writes a past call's recipient before the channel, the model after."""
    tok = family_tokenizer(name)
    text = tok.apply_chat_template(_conversation(name, reply=True), tools=TOOLS, tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    assert reply_text(name, calls=[("get_weather", ARGS)]) in text
    assert reply_text(name, content="Sunny.") in text


def _markers_in(text: str, markers: tuple[str, ...]) -> list[str]:
    pattern = "|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True))
    return re.findall(pattern, text)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reasoning", [None, "The user wants the weather."])
def test_a_reply_encodes_each_marker_to_its_one_id_and_ends_with_the_terminator(
    name: str, reasoning: str | None
) -> None:
    family = FAMILIES[name]
    if reasoning is not None and name not in THINKERS:
        with pytest.raises(ValueError, match="no reasoning"):
            reply_text(name, reasoning=reasoning, calls=[("get_weather", ARGS)])
        return
    tok = family_tokenizer(name)
    marker_of = {tok.convert_tokens_to_ids(m): m for m in family.markers}
    for calls, end in (([("get_weather", ARGS)], family.call_end), ([], family.reply_end)):
        text = reply_text(name, reasoning=reasoning, content="" if calls else "Sunny.", calls=calls)
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert all(i < 256 or i in marker_of for i in ids)  # bytes, and markers as their single ids
        assert [marker_of[i] for i in ids if i in marker_of] == _markers_in(text, family.markers)
        assert ids[-1] == tok.convert_tokens_to_ids(end)
        assert not reply_text(name, reasoning=reasoning, content="" if calls else "Sunny.", calls=calls,
                              end=False).endswith(end)  # fmt: skip
