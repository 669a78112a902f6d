// Linear layers on GGUF's own quantized blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K): y = x W^T, W never widened
// to float in memory.
//
// `gguf_pack` re-lays a GGUF tensor's blocks (row-major, one row of K values after another) into groups of
// 8 output rows, so that one 32-byte load holds 4 consecutive values of each of the 8 rows. The numbers are
// the format's: every 32 values of a row keep their integer codes q and their scale d (and, for the
// formats with an offset, the offset m), value = d * q + m:
//   U4 family: 4-bit unsigned codes, 8 rows x 32 values = 128 bytes, low nibble value 4c+i, high nibble
//              value 16+4c+i (chunk c of 4). Q4_0 (m = -8d), Q4_1, Q4_K (d = d_super * sc, m = -dmin * mn).
//   S8 family: signed 8-bit codes, 256 bytes per 8 x 32. Q8_0 (one scale per 32), Q6_K (q - 32, one scale per
//              16 values: d_super * sc).
// Scales stay fp16 where the format stores them so (Q4_0, Q4_1, Q8_0; -8d is exact in fp16) and are fp32
// where they are products (the K-quants).
//
// `gguf_linear` quantizes each row of x per 32 values (scale dx = amax/127, plus the block's exact fp32 sum
// for the offset term), as one int8 term or, `precise`, two (the second quantizes the first's residual at
// 1/254 of its step; one term moved the embedded model's greedy tokens, docs/performance.md), and takes
// integer dot products:
//   U4: vpmaddubsw of unsigned codes x each signed int8 term (8 products of 15 * 127 summed per int16 lane
//       stay below 32767), the terms joined as 254 hi + lo in int32;
//   S8: vpmaddwd of sign-extended codes x the terms already joined into one int16 (254 hi + lo <= 32385), so
//       two terms cost no more than one.
// One int32 lane per output row: the 8-row interleave makes vpmaddwd's 4-byte groups the rows' partial
// sums, so a block costs one int->float conversion and one FMA for 8 rows.
//   y[r][n] = sum_blocks dw[n] dx[r] (sum_i qw[n][i] qx[r][i]) + mw[n] sum_i x[r][i].
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#include "cpu_ops.h"
#include "cpu_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SKIFF_GGUF_AVX2 1
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kRows = 8;    // output rows per packed group
constexpr int64_t kBlock = 32;  // values per block (activation scale granularity)

// ggml type ids (gguf.GGMLQuantizationType)
enum : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14 };

struct Format {
  int64_t block_values;  // values per GGUF block
  int64_t block_bytes;
  bool unsigned4;        // U4 family (else S8)
  bool f16_scales;
  int64_t subs;          // scales per 32 values (S8: 1 or 2)
};

Format format_of(int64_t type) {
  switch (type) {
    case kQ4_0: return {32, 18, true, true, 1};
    case kQ4_1: return {32, 20, true, true, 1};
    case kQ8_0: return {32, 34, false, true, 1};
    case kQ4_K: return {256, 144, true, false, 1};
    case kQ6_K: return {256, 210, false, false, 2};
    default: TORCH_CHECK(false, "gguf: no kernel for GGML type ", type);
  }
}

float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

uint16_t half_bits(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return bits;
}

// One 32-value block `kb` of a GGUF row, decoded to codes and scales (the format's numbers, unchanged).
struct Block32 {
  uint8_t q[32];      // U4: 0..15; S8: two's-complement int8
  float d[2], m;      // d[1] only for two sub-scales
  uint16_t dh, mh;    // the fp16 bits where the format stores fp16 scales
};

void get_scale_min_k4(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void decode_block(int64_t type, const uint8_t* row, int64_t kb, Block32& b) {
  switch (type) {
    case kQ4_0: {
      const uint8_t* p = row + kb * 18;
      for (int i = 0; i < 16; ++i) b.q[i] = p[2 + i] & 0xF, b.q[16 + i] = p[2 + i] >> 4;
      b.dh = half_bits(p);
      b.d[0] = half_to_float(p);
      const c10::Half m = c10::Half(-8.0f * b.d[0]);
      TORCH_CHECK(std::isfinite(static_cast<float>(m)), "gguf: Q4_0 scale out of fp16 range");
      b.m = static_cast<float>(m);
      b.mh = m.x;
      return;
    }
    case kQ4_1: {
      const uint8_t* p = row + kb * 20;
      for (int i = 0; i < 16; ++i) b.q[i] = p[4 + i] & 0xF, b.q[16 + i] = p[4 + i] >> 4;
      b.dh = half_bits(p), b.mh = half_bits(p + 2);
      b.d[0] = half_to_float(p), b.m = half_to_float(p + 2);
      return;
    }
    case kQ8_0: {
      const uint8_t* p = row + kb * 34;
      std::memcpy(b.q, p + 2, 32);
      b.dh = half_bits(p);
      b.d[0] = half_to_float(p), b.m = 0.0f;
      return;
    }
    case kQ4_K: {
      const uint8_t* p = row + (kb / 8) * 144;
      const int j = static_cast<int>(kb % 8);
      int sc, mn;
      get_scale_min_k4(j, p + 4, &sc, &mn);
      b.d[0] = half_to_float(p) * static_cast<float>(sc);
      b.m = -(half_to_float(p + 2) * static_cast<float>(mn));
      const uint8_t* qs = p + 16 + (j / 2) * 32;
      for (int i = 0; i < 32; ++i) b.q[i] = (j % 2) ? (qs[i] >> 4) : (qs[i] & 0xF);
      return;
    }
    case kQ6_K: {
      const uint8_t* p = row + (kb / 8) * 210;
      const uint8_t* ql = p;
      const uint8_t* qh = p + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
      const float d = half_to_float(p + 208);
      for (int i = 0; i < 32; ++i) {
        const int v = static_cast<int>(kb % 8) * 32 + i;  // value within the 256
        const int half = v / 128, quarter = (v % 128) / 32, l = v % 32;
        const uint8_t lo = ql[64 * half + l + (quarter & 1) * 32];
        const int low = (quarter & 2) ? (lo >> 4) : (lo & 0xF);
        const int high = (qh[32 * half + l] >> (2 * quarter)) & 3;
        b.q[i] = static_cast<uint8_t>(static_cast<int8_t>((low | (high << 4)) - 32));
      }
      const int v0 = static_cast<int>(kb % 8) * 32;
      b.d[0] = d * static_cast<float>(sc[v0 / 16]);
      b.d[1] = d * static_cast<float>(sc[v0 / 16 + 1]);
      b.m = 0.0f;
      return;
    }
    default: TORCH_CHECK(false, "gguf: no kernel for GGML type ", type);
  }
}

// raw: [n, row_bytes] uint8 GGUF rows of k values -> (codes, scales, offsets) in the interleaved layout.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gguf_pack(const at::Tensor& raw_in, int64_t type, int64_t k) {
  const Format f = format_of(type);
  TORCH_CHECK(raw_in.dim() == 2 && raw_in.scalar_type() == at::kByte && raw_in.device().is_cpu(),
              "gguf_pack: raw must be a 2-D uint8 CPU tensor");
  TORCH_CHECK(k > 0 && k % f.block_values == 0, "gguf_pack: k=", k, " is not a multiple of ", f.block_values);
  TORCH_CHECK(raw_in.size(1) == k / f.block_values * f.block_bytes, "gguf_pack: row of ", raw_in.size(1),
              " bytes does not hold ", k, " values of GGML type ", type);
  const at::Tensor raw = raw_in.contiguous();
  const int64_t n = raw.size(0), kbs = k / kBlock, groups = (n + kRows - 1) / kRows;
  const int64_t code_bytes = f.unsigned4 ? 16 : 32;  // per row per block
  const auto sdt = f.f16_scales ? at::kHalf : at::kFloat;
  at::Tensor codes = at::zeros({groups, kbs, kRows * code_bytes}, raw.options());
  at::Tensor scales = at::zeros({groups, kbs, f.subs, kRows}, raw.options().dtype(sdt));
  at::Tensor offsets = at::zeros({f.unsigned4 ? groups : 0, kbs, kRows}, raw.options().dtype(sdt));
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* cp = codes.data_ptr<uint8_t>();
  auto* sp = static_cast<uint8_t*>(scales.data_ptr());
  auto* op = static_cast<uint8_t*>(offsets.data_ptr());
  const int64_t ssize = f.f16_scales ? 2 : 4;
  at::parallel_for(0, n, 64, [&](int64_t lo, int64_t hi) {
    Block32 b{};
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t g = row / kRows, r = row % kRows;
      for (int64_t kb = 0; kb < kbs; ++kb) {
        decode_block(type, src + row * raw.size(1), kb, b);
        uint8_t* dst = cp + (g * kbs + kb) * kRows * code_bytes;
        for (int64_t c = 0; c < code_bytes / 4; ++c)
          for (int i = 0; i < 4; ++i) {
            const int64_t v = 4 * c + i;
            dst[c * 32 + r * 4 + i] = f.unsigned4 ? static_cast<uint8_t>(b.q[v] | (b.q[16 + v] << 4)) : b.q[v];
          }
        for (int64_t s = 0; s < f.subs; ++s) {
          uint8_t* sdst = sp + (((g * kbs + kb) * f.subs + s) * kRows + r) * ssize;
          if (f.f16_scales) std::memcpy(sdst, &b.dh, 2);
          else std::memcpy(sdst, &b.d[s], 4);
        }
        if (f.unsigned4) {
          uint8_t* odst = op + ((g * kbs + kb) * kRows + r) * ssize;
          if (f.f16_scales) std::memcpy(odst, &b.mh, 2);
          else std::memcpy(odst, &b.m, 4);
        }
      }
    }
  });
  return {codes, scales, offsets};
}

// ---------------------------------------------------------------------------------------------- activations

// Activations of one linear, quantized per 32 values. A block's codes are T int8 terms: q_hi = round(x / dx),
// dx = amax / 127, and (T = 2) q_lo = round(254 (x / dx - q_hi)), so x ~ s (254 q_hi + q_lo) with s = dx / 254
// (the residual is at most half a step, so |q_lo| <= 127). U4 kernels take the int8 terms, S8 kernels their
// combination 254 q_hi + q_lo as one int16 (|.| <= 32385).
struct Acts {
  const int8_t* q8;     // U4: [m][T][k]
  const int16_t* q16;   // S8: [m][k]
  const float* scale;   // [m][kbs]: dx (T = 1) or dx / 254 (T = 2)
  const float* sum;     // [m][kbs]: exact fp32 sum of the block's values (U4's offset term)
  int64_t k, kbs;
};

#if SKIFF_GGUF_AVX2
inline float hmax8(__m256 v) {
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

inline float hsum8(__m256 v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
}

// int32 lanes of 4 vectors (values 0-7, 8-15, 16-23, 24-31) -> 32 int8 / 32 int16 in order
inline __m256i pack8(const __m256i* i) {
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline __m256i pack16(__m256i a, __m256i b) { return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8); }
#endif

template <int T>
void quantize_row(const float* x, int64_t k, int8_t* q8, int16_t* q16, float* scale, float* sum) {
  for (int64_t kb = 0; kb < k / kBlock; ++kb) {
    const float* xb = x + kb * kBlock;
#if SKIFF_GGUF_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps(), s = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
      s = _mm256_add_ps(s, v[j]);
    }
    const float a = hmax8(amax);
    sum[kb] = hsum8(s);
    scale[kb] = T == 2 ? a / 127.0f / 254.0f : a / 127.0f;
    const __m256 inv = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
    __m256i hi[4], lo[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 f = _mm256_mul_ps(v[j], inv);
      hi[j] = _mm256_cvtps_epi32(f);  // round to nearest even; f - hi is exact and within 1/2
      if constexpr (T == 2)
        lo[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(f, _mm256_cvtepi32_ps(hi[j])), _mm256_set1_ps(254.0f)));
    }
    if (q8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q8 + kb * kBlock), pack8(hi));
      if constexpr (T == 2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(q8 + k + kb * kBlock), pack8(lo));
    }
    if (q16) {
      if constexpr (T == 2)
        for (int j = 0; j < 4; ++j) hi[j] = _mm256_add_epi32(_mm256_mullo_epi32(hi[j], _mm256_set1_epi32(254)), lo[j]);
      for (int j = 0; j < 2; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16 + kb * kBlock + 16 * j), pack16(hi[2 * j], hi[2 * j + 1]));
    }
#else
    float a = 0.0f, s = 0.0f;
    for (int i = 0; i < kBlock; ++i) a = std::max(a, std::fabs(xb[i])), s += xb[i];
    sum[kb] = s;
    scale[kb] = T == 2 ? a / 127.0f / 254.0f : a / 127.0f;
    const float inv = a > 0.0f ? 127.0f / a : 0.0f;
    for (int i = 0; i < kBlock; ++i) {
      const float f = xb[i] * inv, h = std::nearbyint(f);
      const float l = T == 2 ? std::nearbyint((f - h) * 254.0f) : 0.0f;
      if (q8) {
        q8[kb * kBlock + i] = static_cast<int8_t>(h);
        if (T == 2) q8[k + kb * kBlock + i] = static_cast<int8_t>(l);
      }
      if (q16) q16[kb * kBlock + i] = static_cast<int16_t>(T == 2 ? 254.0f * h + l : h);
    }
#endif
  }
}

// ---------------------------------------------------------------------------------------------- tiles

#if SKIFF_GGUF_AVX2
template <typename S>
inline __m256 load8(const S* p) {
  if constexpr (std::is_same_v<S, float>) return _mm256_loadu_ps(p);
  else return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256i bcast8(const void* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm256_set1_epi64x(v);
}

// Keeps the compiler from re-associating the accumulation chains (it hoisted the products and spilled them).
inline void pin(__m256i& v) { asm volatile("" : "+x"(v)); }

// P activation rows (T int8 terms each) against G groups of 8 output rows: out[p][0..8G). Per block: 8
// vpmaddubsw per term into int16 (8 * 2 * 15 * 127 < 32767), then one int32 sum per row. Loads (of codes
// and of broadcast activations) are what limits this loop, so each broadcast feeds G groups.
template <typename S, int T, int P, int G>
void u4_tile(const uint8_t* codes, const S* d, const S* m, const Acts& a, int64_t r0, float* out, int64_t ldo) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), c254 = _mm256_set1_epi16(254);
  const int64_t gcodes = a.kbs * 128, gscales = a.kbs * kRows;  // one group to the next
  __m256 acc[P][G];
  for (int p = 0; p < P; ++p)
    for (int g = 0; g < G; ++g) acc[p][g] = _mm256_setzero_ps();
  const int8_t* xr = a.q8 + r0 * T * a.k;
  for (int64_t kb = 0; kb < a.kbs; ++kb) {
    __m256i t[P][T][G];
    for (int p = 0; p < P; ++p)
      for (int j = 0; j < T; ++j)
        for (int g = 0; g < G; ++g) t[p][j][g] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      __m256i lo[G], hi[G];
      for (int g = 0; g < G; ++g) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + g * gcodes + kb * 128 + 32 * c));
        lo[g] = _mm256_and_si256(raw, low);
        hi[g] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      }
      for (int p = 0; p < P; ++p)
        for (int j = 0; j < T; ++j) {
          const int8_t* xb = xr + (p * T + j) * a.k + kb * kBlock + 4 * c;
          const __m256i xl = bcast4(xb), xh = bcast4(xb + 16);
          for (int g = 0; g < G; ++g) {
            t[p][j][g] = _mm256_add_epi16(t[p][j][g], _mm256_maddubs_epi16(lo[g], xl));
            t[p][j][g] = _mm256_add_epi16(t[p][j][g], _mm256_maddubs_epi16(hi[g], xh));
            pin(t[p][j][g]);
          }
        }
    }
    for (int p = 0; p < P; ++p) {
      const int64_t i = (r0 + p) * a.kbs + kb;
      const __m256 xs = _mm256_set1_ps(a.scale[i]), xsum = _mm256_set1_ps(a.sum[i]);
      for (int g = 0; g < G; ++g) {
        __m256i isum = _mm256_madd_epi16(t[p][0][g], T == 2 ? c254 : ones);
        if constexpr (T == 2) isum = _mm256_add_epi32(isum, _mm256_madd_epi16(t[p][1][g], ones));
        const __m256 dw = load8(d + g * gscales + kb * kRows), mw = load8(m + g * gscales + kb * kRows);
        acc[p][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, xs), acc[p][g]);
        acc[p][g] = _mm256_fmadd_ps(mw, xsum, acc[p][g]);
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int g = 0; g < G; ++g) _mm256_storeu_ps(out + p * ldo + g * kRows, acc[p][g]);
}

// P activation rows (int16 codes) against one group of 8 output rows. A 32-byte chunk is 4 values of each
// row; sign-extended, its halves hold rows 0-3 and 4-7, each int32 lane of vpmaddwd half a row's sum.
template <typename S, int SUBS, int P>
void s8_tile(const uint8_t* codes, const S* d, const Acts& a, int64_t r0, float* out, int64_t ldo) {
  constexpr int kChunks = 8 / SUBS;  // 4-value chunks per scale
  __m256 acc[P];
  for (int p = 0; p < P; ++p) acc[p] = _mm256_setzero_ps();
  const int16_t* xr = a.q16 + r0 * a.k;
  for (int64_t kb = 0; kb < a.kbs; ++kb) {
    const uint8_t* cb = codes + kb * 256;
    for (int s = 0; s < SUBS; ++s) {
      __m256i t0[P], t1[P];
      for (int p = 0; p < P; ++p) t0[p] = t1[p] = _mm256_setzero_si256();
      for (int c = s * kChunks; c < (s + 1) * kChunks; ++c) {
        const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cb + 32 * c)));
        const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cb + 32 * c + 16)));
        for (int p = 0; p < P; ++p) {
          const __m256i x = bcast8(xr + p * a.k + kb * kBlock + 4 * c);
          t0[p] = _mm256_add_epi32(t0[p], _mm256_madd_epi16(w0, x));
          t1[p] = _mm256_add_epi32(t1[p], _mm256_madd_epi16(w1, x));
          pin(t0[p]), pin(t1[p]);
        }
      }
      const __m256 dw = load8(d + (kb * SUBS + s) * kRows);
      for (int p = 0; p < P; ++p) {
        // hadd: rows 0 1 4 5 | 2 3 6 7 -> in order
        const __m256i isum = _mm256_permute4x64_epi64(_mm256_hadd_epi32(t0[p], t1[p]), 0xD8);
        const __m256 ds = _mm256_mul_ps(dw, _mm256_set1_ps(a.scale[(r0 + p) * a.kbs + kb]));
        acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), ds, acc[p]);
      }
    }
  }
  for (int p = 0; p < P; ++p) _mm256_storeu_ps(out + p * ldo, acc[p]);
}
#else
template <typename S>
inline float scalar_of(const S& v) {
  if constexpr (std::is_same_v<S, float>) return v;
  else return static_cast<float>(c10::Half(v, c10::Half::from_bits()));
}

template <typename S, int T, int P, int G>
void u4_tile(const uint8_t* codes_g0, const S* d_g0, const S* m_g0, const Acts& a, int64_t r0, float* out,
             int64_t ldo) {
  for (int g = 0; g < G; ++g) {
    const uint8_t* codes = codes_g0 + g * a.kbs * 128;
    const S* d = d_g0 + g * a.kbs * kRows;
    const S* m = m_g0 + g * a.kbs * kRows;
  for (int p = 0; p < P; ++p)
    for (int j = 0; j < kRows; ++j) {
      float acc = 0.0f;
      for (int64_t kb = 0; kb < a.kbs; ++kb) {
        const uint8_t* cb = codes + kb * 128;
        int32_t isum = 0;
        for (int term = 0; term < T; ++term) {
          const int8_t* xb = a.q8 + ((r0 + p) * T + term) * a.k + kb * kBlock;
          int32_t part = 0;
          for (int c = 0; c < 4; ++c)
            for (int i = 0; i < 4; ++i) {
              const uint8_t byte = cb[c * 32 + j * 4 + i];
              part += (byte & 0xF) * xb[4 * c + i] + (byte >> 4) * xb[16 + 4 * c + i];
            }
          isum += (T == 2 && term == 0) ? 254 * part : part;
        }
        const int64_t ia = (r0 + p) * a.kbs + kb;
        acc += static_cast<float>(isum) * scalar_of(d[kb * kRows + j]) * a.scale[ia] +
               scalar_of(m[kb * kRows + j]) * a.sum[ia];
      }
      out[p * ldo + g * kRows + j] = acc;
    }
  }
}

template <typename S, int SUBS, int P>
void s8_tile(const uint8_t* codes, const S* d, const Acts& a, int64_t r0, float* out, int64_t ldo) {
  for (int p = 0; p < P; ++p)
    for (int j = 0; j < kRows; ++j) {
      float acc = 0.0f;
      for (int64_t kb = 0; kb < a.kbs; ++kb)
        for (int s = 0; s < SUBS; ++s) {
          int32_t isum = 0;
          for (int c = s * 8 / SUBS; c < (s + 1) * 8 / SUBS; ++c)
            for (int i = 0; i < 4; ++i)
              isum += static_cast<int8_t>(codes[kb * 256 + c * 32 + j * 4 + i]) *
                      a.q16[(r0 + p) * a.k + kb * kBlock + 4 * c + i];
          acc += static_cast<float>(isum) * scalar_of(d[(kb * SUBS + s) * kRows + j]) * a.scale[(r0 + p) * a.kbs + kb];
        }
      out[p * ldo + j] = acc;
    }
}
#endif

// Rows [r0, r0 + P) of x against groups [g, g + G).
template <typename S, int SUBS, bool U4, int T, int P, int G>
void run_tile(const uint8_t* codes, const S* d, const S* m, const Acts& a, int64_t g, int64_t r0, float* out,
              int64_t ldo) {
  if constexpr (U4)
    u4_tile<S, T, P, G>(codes + g * a.kbs * 128, d + g * a.kbs * kRows, m + g * a.kbs * kRows, a, r0, out, ldo);
  else
    s8_tile<S, SUBS, P>(codes + g * a.kbs * 256, d + g * a.kbs * SUBS * kRows, a, r0, out, ldo);
}

// The tile for the last nr rows of a row tile (nr <= Q).
template <typename S, int SUBS, bool U4, int T, int Q, int G>
void run_rows(int64_t nr, const uint8_t* codes, const S* d, const S* m, const Acts& a, int64_t g, int64_t r0,
              float* out, int64_t ldo) {
  if constexpr (Q > 1)
    if (nr < Q) return run_rows<S, SUBS, U4, T, Q - 1, G>(nr, codes, d, m, a, g, r0, out, ldo);
  run_tile<S, SUBS, U4, T, Q, G>(codes, d, m, a, g, r0, out, ldo);
}

// Tile shape: activation rows P x output groups G. For U4 with more than one row, 2 x 2 measured fastest for
// both term counts (against 3 x 1, 1 x 2 and 1 x 3 with two terms; 4 x 1 and 1 x 4 with one), interleaved on
// one core; a single row (a one-stream decode step) is faster with one group per tile (fewer streams).
template <bool U4>
constexpr int kTileRows = U4 ? 2 : 4;

template <typename S, int SUBS, bool U4, int T, int G>
void gemm(const uint8_t* codes, const S* d, const S* m, const Acts& a, int64_t rows, int64_t n, float* y) {
  constexpr int P = kTileRows<U4>;
  constexpr int64_t kTileM = 16 * P;  // activation rows kept in L2 while each group of codes passes over them
  const int64_t groups = (n + kRows - 1) / kRows, full = n / kRows;
  const int64_t tasks = (groups + G - 1) / G;
  const int64_t grain = std::max<int64_t>(1, 256 / (rows * a.kbs * G));  // >= ~256 block dots per item
  // Items: a row tile of kTileM rows x `grain` tasks, row tile by row tile (cpu_parallel.h splits them).
  const int64_t chunks = (tasks + grain - 1) / grain, items = (rows + kTileM - 1) / kTileM * chunks;
  skiff_cpu::for_each_item(items, [&](int64_t item) {
    alignas(32) float scratch[P * kRows];
    const int64_t m0 = item / chunks * kTileM, m1 = std::min(rows, m0 + kTileM);
    const int64_t t0 = item % chunks * grain, t1 = std::min(tasks, t0 + grain);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t g0 = task * G, g1 = std::min(groups, g0 + G);
      for (int64_t r = m0; r < m1; r += P) {
        const int64_t nr = std::min<int64_t>(P, m1 - r);
        if (g1 - g0 == G && g1 <= full) {
          run_rows<S, SUBS, U4, T, P, G>(nr, codes, d, m, a, g0, r, y + r * n + g0 * kRows, n);
          continue;
        }
        for (int64_t g = g0; g < g1; ++g) {  // the last groups, one at a time; a short one through scratch
          const bool direct = g < full;
          float* out = direct ? y + r * n + g * kRows : scratch;
          run_rows<S, SUBS, U4, T, P, 1>(nr, codes, d, m, a, g, r, out, direct ? n : kRows);
          if (direct) continue;
          const int64_t cols = n - g * kRows;
          for (int64_t rr = 0; rr < nr; ++rr)
            for (int64_t j = 0; j < cols; ++j) y[(r + rr) * n + g * kRows + j] = scratch[rr * kRows + j];
        }
      }
    }
  });
}

template <int T>
void run_gemm(const Format& f, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& offsets,
              const Acts& a, int64_t rows, int64_t n, float* y) {
  const auto* cp = codes.data_ptr<uint8_t>();
  const auto* half_scales = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  if (f.unsigned4) {
    using U4Gemm = void (*)(const uint8_t*, const uint16_t*, const uint16_t*, const Acts&, int64_t, int64_t, float*);
    using U4GemmF = void (*)(const uint8_t*, const float*, const float*, const Acts&, int64_t, int64_t, float*);
    if (f.f16_scales) {
      const U4Gemm run = rows > 1 ? gemm<uint16_t, 1, true, T, 2> : gemm<uint16_t, 1, true, T, 1>;
      run(cp, half_scales, reinterpret_cast<const uint16_t*>(offsets.data_ptr()), a, rows, n, y);
    } else {
      const U4GemmF run = rows > 1 ? gemm<float, 1, true, T, 2> : gemm<float, 1, true, T, 1>;
      run(cp, scales.data_ptr<float>(), offsets.data_ptr<float>(), a, rows, n, y);
    }
  } else if (f.f16_scales) {
    gemm<uint16_t, 1, false, T, 1>(cp, half_scales, nullptr, a, rows, n, y);
  } else {
    gemm<float, 2, false, T, 1>(cp, scales.data_ptr<float>(), nullptr, a, rows, n, y);
  }
}

// x: [M, K] float32 (rows contiguous); the packed weight of `gguf_pack` for n output rows -> y: [M, n].
// precise: activations as two int8 terms (above), ~1/254 of the error of one.
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t type, int64_t n, const c10::optional<at::Tensor>& bias,
                       bool precise) {
  const Format f = format_of(type);
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "gguf_linear: x must be a 2-D float32 CPU tensor with contiguous rows");
  const int64_t m = x.size(0), k = x.size(1), kbs = k / kBlock, groups = (n + kRows - 1) / kRows;
  TORCH_CHECK(k % kBlock == 0 && codes.dim() == 3 && codes.size(0) == groups && codes.size(1) == kbs &&
                  codes.size(2) == kRows * (f.unsigned4 ? 16 : 32),
              "gguf_linear: packed weight does not match x of width ", k, " and ", n, " outputs");
  TORCH_CHECK(scales.scalar_type() == (f.f16_scales ? at::kHalf : at::kFloat), "gguf_linear: scale dtype");
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0) return y;
  const int terms = precise ? 2 : 1;
  // the activation codes live in the calling thread's scratch (workers write through its pointers): no
  // allocator calls per linear beyond y
  thread_local std::vector<int8_t> xq8;
  thread_local std::vector<int16_t> xq16;
  thread_local std::vector<float> xs;
  if (f.unsigned4) xq8.resize(m * terms * k);
  else xq16.resize(m * k);
  xs.resize(2 * m * kbs);
  const float* xp = x.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  int8_t* q8 = f.unsigned4 ? xq8.data() : nullptr;
  int16_t* q16 = f.unsigned4 ? nullptr : xq16.data();
  float* sp = xs.data();
  float* sums = sp + m * kbs;
  at::parallel_for(0, m, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int8_t* r8 = q8 ? q8 + r * terms * k : nullptr;
      int16_t* r16 = q16 ? q16 + r * k : nullptr;
      if (precise) quantize_row<2>(xp + r * ldx, k, r8, r16, sp + r * kbs, sums + r * kbs);
      else quantize_row<1>(xp + r * ldx, k, r8, r16, sp + r * kbs, sums + r * kbs);
    }
  });
  const Acts a{q8, q16, sp, sums, k, kbs};
  if (precise) run_gemm<2>(f, codes, scales, offsets, a, m, n, y.data_ptr<float>());
  else run_gemm<1>(f, codes, scales, offsets, a, m, n, y.data_ptr<float>());
  if (bias.has_value()) y.add_(*bias);
  return y;
}

}  // namespace

namespace skiff_cpu {
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t type, int64_t n, const c10::optional<at::Tensor>& bias,
                       bool precise) {
  return ::gguf_linear(x, codes, scales, offsets, type, n, bias, precise);
}
}  // namespace skiff_cpu

TORCH_LIBRARY_FRAGMENT(skiff_cpu, m) {
  m.def("gguf_pack(Tensor raw, int type, int k) -> (Tensor, Tensor, Tensor)", &gguf_pack);
  m.def("gguf_linear(Tensor x, Tensor codes, Tensor scales, Tensor offsets, int type, int n, Tensor? bias, "
        "bool precise) -> Tensor",
        &gguf_linear);
}
