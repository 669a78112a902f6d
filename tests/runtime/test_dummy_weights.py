"""`load_format="dummy"`: an Engine from a folder holding only config.json, on seeded random weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from skiff import SamplingParams
from skiff.config import EngineConfig
from skiff.engine.engine import Engine

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, eos_token_id=0)
HEADS = dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
CONFIGS = {
    "llama": dict(TINY, **HEADS, architectures=["LlamaForCausalLM"], tie_word_embeddings=False),
    "qwen3": dict(TINY, **HEADS, architectures=["Qwen3ForCausalLM"], head_dim=32, tie_word_embeddings=True),
}
PROMPT = [5, 17, 301, 42, 9, 128, 77]
NEW_TOKENS = 12


@pytest.fixture(params=sorted(CONFIGS))
def config_only(request, tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[request.param]))
    return tmp_path


def _engine(path: Path, seed: int) -> Engine:
    return Engine(
        EngineConfig(model=str(path), load_format="dummy", device="cpu", max_total_tokens=1024, seed=seed)
    )


def _greedy(engine: Engine) -> list[int]:
    engine.add_request(
        "r", list(PROMPT), SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    )
    tokens: list[int] = []
    while engine.has_work:
        for out in engine.step():
            tokens.extend(out.token_ids)
    return tokens


def _weights(engine: Engine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.runner.model.named_parameters()}


def test_dummy_weights_are_seeded_and_shaped_like_hf_init(config_only: Path) -> None:
    assert [p.name for p in config_only.iterdir()] == ["config.json"]
    first, again, other = _engine(config_only, 3), _engine(config_only, 3), _engine(config_only, 4)
    try:
        tokens = _greedy(first)
        assert len(tokens) == NEW_TOKENS and all(0 <= t < TINY["vocab_size"] for t in tokens)
        assert _greedy(again) == tokens
        weights, same, different = _weights(first), _weights(again), _weights(other)
        assert all(torch.equal(weights[n], same[n]) for n in weights)
        for name, w in weights.items():
            if name.endswith("norm.weight"):
                assert torch.all(w == 1.0), name
            else:
                assert not torch.equal(w, different[name]), name
                assert 0.015 < w.std().item() < 0.025, name
    finally:
        for engine in (first, again, other):
            engine.shutdown()


def test_unknown_load_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="load_format must be one of auto, dummy"):
        EngineConfig(load_format="safetensors")  # type: ignore[arg-type]
