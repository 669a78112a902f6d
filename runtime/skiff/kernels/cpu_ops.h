// The CPU kernels other kernels call directly (in C++, no dispatcher): each is the op of the same name in
// torch.ops.skiff_cpu, defined in cpu_kernels.cpp, cpu_gguf.cpp and cpu_decode_attention.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

namespace skiff_cpu {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
void add_rms_norm_(at::Tensor x, at::Tensor residual, const at::Tensor& weight, double eps);
void rope_(at::Tensor q, at::Tensor k, const at::Tensor& positions, const at::Tensor& cos_sin, int64_t head_dim);
at::Tensor silu_and_mul(const at::Tensor& x);
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t type, int64_t n, const c10::optional<at::Tensor>& bias,
                       bool precise);
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& page_table, const at::Tensor& seq_lens, int64_t page_size,
                                  double scale);

}  // namespace skiff_cpu
