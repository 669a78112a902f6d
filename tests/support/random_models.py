"""Random-weight models in real configuration shapes, saved as HF checkpoints: what the runtime tests compare
against HF transformers and what servers load where the embedded model does not fit (its 9 heads do not split
over two ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 49152  # the SmolLM2 tokenizer's, saved next to every random model

# Real configuration shapes (GQA, head_dim != hidden/heads for Qwen3, biases for Qwen2, rope scaling
# variants, tied and untied embeddings), scaled down to 2-4 layers so that they run in seconds on CPU.
_SMALL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
RANDOM_MODELS: dict[str, dict] = {
    "llama_llama3_rope_sharded": dict(
        _SMALL,
        cls="LlamaConfig",
        intermediate_size=384,
        num_hidden_layers=3,
        max_position_embeddings=2048,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        _shard="3MB",
        _legacy_rope=True,
    ),
    "qwen2_tied_bias": dict(
        _SMALL, cls="Qwen2Config", intermediate_size=320, max_position_embeddings=4096, rope_theta=1000000.0
    )
    | {"tie_word_embeddings": True},
    "qwen3_qknorm_yarn": dict(
        _SMALL,
        cls="Qwen3Config",
        intermediate_size=256,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    ),
    "mistral_untied_mqa": dict(
        _SMALL, cls="MistralConfig", intermediate_size=256, max_position_embeddings=4096, rope_theta=1000000.0
    )
    | {"num_key_value_heads": 1, "sliding_window": None, "tie_word_embeddings": False},
    # The model the engine-mechanics tests (cache, chunking, preemption) and the TP=2 server test run on:
    # 8 heads and 2 KV heads split over two ranks.
    "tiny_llama": dict(
        cls="LlamaConfig",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
}


def build_random_model(name: str, root: Path, tokenizer=None, seed: int = 0) -> Path:
    """Random weights from a real config shape, saved as safetensors (sharded when asked) into root/name."""
    import transformers
    from transformers import AutoModelForCausalLM

    spec = dict(RANDOM_MODELS[name])
    cls = getattr(transformers, spec.pop("cls"))
    shard = spec.pop("_shard", None)
    legacy_rope = spec.pop("_legacy_rope", False)
    # initializer_range 0.1 (not 0.02) keeps random logits decisive, so near-ties stay rare.
    cfg = cls(
        vocab_size=VOCAB, initializer_range=0.1, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, **spec
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # HF initialises norms to one and biases to zero: randomise them so loading shows
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif "norm" in pname:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.2)
    out = root / name
    model.save_pretrained(str(out), max_shard_size=shard) if shard else model.save_pretrained(str(out))
    if legacy_rope:  # the layout of real Llama-3.x config.json files: rope_theta + rope_scaling
        cfg_path = out / "config.json"
        raw = json.loads(cfg_path.read_text())
        params = raw.pop("rope_parameters")
        raw["rope_theta"] = params.pop("rope_theta")
        raw["rope_scaling"] = params
        cfg_path.write_text(json.dumps(raw, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out
