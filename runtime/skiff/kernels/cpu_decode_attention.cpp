// Decode attention on CPU, read straight from the paged KV pool: one query token per sequence against its
// pages, for the torch backend's fp32 models. The pool may hold fp32, fp16 or bf16; narrow rows widen to
// fp32 in registers as they load (F16C / a shift), so a narrow pool halves the bytes read, which is what a
// decode step's attention waits on. Work items are whole sequences, or (sequence, KV head) pairs when there
// are too few sequences to share out, split by cpu_parallel.h.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include "cpu_ops.h"
#include "cpu_parallel.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SKIFF_DECODE_SIMD 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kMaxGroup = 64;  // query heads per KV head
constexpr int64_t kBlock = 8;      // tokens scored per pass: eight dot products reduced together

struct Bf16 {
  uint16_t bits;
};

template <typename KV>
inline float load1(const KV* p) {
  if constexpr (std::is_same_v<KV, Bf16>) {
    const uint32_t bits = static_cast<uint32_t>(p->bits) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  } else {
    return static_cast<float>(*p);
  }
}

#if SKIFF_DECODE_SIMD
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const _Float16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load8(const Bf16* p) {  // bf16 is the high half of an fp32
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// The eight horizontal sums of a[0..7] as one vector: lane j holds the sum of a[j]'s lanes.
inline __m256 hsum8(const __m256* a) {
  const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

// exp(x) for x <= 0 lanes: range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial (about 1 ulp).
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  for (const float c : {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// One sequence's KV heads [h0, h1) and their query heads, page by page. A page's slots are contiguous
// ([page_size, Hkv, D]), so with all of a sequence's KV heads in one item each page is one sequential run of
// memory for the K pass and one for the V pass (a single KV head reads a third of every row's lines, in
// strides). Each score is eight partial sums reduced together, a head's V sum runs over its tokens in order.
// q: [hq, D] scaled, the item's heads; k_pool/v_pool: [slots, Hkv, D]; pages: the sequence's page ids;
// scores: [hq, len] scratch; out: [hq, D], the item's heads.
template <typename KV, int64_t D>
void attend_pages(const float* q, const KV* k_pool, const KV* v_pool, const int64_t* pages, int64_t page_size,
                  int64_t len, int64_t h0, int64_t h1, int64_t hkv, int64_t group, float* scores, float* out) {
  const int64_t heads = h1 - h0, hq = heads * group, row = hkv * D;
  const int64_t npages = (len + page_size - 1) / page_size;
  auto page_rows = [&](const KV* pool, int64_t p) { return pool + pages[p] * page_size * row + h0 * D; };
  auto prefetch_page = [&](const KV* base, int64_t tokens) {
    for (int64_t t = 0; t < tokens; ++t) {
      const char* c = reinterpret_cast<const char*>(base + t * row);
      for (int64_t off = 0; off < heads * D * static_cast<int64_t>(sizeof(KV)); off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
    }
  };
  // body(rows of the page's first token, its first token's index, its tokens), the next page prefetched
  auto each_page = [&](const KV* pool, const auto& body) {
    for (int64_t p = 0; p < npages; ++p) {
      const int64_t t0 = p * page_size;
      if (p + 1 < npages) prefetch_page(page_rows(pool, p + 1), std::min(page_size, len - t0 - page_size));
      body(page_rows(pool, p), t0, std::min(page_size, len - t0));
    }
  };
  // K pass: scores of every head, eight tokens at a time (a page's tokens in L1 for all heads)
  each_page(k_pool, [&](const KV* base, int64_t t0, int64_t n) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = q + (h * group + g) * D;
        float* s = scores + (h * group + g) * len + t0;
        int64_t j0 = 0;
        for (; j0 + kBlock <= n; j0 += kBlock) {
          __m256 acc[kBlock];
          for (int64_t j = 0; j < kBlock; ++j) acc[j] = _mm256_setzero_ps();
          for (int64_t c = 0; c < D; c += 8) {
            const __m256 qv = _mm256_loadu_ps(qg + c);
            for (int64_t j = 0; j < kBlock; ++j) acc[j] = _mm256_fmadd_ps(qv, load8(base + (j0 + j) * row + h * D + c), acc[j]);
          }
          _mm256_storeu_ps(s + j0, hsum8(acc));
        }
        for (; j0 < n; ++j0) {
          __m256 acc = _mm256_setzero_ps();
          for (int64_t c = 0; c < D; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qg + c), load8(base + j0 * row + h * D + c), acc);
          s[j0] = hsum(acc);
        }
      }
  });
  thread_local std::vector<float> inv_sum;
  inv_sum.resize(hq);
  for (int64_t g = 0; g < hq; ++g) {
    float* s = scores + g * len;
    float m = s[0];
    for (int64_t i = 1; i < len; ++i) m = std::max(m, s[i]);
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
      _mm256_storeu_ps(s + i, e);
      sum = _mm256_add_ps(sum, e);
    }
    float total = hsum(sum);
    for (; i < len; ++i) total += (s[i] = std::exp(s[i] - m));
    inv_sum[g] = 1.0f / total;
  }
  // V pass: each head's 64-column accumulators in registers over a page's tokens, kept in `out` between pages
  std::fill(out, out + hq * D, 0.0f);
  each_page(v_pool, [&](const KV* base, int64_t t0, int64_t n) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t g = 0; g < group; ++g) {
        const float* w = scores + (h * group + g) * len + t0;
        float* o = out + (h * group + g) * D;
        for (int64_t c0 = 0; c0 < D; c0 += 64) {
          constexpr int64_t kCols = D < 64 ? D : 64;
          __m256 acc[kCols / 8];
          for (int64_t j = 0; j < kCols / 8; ++j) acc[j] = _mm256_loadu_ps(o + c0 + 8 * j);
          for (int64_t i = 0; i < n; ++i) {
            const __m256 wt = _mm256_broadcast_ss(w + i);
            for (int64_t j = 0; j < kCols / 8; ++j)
              acc[j] = _mm256_fmadd_ps(wt, load8(base + i * row + h * D + c0 + 8 * j), acc[j]);
          }
          for (int64_t j = 0; j < kCols / 8; ++j) _mm256_storeu_ps(o + c0 + 8 * j, acc[j]);
        }
      }
  });
  for (int64_t g = 0; g < hq; ++g) {
    const __m256 inv = _mm256_set1_ps(inv_sum[g]);
    for (int64_t c = 0; c < D; c += 8) _mm256_storeu_ps(out + g * D + c, _mm256_mul_ps(_mm256_loadu_ps(out + g * D + c), inv));
  }
}

#endif  // SKIFF_DECODE_SIMD

// Any head dim (and CPUs without AVX2/FMA/F16C): the same arithmetic, scalar.
template <typename KV>
void attend_any(const float* q, const KV* const* krows, const KV* const* vrows, int64_t len, int64_t group,
                int64_t d, float* scores, float* out) {
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores + g * len;
    float m = -INFINITY;
    for (int64_t t = 0; t < len; ++t) {
      float acc = 0.0f;
      for (int64_t i = 0; i < d; ++i) acc += q[g * d + i] * load1(krows[t] + i);
      s[t] = acc;
      m = std::max(m, acc);
    }
    float total = 0.0f;
    for (int64_t t = 0; t < len; ++t) total += (s[t] = std::exp(s[t] - m));
    float* o = out + g * d;
    std::fill(o, o + d, 0.0f);
    for (int64_t t = 0; t < len; ++t)
      for (int64_t i = 0; i < d; ++i) o[i] += s[t] * load1(vrows[t] + i);
    for (int64_t i = 0; i < d; ++i) o[i] /= total;
  }
}

// q: [B, Hq, D] fp32 (leading strides allowed); k_cache/v_cache: [slots, Hkv, D] contiguous, one dtype
// (fp32, fp16 or bf16), slot = page * page_size + offset; page_table: [B, P] int64; seq_lens: [B] int64
// (tokens to attend, the new one included) -> [B, Hq, D].
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& page_table, const at::Tensor& seq_lens, int64_t page_size,
                                  double scale) {
  TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == at::kFloat && q.dim() == 3 && q.stride(-1) == 1,
              "q must be a [B, Hq, D] float32 CPU tensor, contiguous in its last dimension");
  const auto kv_type = k_cache.scalar_type();
  TORCH_CHECK(k_cache.device().is_cpu() && v_cache.scalar_type() == kv_type &&
                  (kv_type == at::kFloat || kv_type == at::kHalf || kv_type == at::kBFloat16),
              "k_cache/v_cache must be CPU tensors of one dtype: float32, float16 or bfloat16");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
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
  // the query heads of KV heads [h0, h0 + heads) of sequence b, scaled, into qg
  auto scaled_q = [&](int64_t b, int64_t h0, int64_t heads, std::vector<float>& qg) {
    qg.resize(heads * group * d);
    for (int64_t g = 0; g < heads * group; ++g)
      for (int64_t i = 0; i < d; ++i) qg[g * d + i] = pq[b * qs0 + (h0 * group + g) * qs1 + i] * sc;
  };
  auto run = [&](const auto* pk, const auto* pv) {
    using KV = std::remove_cv_t<std::remove_pointer_t<decltype(pk)>>;
#if SKIFF_DECODE_SIMD
    if (d == 64 || d == 128) {
      // a whole sequence per item once there are enough sequences to share out; else one KV head per item
      const int64_t per_item = batch >= 2 * at::get_num_threads() ? hkv : 1, parts = hkv / per_item;
      skiff_cpu::for_each_item(batch * parts, [&](int64_t idx) {
        thread_local std::vector<float> scores, qg;
        const int64_t b = idx / parts, h0 = idx % parts * per_item, len = lens[b];
        scores.resize(per_item * group * len);
        scaled_q(b, h0, per_item, qg);
        float* o = po + (b * hq + h0 * group) * d;
        const int64_t* pages = pt + b * max_pages;
        if (d == 64)
          attend_pages<KV, 64>(qg.data(), pk, pv, pages, page_size, len, h0, h0 + per_item, hkv, group, scores.data(), o);
        else
          attend_pages<KV, 128>(qg.data(), pk, pv, pages, page_size, len, h0, h0 + per_item, hkv, group, scores.data(), o);
      });
      return;
    }
#endif
    skiff_cpu::for_each_item(batch * hkv, [&](int64_t idx) {
      thread_local std::vector<float> scores, qg;
      thread_local std::vector<const KV*> krows, vrows;
      scores.resize(group * max_len), krows.resize(max_len), vrows.resize(max_len);
      const int64_t b = idx / hkv, h = idx % hkv, len = lens[b];
      scaled_q(b, h, 1, qg);
      const int64_t* pages = pt + b * max_pages;
      for (int64_t t = 0; t < len; ++t) {
        const int64_t slot = pages[t / page_size] * page_size + t % page_size;
        krows[t] = pk + slot * row + h * d;
        vrows[t] = pv + slot * row + h * d;
      }
      attend_any<KV>(qg.data(), krows.data(), vrows.data(), len, group, d, scores.data(), po + (b * hq + h * group) * d);
    });
  };
  switch (kv_type) {
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

namespace skiff_cpu {
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& page_table, const at::Tensor& seq_lens, int64_t page_size,
                                  double scale) {
  return ::paged_decode_attention(q, k_cache, v_cache, page_table, seq_lens, page_size, scale);
}
}  // namespace skiff_cpu

TORCH_LIBRARY_FRAGMENT(skiff_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor seq_lens, "
        "int page_size, float scale) -> Tensor", &paged_decode_attention);
}
