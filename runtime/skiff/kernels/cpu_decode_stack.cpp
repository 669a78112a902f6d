// One CPU decode step through every decoder layer in one call, for models whose projections all run on GGUF
// blocks (skiff.models.decode_stack builds the arguments). It calls the same kernels in the same order as the
// layer-by-layer path (skiff.models.decoder with the fused CPU ops and the torch attention backend), so the
// hidden states are that path's bit for bit; what it saves is ~12 Python-level ops per layer, each a module
// call and a dispatch that cost as much as a one-token linear.
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu_ops.h"

namespace {

// Tensors of one layer in `weights`, in this order; an absent optional one (bias, q/k norm) is an empty tensor.
enum Weight : int64_t {
  kInNorm, kQkvCodes, kQkvScales, kQkvOffsets, kQkvBias, kQNorm, kKNorm, kOCodes, kOScales, kOOffsets,
  kPostNorm, kGateUpCodes, kGateUpScales, kGateUpOffsets, kDownCodes, kDownScales, kDownOffsets, kPerLayer
};

c10::optional<at::Tensor> present(const at::Tensor& t) {
  return t.numel() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// rows [B, width] (row stride allowed) -> cache[slots[b]] ([slots, Hkv, D] contiguous), rounded to its dtype
template <typename KV>
void write_rows(const at::Tensor& rows, at::Tensor& cache, const int64_t* slots) {
  const int64_t width = rows.size(1), stride = rows.stride(0);
  const float* src = rows.data_ptr<float>();
  auto* dst = reinterpret_cast<KV*>(cache.data_ptr());
  for (int64_t b = 0; b < rows.size(0); ++b) {
    const float* s = src + b * stride;
    KV* d = dst + slots[b] * width;
    if constexpr (std::is_same_v<KV, float>) std::memcpy(d, s, width * sizeof(float));
    else
      for (int64_t i = 0; i < width; ++i) d[i] = KV(s[i]);
  }
}

void write_kv(const at::Tensor& rows, at::Tensor cache, const int64_t* slots) {
  switch (cache.scalar_type()) {
    case at::kFloat: return write_rows<float>(rows, cache, slots);
    case at::kHalf: return write_rows<c10::Half>(rows, cache, slots);
    case at::kBFloat16: return write_rows<c10::BFloat16>(rows, cache, slots);
    default: TORCH_CHECK(false, "decode_stack: KV cache dtype must be float32, float16 or bfloat16");
  }
}

// embeds: [B, hidden] fp32, one token per sequence; positions/slots: [B] int64; page_table [B, P] and seq_lens
// [B] as paged_decode_attention takes them; k_cache/v_cache: one [slots, Hkv, D] tensor per layer; weights:
// kPerLayer tensors per layer, then the final norm; dims: heads, kv_heads, head_dim, intermediate size,
// page_size; qtypes: the GGML types of qkv, o, gate_up, down per layer -> the final norm's output [B, hidden].
at::Tensor decode_stack(const at::Tensor& embeds, const at::Tensor& positions, const at::Tensor& slots,
                        const at::Tensor& page_table, const at::Tensor& seq_lens, const at::Tensor& cos_sin,
                        at::TensorList k_cache, at::TensorList v_cache, at::TensorList weights,
                        at::IntArrayRef dims, at::IntArrayRef qtypes, double eps, double scale, bool precise) {
  const int64_t layers = static_cast<int64_t>(k_cache.size());
  TORCH_CHECK(v_cache.size() == k_cache.size() && static_cast<int64_t>(weights.size()) == layers * kPerLayer + 1 &&
                  static_cast<int64_t>(qtypes.size()) == 4 * layers && dims.size() == 5,
              "decode_stack: ", layers, " layers need ", kPerLayer, " weights and 4 GGML types each, and 5 dims");
  TORCH_CHECK(embeds.dim() == 2 && embeds.scalar_type() == at::kFloat && embeds.device().is_cpu(),
              "decode_stack: embeds must be a [B, hidden] float32 CPU tensor");
  const int64_t batch = embeds.size(0), hidden = embeds.size(1);
  const int64_t heads = dims[0], kv_heads = dims[1], head_dim = dims[2], inter = dims[3], page_size = dims[4];
  const int64_t q_width = heads * head_dim, kv_width = kv_heads * head_dim;
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == batch,
              "decode_stack: slots must be contiguous int64, one per row");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t l = 0; l < layers; ++l) {
    TORCH_CHECK(k_cache[l].dim() == 3 && k_cache[l].is_contiguous() && k_cache[l].size(1) * k_cache[l].size(2) == kv_width &&
                    v_cache[l].sizes() == k_cache[l].sizes() && v_cache[l].is_contiguous() &&
                    v_cache[l].scalar_type() == k_cache[l].scalar_type(),
                "decode_stack: layer ", l, "'s KV cache must be two contiguous [slots, ", kv_heads, ", ", head_dim, "]");
    for (int64_t b = 0; b < batch; ++b)
      TORCH_CHECK(slot[b] >= 0 && slot[b] < k_cache[l].size(0), "decode_stack: slot ", slot[b], " out of the pool");
  }

  at::Tensor residual = embeds.contiguous().clone();
  at::Tensor x;
  for (int64_t l = 0; l < layers; ++l) {
    auto w = [&](Weight s) -> const at::Tensor& { return weights[l * kPerLayer + s]; };
    if (l == 0) x = skiff_cpu::rms_norm(residual, w(kInNorm), eps);
    else skiff_cpu::add_rms_norm_(x, residual, w(kInNorm), eps);

    const at::Tensor qkv = skiff_cpu::gguf_linear(x, w(kQkvCodes), w(kQkvScales), w(kQkvOffsets), qtypes[4 * l],
                                                  q_width + 2 * kv_width, present(w(kQkvBias)), precise);
    at::Tensor q = qkv.narrow(1, 0, q_width), k = qkv.narrow(1, q_width, kv_width);
    const at::Tensor v = qkv.narrow(1, q_width + kv_width, kv_width);
    if (w(kQNorm).numel()) {
      q = skiff_cpu::rms_norm(q.view({batch, heads, head_dim}), w(kQNorm), eps).view({batch, q_width});
      k = skiff_cpu::rms_norm(k.view({batch, kv_heads, head_dim}), w(kKNorm), eps).view({batch, kv_width});
    }
    skiff_cpu::rope_(q, k, positions, cos_sin, head_dim);
    write_kv(k, k_cache[l], slot);
    write_kv(v, v_cache[l], slot);
    const at::Tensor attn = skiff_cpu::paged_decode_attention(q.view({batch, heads, head_dim}), k_cache[l], v_cache[l],
                                                              page_table, seq_lens, page_size, scale);
    x = skiff_cpu::gguf_linear(attn.view({batch, q_width}), w(kOCodes), w(kOScales), w(kOOffsets), qtypes[4 * l + 1],
                               hidden, c10::nullopt, precise);

    skiff_cpu::add_rms_norm_(x, residual, w(kPostNorm), eps);
    const at::Tensor gate_up = skiff_cpu::gguf_linear(x, w(kGateUpCodes), w(kGateUpScales), w(kGateUpOffsets),
                                                      qtypes[4 * l + 2], 2 * inter, c10::nullopt, precise);
    x = skiff_cpu::gguf_linear(skiff_cpu::silu_and_mul(gate_up), w(kDownCodes), w(kDownScales), w(kDownOffsets),
                               qtypes[4 * l + 3], hidden, c10::nullopt, precise);
  }
  skiff_cpu::add_rms_norm_(x, residual, weights[layers * kPerLayer], eps);
  return x;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(skiff_cpu, m) {
  m.def("decode_stack(Tensor embeds, Tensor positions, Tensor slots, Tensor page_table, Tensor seq_lens, "
        "Tensor cos_sin, Tensor(a!)[] k_cache, Tensor(b!)[] v_cache, Tensor[] weights, int[] dims, int[] qtypes, "
        "float eps, float scale, bool precise) -> Tensor",
        &decode_stack);
}
