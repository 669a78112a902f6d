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
// `gguf_linear` quantizes each row of x to int8 per 32 values (scale amax/127, plus the block's exact fp32
// sum for the offset term) and takes integer dot products with vpmaddubsw: unsigned codes x signed
// activations for U4 (8 products of 15 * 127 summed per int16 lane stay below 32767), the sign trick
// |w| x sign(x, w) for S8. One int32 lane per output row: the 8-row interleave makes vpmaddwd's 4-byte
// groups the rows' partial sums, so a block costs one int->float conversion and one FMA for 8 rows.
//   y[r][n] = sum_blocks dw[n] dx[r] (sum_i qw[n][i] qx[r][i]) + mw[n] sum_i x[r][i].
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Half.h>
#include <torch/library.h>

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
constexpr int64_t kTileM = 64;  // activation rows per cache tile

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

// One row of k floats -> int8 codes per 32 values, their scale amax/127 and the exact fp32 sum of each block.
void quantize_row(const float* x, int64_t k, int8_t* q, float* scale, float* sum) {
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
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float a = _mm_cvtss_f32(m4);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    sum[kb] = _mm_cvtss_f32(s4);
    scale[kb] = a / 127.0f;
    const __m256 inv = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
    __m256i i[4];
    for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));  // round to nearest even
    const __m256i w01 = _mm256_packs_epi32(i[0], i[1]);  // lanes: 0-3 4-7 | 8-11 12-15 (per 128-bit half)
    const __m256i w23 = _mm256_packs_epi32(i[2], i[3]);
    const __m256i b = _mm256_packs_epi16(w01, w23);
    const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + kb * kBlock), ordered);
#else
    float a = 0.0f, s = 0.0f;
    for (int i = 0; i < kBlock; ++i) a = std::max(a, std::fabs(xb[i])), s += xb[i];
    sum[kb] = s;
    scale[kb] = a / 127.0f;
    const float inv = a > 0.0f ? 127.0f / a : 0.0f;
    for (int i = 0; i < kBlock; ++i) q[kb * kBlock + i] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
#endif
  }
}

struct Acts {
  const int8_t* q;      // [m, k]
  const float* scale;   // [m, k/32]
  const float* sum;     // [m, k/32]
  int64_t k, kbs;
};

// ---------------------------------------------------------------------------------------------- tiles

#if SKIFF_GGUF_AVX2
template <typename S>
inline __m256 load8(const S* p) {
  if constexpr (std::is_same_v<S, float>) return _mm256_loadu_ps(p);
  else return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// R activation rows against one group of 8 output rows: out[r][0..8).
template <typename S, int R>
void u4_tile(const uint8_t* codes, const S* d, const S* m, const Acts& a, int64_t r0, float* out, int64_t ldo) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t kb = 0; kb < a.kbs; ++kb) {
    const uint8_t* cb = codes + kb * 128;
    __m256i t[R];
    for (int r = 0; r < R; ++r) t[r] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb + 32 * c));
      const __m256i lo = _mm256_and_si256(raw, low);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      for (int r = 0; r < R; ++r) {
        const int8_t* xb = a.q + (r0 + r) * a.k + kb * kBlock;
        t[r] = _mm256_add_epi16(t[r], _mm256_maddubs_epi16(lo, bcast4(xb + 4 * c)));
        t[r] = _mm256_add_epi16(t[r], _mm256_maddubs_epi16(hi, bcast4(xb + 16 + 4 * c)));
      }
    }
    const __m256 dw = load8(d + kb * kRows), mw = load8(m + kb * kRows);
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * a.kbs + kb;
      const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(t[r], ones));
      acc[r] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dw, _mm256_set1_ps(a.scale[i])), acc[r]);
      acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.sum[i]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * ldo, acc[r]);
}

template <typename S, int SUBS, int R>
void s8_tile(const uint8_t* codes, const S* d, const Acts& a, int64_t r0, float* out, int64_t ldo) {
  const __m256i ones = _mm256_set1_epi16(1);
  constexpr int kChunks = 8 / SUBS;  // 4-value chunks per scale
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t kb = 0; kb < a.kbs; ++kb) {
    const uint8_t* cb = codes + kb * 256;
    for (int s = 0; s < SUBS; ++s) {
      __m256i t[R];
      for (int r = 0; r < R; ++r) t[r] = _mm256_setzero_si256();
      for (int c = s * kChunks; c < (s + 1) * kChunks; ++c) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb + 32 * c));
        const __m256i aw = _mm256_abs_epi8(w);
        for (int r = 0; r < R; ++r) {
          const __m256i x = _mm256_sign_epi8(bcast4(a.q + (r0 + r) * a.k + kb * kBlock + 4 * c), w);
          t[r] = _mm256_add_epi32(t[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, x), ones));
        }
      }
      const __m256 dw = load8(d + (kb * SUBS + s) * kRows);
      for (int r = 0; r < R; ++r) {
        const __m256 ds = _mm256_mul_ps(dw, _mm256_set1_ps(a.scale[(r0 + r) * a.kbs + kb]));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t[r]), ds, acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * ldo, acc[r]);
}
#else
template <typename S>
inline float scalar_of(const S& v) {
  if constexpr (std::is_same_v<S, float>) return v;
  else return static_cast<float>(c10::Half(v, c10::Half::from_bits()));
}

template <typename S, int R>
void u4_tile(const uint8_t* codes, const S* d, const S* m, const Acts& a, int64_t r0, float* out, int64_t ldo) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kRows; ++j) {
      float acc = 0.0f;
      for (int64_t kb = 0; kb < a.kbs; ++kb) {
        const uint8_t* cb = codes + kb * 128;
        const int8_t* xb = a.q + (r0 + r) * a.k + kb * kBlock;
        int32_t isum = 0;
        for (int c = 0; c < 4; ++c)
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = cb[c * 32 + j * 4 + i];
            isum += (byte & 0xF) * xb[4 * c + i] + (byte >> 4) * xb[16 + 4 * c + i];
          }
        const int64_t ia = (r0 + r) * a.kbs + kb;
        acc += static_cast<float>(isum) * scalar_of(d[kb * kRows + j]) * a.scale[ia] +
               scalar_of(m[kb * kRows + j]) * a.sum[ia];
      }
      out[r * ldo + j] = acc;
    }
}

template <typename S, int SUBS, int R>
void s8_tile(const uint8_t* codes, const S* d, const Acts& a, int64_t r0, float* out, int64_t ldo) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kRows; ++j) {
      float acc = 0.0f;
      for (int64_t kb = 0; kb < a.kbs; ++kb)
        for (int s = 0; s < SUBS; ++s) {
          int32_t isum = 0;
          for (int c = s * 8 / SUBS; c < (s + 1) * 8 / SUBS; ++c)
            for (int i = 0; i < 4; ++i)
              isum += static_cast<int8_t>(codes[kb * 256 + c * 32 + j * 4 + i]) *
                      a.q[(r0 + r) * a.k + kb * kBlock + 4 * c + i];
          acc += static_cast<float>(isum) * scalar_of(d[(kb * SUBS + s) * kRows + j]) * a.scale[(r0 + r) * a.kbs + kb];
        }
      out[r * ldo + j] = acc;
    }
}
#endif

// Rows [r0, r0 + rows) of x against group g, written to y (columns past n go to a scratch tile).
template <typename S, int SUBS, bool U4, int R>
void run_tile(const uint8_t* codes, const S* d, const S* m, const Acts& a, int64_t g, int64_t r0, float* out,
              int64_t ldo) {
  const int64_t cb = U4 ? 128 : 256;
  const uint8_t* gc = codes + g * a.kbs * cb;
  if constexpr (U4) u4_tile<S, R>(gc, d + g * a.kbs * kRows, m + g * a.kbs * kRows, a, r0, out, ldo);
  else s8_tile<S, SUBS, R>(gc, d + g * a.kbs * SUBS * kRows, a, r0, out, ldo);
}

// pairs: code rows (2r, 2r+1) are the two terms of x's row r, summed into y's row r.
template <typename S, int SUBS, bool U4>
void gemm(const uint8_t* codes, const S* d, const S* m, const Acts& a, int64_t rows, int64_t n, float* y,
          bool pairs) {
  const int64_t groups = (n + kRows - 1) / kRows;
  const int64_t grain = std::max<int64_t>(1, 256 / (rows * a.kbs));  // >= ~256 block dots per task
  at::parallel_for(0, groups, grain, [&](int64_t lo, int64_t hi) {
    alignas(32) float scratch[4 * kRows];
    for (int64_t m0 = 0; m0 < rows; m0 += kTileM) {
      const int64_t m1 = std::min(rows, m0 + kTileM);
      for (int64_t g = lo; g < hi; ++g) {
        const int64_t cols = std::min(kRows, n - g * kRows);
        const bool direct = !pairs && cols == kRows;
        for (int64_t r = m0; r < m1; r += 4) {
          const int64_t nr = std::min<int64_t>(4, m1 - r);
          float* out = direct ? y + r * n + g * kRows : scratch;
          const int64_t ldo = direct ? n : kRows;
          switch (nr) {
            case 4: run_tile<S, SUBS, U4, 4>(codes, d, m, a, g, r, out, ldo); break;
            case 3: run_tile<S, SUBS, U4, 3>(codes, d, m, a, g, r, out, ldo); break;
            case 2: run_tile<S, SUBS, U4, 2>(codes, d, m, a, g, r, out, ldo); break;
            default: run_tile<S, SUBS, U4, 1>(codes, d, m, a, g, r, out, ldo); break;
          }
          if (direct) continue;
          if (pairs) {
            for (int64_t rr = 0; rr < nr; rr += 2)
              for (int64_t j = 0; j < cols; ++j)
                y[(r + rr) / 2 * n + g * kRows + j] = scratch[rr * kRows + j] + scratch[(rr + 1) * kRows + j];
          } else {
            for (int64_t rr = 0; rr < nr; ++rr)
              for (int64_t j = 0; j < cols; ++j) y[(r + rr) * n + g * kRows + j] = scratch[rr * kRows + j];
          }
        }
      }
    }
  });
}

// Row r of x -> codes rows (hi, lo) = (2r, 2r+1): lo quantizes what hi leaves (x - dx q), so that
// dx q_hi + dx' q_lo is within amax / 254^2 of x; only the hi row carries the block sums of the offset term.
void quantize_row_split(const float* x, int64_t k, int8_t* q, float* scale, float* sum, int64_t kbs, float* tmp) {
  quantize_row(x, k, q, scale, sum);
  for (int64_t i = 0; i < k; ++i) tmp[i] = x[i] - scale[i / kBlock] * static_cast<float>(q[i]);
  quantize_row(tmp, k, q + k, scale + kbs, sum + kbs);
  std::fill(sum + kbs, sum + 2 * kbs, 0.0f);
}

// x: [M, K] float32 (rows contiguous); the packed weight of `gguf_pack` for n output rows -> y: [M, n].
// precise: activations as two int8 terms (above) at twice the integer work, ~1/254 of the error.
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
  const int64_t rows = precise ? 2 * m : m;
  // the activation codes live in the calling thread's scratch (workers write through its pointers): no
  // allocator calls per linear beyond y
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs;
  xq.resize(rows * k);
  xs.resize(2 * rows * kbs);
  const float* xp = x.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  int8_t* qp = xq.data();
  float* sp = xs.data();
  float* sums = sp + rows * kbs;
  at::parallel_for(0, m, 64, [&](int64_t lo, int64_t hi) {
    std::vector<float> tmp(precise ? k : 0);
    for (int64_t r = lo; r < hi; ++r) {
      if (precise)
        quantize_row_split(xp + r * ldx, k, qp + 2 * r * k, sp + 2 * r * kbs, sums + 2 * r * kbs, kbs, tmp.data());
      else
        quantize_row(xp + r * ldx, k, qp + r * k, sp + r * kbs, sums + r * kbs);
    }
  });
  const Acts a{qp, sp, sums, k, kbs};
  const auto* cp = codes.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  if (f.unsigned4 && f.f16_scales) {
    const auto* d = reinterpret_cast<const uint16_t*>(scales.data_ptr());
    gemm<uint16_t, 1, true>(cp, d, reinterpret_cast<const uint16_t*>(offsets.data_ptr()), a, rows, n, yp, precise);
  } else if (f.unsigned4) {
    gemm<float, 1, true>(cp, scales.data_ptr<float>(), offsets.data_ptr<float>(), a, rows, n, yp, precise);
  } else if (f.f16_scales) {
    gemm<uint16_t, 1, false>(cp, reinterpret_cast<const uint16_t*>(scales.data_ptr()), nullptr, a, rows, n, yp, precise);
  } else {
    gemm<float, 2, false>(cp, scales.data_ptr<float>(), nullptr, a, rows, n, yp, precise);
  }
  if (bias.has_value()) y.add_(*bias);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(skiff_cpu, m) {
  m.def("gguf_pack(Tensor raw, int type, int k) -> (Tensor, Tensor, Tensor)", &gguf_pack);
  m.def("gguf_linear(Tensor x, Tensor codes, Tensor scales, Tensor offsets, int type, int n, Tensor? bias, "
        "bool precise) -> Tensor",
        &gguf_linear);
}
