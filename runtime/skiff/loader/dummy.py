"""Random weights for a model built from its config.json alone (`--load-format dummy`), no checkpoint read.

Like HF's initialisation: matrices and embeddings drawn from N(0, std), biases 0, norm weights 1. The draw
is seeded, so a seed gives the same model on the same device and rank; ranks draw their shards apart.
"""

from __future__ import annotations

import torch
from torch import nn

from skiff.distributed.parallel import tp_info
from skiff.layers.norm import RMSNorm

_RANK_STRIDE = 1_000_003  # keeps the seeds of (seed, rank) pairs apart for any practical seed


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    norms = {id(m.weight) for m in model.modules() if isinstance(m, RMSNorm)}
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if id(param) in norms:
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            gen = generators.get(param.device)
            if gen is None:
                gen = torch.Generator(device=param.device)
                gen.manual_seed(seed + _RANK_STRIDE * tp_info().rank)
                generators[param.device] = gen
            param.normal_(0.0, std, generator=gen)
