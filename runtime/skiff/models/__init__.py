"""Model registry: family name -> model class (all four families share one decoder today)."""

from __future__ import annotations

from torch import nn

from skiff.models.config import ARCHITECTURES, ModelConfig
from skiff.models.decoder import DecoderForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {family: DecoderForCausalLM for family in ARCHITECTURES.values()}


def build_model(cfg: ModelConfig) -> nn.Module:
    try:
        cls = MODEL_REGISTRY[cfg.family]
    except KeyError:
        raise ValueError(
            f"unsupported model family {cfg.family!r}; supported: {sorted(MODEL_REGISTRY)}"
        ) from None
    return cls(cfg)


__all__ = ["MODEL_REGISTRY", "ModelConfig", "build_model"]
