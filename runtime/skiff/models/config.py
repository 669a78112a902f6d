"""ModelConfig: the architecture facts a decoder needs, read from an HF config.json or GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skiff.layers.rotary import RopeConfig

# HF architecture name -> Skiff model family
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    checkpoint_dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        family = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        if family is None:
            model_type = cfg.get("model_type")
            family = model_type if model_type in ARCHITECTURES.values() else None
        if family is None:
            raise ValueError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; supported: {sorted(ARCHITECTURES)}"
            )
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        rope_params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope_params.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        partial = rope_params.pop("partial_rotary_factor", None) or cfg.get("partial_rotary_factor", 1.0)
        max_pos = cfg.get("max_position_embeddings", 4096)
        if family == "mistral" and cfg.get("sliding_window"):
            max_pos = min(
                max_pos, cfg["sliding_window"]
            )  # no sliding-window attention: stay inside the window
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            family=family,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope=RopeConfig(int(head_dim * partial), float(theta), max_pos, rope_params),
            max_position=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
            qk_norm=family == "qwen3",
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            checkpoint_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        )
