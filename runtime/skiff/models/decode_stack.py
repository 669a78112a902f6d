"""CPU decode steps through all decoder layers in one C++ call (kernels/cpu_decode_stack.cpp).

On the GGUF path a step of one token per sequence runs ~12 small ops per layer, and their Python and
dispatch cost (~6-8 ms a step over the embedded model's 30 layers) rivals the linears' ~10 ms. Where every
projection is one GGUF kernel, the model is fp32 on CPU on one rank and the attention backend is the torch
one, the stack runs the layers' kernels in their order on the same KV pool, so a step's hidden states are the
layer-by-layer path's bit for bit. Prefill and mixed batches keep the layer path.
`SKIFF_CPU_DECODE_STACK=0` turns it off (ablation).
"""

from __future__ import annotations

import os

import torch

from skiff.attention.torch_backend import TorchBackend, decode_page_table
from skiff.distributed.parallel import tp_info
from skiff.engine.forward_batch import ForwardBatch
from skiff.kernels import cpu as cpu_kernels
from skiff.layers.gguf_quant import GGUFLinear
from skiff.models.decoder import DecoderForCausalLM

_NONE = torch.empty(0)


def _kernel(module: torch.nn.Module) -> GGUFLinear | None:
    kernel = getattr(module, "kernel", None)
    return kernel if isinstance(kernel, GGUFLinear) else None


class DecodeStack:
    """The decoder layers' weights as the C++ stack takes them; call it on a pure decode batch."""

    def __init__(
        self, model: DecoderForCausalLM, backend: TorchBackend, kernels: list[list[GGUFLinear]]
    ) -> None:
        cfg, attn, pool = model.config, model.layers[0].self_attn, backend.pool
        self.model, self.pool = model, pool
        self.eps = cfg.rms_norm_eps
        self.scale = backend.scale
        self.dims = [attn.num_heads, attn.num_kv_heads, attn.head_dim, cfg.intermediate_size, pool.page_size]
        self.precise = kernels[0][0].precise
        self.weights: list[torch.Tensor] = []
        self.qtypes: list[int] = []
        for layer, (qkv, o, gate_up, down) in zip(model.layers, kernels, strict=True):
            sa = layer.self_attn
            norms = [_NONE, _NONE] if sa.q_norm is None else [sa.q_norm.weight.data, sa.k_norm.weight.data]
            self.weights += [layer.input_layernorm.weight.data, qkv.codes, qkv.scales, qkv.offsets]
            self.weights += [_NONE if qkv.bias is None else qkv.bias, *norms, o.codes, o.scales, o.offsets]
            self.weights += [layer.post_attention_layernorm.weight.data, gate_up.codes, gate_up.scales]
            self.weights += [gate_up.offsets, down.codes, down.scales, down.offsets]
            self.qtypes += [qkv.qtype, o.qtype, gate_up.qtype, down.qtype]
        self.weights.append(model.norm.weight.data)
        self._op = cpu_kernels.ops().decode_stack

    @classmethod
    def build(cls, model: torch.nn.Module, backend: object) -> DecodeStack | None:
        """The stack where the model qualifies (above), else None."""
        if (
            os.environ.get("SKIFF_CPU_DECODE_STACK") == "0"
            or not isinstance(model, DecoderForCausalLM)
            or not isinstance(backend, TorchBackend)
            or tp_info().size != 1
            or backend.pool.compute_dtype != torch.float32
            or model.norm.weight.device.type != "cpu"
            or not cpu_kernels.available()
        ):
            return None
        kernels = [
            [_kernel(layer.self_attn.qkv_proj), _kernel(layer.self_attn.o_proj)]
            + [_kernel(layer.mlp.gate_up_proj), _kernel(layer.mlp.down_proj)]
            for layer in model.layers
        ]
        found = [k for ks in kernels for k in ks]
        if None in found or len({k.precise for k in found}) != 1:  # type: ignore[union-attr]
            return None
        return cls(model, backend, kernels)  # type: ignore[arg-type]

    def __call__(self, batch: ForwardBatch) -> torch.Tensor:
        """Final-norm hidden states [B, hidden] of a batch whose every sequence decodes one token."""
        lens = torch.tensor(batch.seq_lens, dtype=torch.int64)
        return self._op(
            self.model.embed_tokens(batch.input_ids),
            batch.positions,
            batch.out_slots,
            decode_page_table(batch),
            lens,
            self.model.rotary.cos_sin,
            self.pool.k,
            self.pool.v,
            self.weights,
            self.dims,
            self.qtypes,
            self.eps,
            self.scale,
            self.precise,
        )
