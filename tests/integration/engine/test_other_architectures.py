"""Any local Hugging Face directory of a supported family works, not only the tiny preset (and without a tokenizer)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from gyre.config import EngineConfig
from gyre.engine.embedded.asyncengine import EmbeddedEngine
from gyre.errors import ConfigError, EngineRequestError
from gyre.protocol import GenerateRequest, SamplingParams
from reference import hf_greedy, hf_logprobs

SMALL = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}


def _save(kind: str, directory: Path, **extra: Any) -> Any:
    import transformers

    config_cls = getattr(transformers, f"{kind}Config")
    model_cls = getattr(transformers, f"{kind}ForCausalLM")
    config = config_cls(num_attention_heads=4, num_key_value_heads=2, **SMALL, **extra)
    torch.manual_seed(0)
    model = model_cls(config).eval()
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("Llama", {"tie_word_embeddings": False}),
        ("Qwen2", {"tie_word_embeddings": True}),
        ("Qwen3", {"head_dim": 32}),
    ],
)
def test_greedy_and_logprobs_match_hugging_face(tmp_path: Path, kind: str, extra: dict[str, Any]) -> None:
    model = _save(kind, tmp_path, **extra)
    engine = EmbeddedEngine(EngineConfig(model_path=str(tmp_path), kv_cache_mem_gib=0.05))
    prompts = [[5, 6, 7, 8, 9], list(range(40, 80))]
    params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)

    async def go() -> list[Any]:
        reqs = [GenerateRequest(input_ids=p, sampling_params=params, return_logprob=True) for p in prompts]
        return list(await asyncio.gather(*(engine.generate(r) for r in reqs)))

    try:
        outs = asyncio.run(go())
        with pytest.raises(
            EngineRequestError, match="tokenizer"
        ):  # no tokenizer saved: text input is refused
            asyncio.run(engine.generate(GenerateRequest(text="hi")))
    finally:
        engine.close()
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.output_ids == hf_greedy(model, prompt, 16)
        ref = hf_logprobs(model, prompt, out.output_ids)
        assert max(abs(a - b) for a, b in zip(out.output_logprobs, ref, strict=True)) < 1e-4


def test_unsupported_models_are_refused_clearly(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ConfigError, match="GPT2LMHeadModel"):
        EmbeddedEngine(EngineConfig(model_path=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"config\.json"):
        EmbeddedEngine(EngineConfig(model_path=str(tmp_path / "missing")))
