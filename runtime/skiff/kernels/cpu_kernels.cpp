// Fused fp32 CPU kernels for the torch backend: the CPU counterparts of FlashInfer's norm, rope and
// activation kernels, the row scaling of the int8 linears and a vectorized argmax (decode attention is in
// cpu_decode_attention.cpp, the int8 linear in cpu_int8.cpp). Each replaces a chain of small torch ops
// whose per-op dispatch cost dominates at decode batch sizes. Work is split with at::parallel_for, i.e. torch's own OpenMP pool and thread count.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include "cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

namespace {

constexpr int64_t kGrainElems = 32768;  // below this much work a chunk runs on the calling thread

void check_f32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name, " must be a float32 CPU tensor");
  TORCH_CHECK(t.dim() >= 1 && t.stride(-1) == 1, name, " must be contiguous in its last dimension");
}

int64_t grain(int64_t per_item) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, per_item)); }

// exp(x) by range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial (about 1 ulp); written without
// library calls so that `omp simd` loops around it vectorize.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float k = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - k * 0.693145751953125f - k * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline float inv_rms(const float* x, int64_t d, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
  return 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
}

// x: [T, D] or [T, H, D] with any leading strides -> a contiguous normalized copy.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_f32(x, "x");
  check_f32(weight, "weight");
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "rms_norm takes [T, D] or [T, H, D]");
  const int64_t d = x.size(-1);
  TORCH_CHECK(weight.numel() == d, "weight must have ", d, " elements");
  const int64_t inner = x.dim() == 3 ? x.size(1) : 1;
  const int64_t s0 = x.stride(0), s1 = x.dim() == 3 ? x.stride(1) : 0;
  at::Tensor out = at::empty(x.sizes(), x.options());
  const float* px = x.data_ptr<float>();
  const float* pw = weight.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, x.size(0) * inner, grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = px + (r / inner) * s0 + (r % inner) * s1;
      float* orow = po + r * d;
      const float s = inv_rms(xr, d, e);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) orow[i] = pw[i] * (xr[i] * s);
    }
  });
  return out;
}

// In place: residual += x; x = rms_norm(residual) * weight. Both contiguous [T, D].
void add_rms_norm_(at::Tensor x, at::Tensor residual, const at::Tensor& weight, double eps) {
  check_f32(x, "x");
  check_f32(residual, "residual");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && residual.is_contiguous() && x.sizes() == residual.sizes(),
              "add_rms_norm_ takes two contiguous [T, D] tensors of one shape");
  const int64_t d = x.size(1);
  TORCH_CHECK(weight.numel() == d, "weight must have ", d, " elements");
  float* px = x.data_ptr<float>();
  float* pr = residual.data_ptr<float>();
  const float* pw = weight.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, x.size(0), grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* xr = px + r * d;
      float* rr = pr + r * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) rr[i] += xr[i];
      const float s = inv_rms(rr, d, e);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) xr[i] = pw[i] * (rr[i] * s);
    }
  });
}

void rope_rows(float* base, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim,
               const int64_t* pos, const float* cos_sin, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  at::parallel_for(0, rows, grain(heads * head_dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = cos_sin + pos[t] * rotary_dim;
      const float* sin = cos + half;
      for (int64_t h = 0; h < heads; ++h) {
        float* x1 = base + t * row_stride + h * head_dim;
        float* x2 = x1 + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i];
          x1[i] = a * cos[i] - b * sin[i];
          x2[i] = b * cos[i] + a * sin[i];
        }
      }
    }
  });
}

// Neox-layout rotary embedding in place. q: [T, Hq*D], k: [T, Hk*D] (row strides allowed);
// cos_sin: [max_position, rotary_dim], cos in the first half of each row, sin in the second.
void rope_(at::Tensor q, at::Tensor k, const at::Tensor& positions, const at::Tensor& cos_sin, int64_t head_dim) {
  check_f32(q, "q");
  check_f32(k, "k");
  check_f32(cos_sin, "cos_sin");
  TORCH_CHECK(q.dim() == 2 && k.dim() == 2 && cos_sin.dim() == 2 && cos_sin.is_contiguous(), "rope_ shapes");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == q.size(0),
              "positions must be contiguous int64, one per row");
  const int64_t rotary_dim = cos_sin.size(1);
  TORCH_CHECK(rotary_dim % 2 == 0 && rotary_dim <= head_dim, "rotary_dim must be even and <= head_dim");
  TORCH_CHECK(q.size(1) % head_dim == 0 && k.size(1) % head_dim == 0, "q/k widths must be multiples of head_dim");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t max_pos = cos_sin.size(0);
  for (int64_t t = 0; t < positions.numel(); ++t) TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "position out of range");
  rope_rows(q.data_ptr<float>(), q.size(0), q.stride(0), q.size(1) / head_dim, head_dim, pos,
            cos_sin.data_ptr<float>(), rotary_dim);
  rope_rows(k.data_ptr<float>(), k.size(0), k.stride(0), k.size(1) / head_dim, head_dim, pos,
            cos_sin.data_ptr<float>(), rotary_dim);
}

// x: [T, 2I] (gate | up) -> silu(gate) * up, [T, I].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "silu_and_mul takes [T, 2I]");
  const int64_t n = x.size(1) / 2, s0 = x.stride(0);
  at::Tensor out = at::empty({x.size(0), n}, x.options());
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, x.size(0), grain(8 * n), [&](int64_t begin, int64_t end) {  // exp: ~8x an add's work
    for (int64_t r = begin; r < end; ++r) {
      const float* g = px + r * s0;
      const float* u = g + n;
      float* o = po + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + exp_approx(-g[i])) * u[i];
    }
  });
  return out;
}

// x: [T, K] -> (x / amax, amax) with amax = max(|x|) of each row (at least 1e-12), shaped [T, 1].
std::tuple<at::Tensor, at::Tensor> row_normalize(const at::Tensor& x) {
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2, "row_normalize takes [T, K]");
  const int64_t rows = x.size(0), d = x.size(1), s0 = x.stride(0);
  at::Tensor out = at::empty({rows, d}, x.options());
  at::Tensor amax = at::empty({rows, 1}, x.options());
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  float* pa = amax.data_ptr<float>();
  at::parallel_for(0, rows, grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = px + r * s0;
      float m = 0.0f;
#pragma omp simd reduction(max : m)
      for (int64_t i = 0; i < d; ++i) m = std::max(m, std::fabs(xr[i]));
      m = std::max(m, 1e-12f);
      pa[r] = m;
      float* orow = po + r * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) orow[i] = xr[i] / m;
    }
  });
  return {out, amax};
}

// Row-wise argmax of [N, V] logits; the first index of the maximum, as torch.argmax (which does not
// vectorize on CPU: ~4 ms for 16 rows of a 49k vocabulary against ~0.1 ms here).
at::Tensor argmax_rows(const at::Tensor& x) {
  check_f32(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0, "argmax_rows takes [N, V] with V > 0");
  const int64_t rows = x.size(0), v = x.size(1), s0 = x.stride(0);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* px = x.data_ptr<float>();
  int64_t* po = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, grain(v), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = px + r * s0;
      float m = xr[0];
#pragma omp simd reduction(max : m)
      for (int64_t i = 1; i < v; ++i) m = std::max(m, xr[i]);
      int64_t at = 0;
      while (at < v && !(xr[at] == m)) ++at;
      po[r] = at < v ? at : 0;  // NaN rows (no element equals the max) give 0
    }
  });
  return out;
}

}  // namespace

namespace skiff_cpu {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) { return ::rms_norm(x, weight, eps); }
void add_rms_norm_(at::Tensor x, at::Tensor residual, const at::Tensor& weight, double eps) {
  ::add_rms_norm_(x, residual, weight, eps);
}
void rope_(at::Tensor q, at::Tensor k, const at::Tensor& positions, const at::Tensor& cos_sin, int64_t head_dim) {
  ::rope_(q, k, positions, cos_sin, head_dim);
}
at::Tensor silu_and_mul(const at::Tensor& x) { return ::silu_and_mul(x); }
}  // namespace skiff_cpu

TORCH_LIBRARY_FRAGMENT(skiff_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()", &add_rms_norm_);
  m.def("rope_(Tensor(a!) q, Tensor(b!) k, Tensor positions, Tensor cos_sin, int head_dim) -> ()", &rope_);
  m.def("silu_and_mul(Tensor x) -> Tensor", &silu_and_mul);
  m.def("row_normalize(Tensor x) -> (Tensor, Tensor)", &row_normalize);
  m.def("argmax_rows(Tensor x) -> Tensor", &argmax_rows);
}
