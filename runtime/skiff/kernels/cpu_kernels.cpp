// Fused fp32 CPU kernels for the torch backend: the CPU counterparts of FlashInfer's norm, rope and
// activation kernels, the row scaling of the int8 linears, and decode attention read straight from the
// paged KV pool. Each replaces a chain of small torch ops whose per-op dispatch cost dominates at decode
// batch sizes. Work is split with at::parallel_for, i.e. torch's own OpenMP pool and thread count.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kGrainElems = 32768;  // below this much work a chunk runs on the calling thread
constexpr int64_t kMaxGroup = 64;       // query heads per KV head in decode attention

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

// KV cache rows in fp16 or bf16 are converted to fp32 before use, one row (head_dim elements) at a time.
struct Bf16 {
  uint16_t bits;
};

inline void to_f32_row(const _Float16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void to_f32_row(const Bf16* src, float* dst, int64_t n) {  // bf16 is the high half of an fp32
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(bits[i]) << 16;
}

typedef float v8 __attribute__((vector_size(32)));                 // 8 fp32 lanes (GCC vector extension)
typedef float v8u __attribute__((vector_size(32), aligned(4)));  // the same at any float alignment

// out[0:W] = inv * sum_t w[t] * vrows[t][col:col+W]. The W accumulators stay in registers across the pass
// over t (W/8 AVX registers), instead of a load, FMA and store of the output row for every token.
template <int64_t W>
inline void weighted_sum(const float* w, const float* const* vrows, int64_t col, int64_t len, float inv, float* out) {
  v8 acc[W / 8] = {};
  for (int64_t t = 0; t < len; ++t) {
    const float* vr = vrows[t] + col;
    const v8 wt = v8{} + w[t];
    for (int64_t c = 0; c < W / 8; ++c) acc[c] += wt * *reinterpret_cast<const v8u*>(vr + 8 * c);
  }
  for (int64_t c = 0; c < W / 8; ++c) *reinterpret_cast<v8u*>(out + 8 * c) = acc[c] * inv;
}

// Decode attention of one sequence's `group` query heads (already scaled, [group, D]) sharing one KV head,
// over its tokens' K and V rows (krows[t], vrows[t]: D floats each). D is the head dim as a compile-time
// constant for the common sizes, 0 for any. Scores are held whole (softmax, then the weighted sum of V),
// which at decode lengths costs less than an online softmax.
template <int64_t D>
void attend_one(const float* qg, const float* const* krows, const float* const* vrows, int64_t len,
                int64_t group, int64_t dyn_d, float* scores, float* out) {
  const int64_t d = D > 0 ? D : dyn_d;
  // Four tokens per pass: four independent accumulator chains instead of one (a lone chain of dependent
  // FMAs waits on their latency) and one load of each query element for all four.
  for (int64_t g = 0; g < group; ++g) {
    const float* qr = qg + g * d;
    float* s = scores + g * len;
    int64_t t = 0;
    for (; t + 4 <= len; t += 4) {
      const float *k0 = krows[t], *k1 = krows[t + 1], *k2 = krows[t + 2], *k3 = krows[t + 3];
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
      for (int64_t i = 0; i < d; ++i) {
        const float qi = qr[i];
        a0 += qi * k0[i];
        a1 += qi * k1[i];
        a2 += qi * k2[i];
        a3 += qi * k3[i];
      }
      s[t] = a0, s[t + 1] = a1, s[t + 2] = a2, s[t + 3] = a3;
    }
    for (; t < len; ++t) {
      const float* kr = krows[t];
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < d; ++i) acc += qr[i] * kr[i];
      s[t] = acc;
    }
  }
  float inv_sum[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores + g * len;
    float m = s[0];
#pragma omp simd reduction(max : m)
    for (int64_t t = 1; t < len; ++t) m = std::max(m, s[t]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < len; ++t) {
      s[t] = exp_approx(s[t] - m);
      sum += s[t];
    }
    inv_sum[g] = 1.0f / sum;
  }
  for (int64_t g = 0; g < group; ++g) {
    const float* w = scores + g * len;
    float* og = out + g * d;
    if constexpr (D > 0 && D % 32 == 0) {
      constexpr int64_t W = D % 64 == 0 ? 64 : 32;  // output columns summed in registers per pass over t
      for (int64_t c = 0; c < D; c += W) weighted_sum<W>(w, vrows, c, len, inv_sum[g], og + c);
    } else {
      std::fill(og, og + d, 0.0f);
      for (int64_t t = 0; t < len; ++t) {
        const float* vr = vrows[t];
        const float wt = w[t];
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) og[i] += wt * vr[i];
      }
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) og[i] *= inv_sum[g];
    }
  }
}

// Rows of one KV head for a sequence's tokens: pointers into an fp32 pool, or (fp16/bf16 pools) into `buf`,
// where each row is first converted to fp32 by one vectorized pass: half the bytes read from memory.
template <typename KV>
void kv_rows(const KV* base, const int64_t* pages, int64_t len, int64_t page_size, int64_t row, int64_t d,
             float* buf, const float** rows) {
  for (int64_t t0 = 0, p = 0; t0 < len; t0 += page_size, ++p)
    for (int64_t j = 0, n = std::min(page_size, len - t0); j < n; ++j) {
      const KV* src = base + (pages[p] * page_size + j) * row;
      if constexpr (std::is_same_v<KV, float>) {
        rows[t0 + j] = src;
      } else {
        float* dst = buf + (t0 + j) * d;
        to_f32_row(src, dst, d);
        rows[t0 + j] = dst;
      }
    }
}

// One query token per sequence against its pages. q: [B, Hq, D] (leading strides allowed);
// k_cache/v_cache: [slots, Hkv, D] contiguous (fp32, fp16 or bf16), slot = page * page_size + offset;
// page_table: [B, P] int64; seq_lens: [B] int64 (tokens to attend, the new one included) -> [B, Hq, D].
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& page_table, const at::Tensor& seq_lens, int64_t page_size,
                                  double scale) {
  check_f32(q, "q");
  const auto kv_type = k_cache.scalar_type();
  TORCH_CHECK(k_cache.device().is_cpu() && v_cache.scalar_type() == kv_type &&
                  (kv_type == at::kFloat || kv_type == at::kHalf || kv_type == at::kBFloat16),
              "k_cache/v_cache must be CPU tensors of one dtype: float32, float16 or bfloat16");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.sizes() == v_cache.sizes(), "paged_decode_attention shapes");
  TORCH_CHECK(page_table.scalar_type() == at::kLong && page_table.dim() == 2 && page_table.is_contiguous() &&
                  seq_lens.scalar_type() == at::kLong && seq_lens.is_contiguous(), "page_table/seq_lens: int64");
  const int64_t batch = q.size(0), hq = q.size(1), d = q.size(2), hkv = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == d && hq % hkv == 0 && hq / hkv <= kMaxGroup, "head_dim or GQA ratio mismatch");
  TORCH_CHECK(page_table.size(0) == batch && seq_lens.numel() == batch, "one page-table row and length per sequence");
  const int64_t group = hq / hkv, max_pages = page_table.size(1), slots = k_cache.size(0);
  const int64_t* pt = page_table.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  int64_t max_len = 1;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= max_pages * page_size, "sequence length out of its page table");
    for (int64_t p = 0; p < (lens[b] + page_size - 1) / page_size; ++p)
      TORCH_CHECK(pt[b * max_pages + p] >= 0 && (pt[b * max_pages + p] + 1) * page_size <= slots, "page out of pool");
    max_len = std::max(max_len, lens[b]);
  }
  at::Tensor out = at::empty({batch, hq, d}, q.options());
  const float* pq = q.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), row = hkv * d;
  const float sc = static_cast<float>(scale);
  auto run = [&](const auto* pk, const auto* pv) {
    using KV = std::remove_cv_t<std::remove_pointer_t<decltype(pk)>>;
    constexpr bool convert = !std::is_same_v<KV, float>;
    at::parallel_for(0, batch * hkv, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(group * max_len), qg(group * d);
      std::vector<float> kbuf(convert ? max_len * d : 0), vbuf(convert ? max_len * d : 0);
      std::vector<const float*> krows(max_len), vrows(max_len);
      for (int64_t idx = begin; idx < end; ++idx) {
        const int64_t b = idx / hkv, h = idx % hkv, len = lens[b];
        for (int64_t g = 0; g < group; ++g)
          for (int64_t i = 0; i < d; ++i) qg[g * d + i] = pq[b * qs0 + (h * group + g) * qs1 + i] * sc;
        const int64_t* pages = pt + b * max_pages;
        kv_rows(pk + h * d, pages, len, page_size, row, d, kbuf.data(), krows.data());
        kv_rows(pv + h * d, pages, len, page_size, row, d, vbuf.data(), vrows.data());
        float* o = po + (b * hq + h * group) * d;
        if (d == 64)
          attend_one<64>(qg.data(), krows.data(), vrows.data(), len, group, d, scores.data(), o);
        else if (d == 128)
          attend_one<128>(qg.data(), krows.data(), vrows.data(), len, group, d, scores.data(), o);
        else
          attend_one<0>(qg.data(), krows.data(), vrows.data(), len, group, d, scores.data(), o);
      }
    });
  };
  switch (k_cache.scalar_type()) {
    case at::kFloat:
      run(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
      break;
    case at::kHalf:
      run(reinterpret_cast<const _Float16*>(k_cache.data_ptr()), reinterpret_cast<const _Float16*>(v_cache.data_ptr()));
      break;
    default:
      run(reinterpret_cast<const Bf16*>(k_cache.data_ptr()), reinterpret_cast<const Bf16*>(v_cache.data_ptr()));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(skiff_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()", &add_rms_norm_);
  m.def("rope_(Tensor(a!) q, Tensor(b!) k, Tensor positions, Tensor cos_sin, int head_dim) -> ()", &rope_);
  m.def("silu_and_mul(Tensor x) -> Tensor", &silu_and_mul);
  m.def("row_normalize(Tensor x) -> (Tensor, Tensor)", &row_normalize);
  m.def("argmax_rows(Tensor x) -> Tensor", &argmax_rows);
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor seq_lens, "
        "int page_size, float scale) -> Tensor", &paged_decode_attention);
}
