"""The decoder shared by Llama, Mistral, Qwen2 and Qwen3: pre-norm blocks of GQA attention and a gated MLP.

The families differ only in flags of ModelConfig: qkv bias (Qwen2), per-head q/k RMSNorm (Qwen3), tied
embeddings, rope scaling. Attention itself is delegated to the backend bound to the forward batch.
"""

from __future__ import annotations

import torch
from torch import nn

from skiff.attention.base import AttentionBackend
from skiff.distributed.parallel import tp_info
from skiff.layers import fused
from skiff.layers.activation import silu_and_mul
from skiff.layers.linear import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from skiff.layers.norm import RMSNorm
from skiff.layers.rotary import RotaryEmbedding
from skiff.models.config import ModelConfig


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        tp = tp_info().size
        if cfg.num_heads % tp:
            raise ValueError(
                f"{cfg.num_heads} attention heads cannot be split over tensor-parallel size {tp}"
            )
        if cfg.num_kv_heads % tp and tp % cfg.num_kv_heads:
            raise ValueError(f"{cfg.num_kv_heads} KV heads cannot be split or replicated over tp={tp}")
        self.layer_id = layer_id
        self.head_dim = cfg.head_dim
        self.num_heads = cfg.num_heads // tp
        self.num_kv_heads = max(1, cfg.num_kv_heads // tp)
        replicate_kv = tp > cfg.num_kv_heads
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size,
            [cfg.q_size, cfg.kv_size, cfg.kv_size],
            cfg.attention_bias,
            cfg.head_dim,
            [False, replicate_kv, replicate_kv],
        )
        self.o_proj = RowParallelLinear(cfg.q_size, cfg.hidden_size)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.q_width = self.num_heads * self.head_dim
        self.kv_width = self.num_kv_heads * self.head_dim

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, rotary: RotaryEmbedding, backend: AttentionBackend
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_width, self.kv_width, self.kv_width], dim=-1)
        if fused.enabled(x):
            return self._forward_fused(positions, q, k, v, rotary, backend)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions, q, k)
        out = backend.forward(q, k, v, self.layer_id)
        return self.o_proj(out.reshape(t, self.q_width))

    def _forward_fused(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """GPU: q/k/v are column views of the fused projection; norm and rope run as single kernels."""
        t = q.shape[0]
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.view(t, self.num_heads, self.head_dim)).view(t, self.q_width)
            k = self.k_norm(k.view(t, self.num_kv_heads, self.head_dim)).view(t, self.kv_width)
        rotary.forward_inplace(positions, q, k)
        out = backend.forward(
            q.view(t, self.num_heads, self.head_dim),
            k.view(t, self.num_kv_heads, self.head_dim),
            v.view(t, self.num_kv_heads, self.head_dim),
            self.layer_id,
        )
        return self.o_proj(out.reshape(t, self.q_width))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2, bias=False)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm.add_forward(x, residual)
        x = self.self_attn(positions, x, rotary, backend)
        x, residual = self.post_attention_layernorm.add_forward(x, residual)
        return self.mlp(x), residual


class DecoderForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (
            self.embed_tokens
            if cfg.tie_word_embeddings
            else VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, self.rotary, backend)
        x, _ = self.norm.add_forward(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden).float()
