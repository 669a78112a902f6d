// Int8 linear for small batches on AVX2 CPUs (decode steps): y = dequant(quant(x) . W^T).
//
// W is quantized symmetrically per output channel to [-127, 127] and packed by `int8_pack_weight` into
// blocks of 4 channels x 32 K-bytes, so that one pass streams the weights once, in order. Each row of x is
// quantized on the fly to 7-bit unsigned codes q = round(63 x / amax) + 64 in [1, 127]: the product of such a
// code with a signed 8-bit weight, summed in pairs by vpmaddubsw, stays below 2 * 127 * 127 = 32258 and so
// never saturates the int16 lanes (AVX2 has no VNNI). The zero point is removed with the channel sums of W:
//   sum_k (q_k - 64) w_k = sum_k q_k w_k - 64 colsum(w).
// Large batches (prefill) keep fbgemm, which packs activations and is faster there.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlockN = 4;   // output channels per packed block
constexpr int64_t kBlockK = 32;  // bytes of K per packed block row (one ymm register)
constexpr float kLevels = 63.0f;
constexpr int32_t kZero = 64;

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// w: [N, K] float -> (packed int8 [N/4 * K/32 * 4 * 32] with N and K padded, scale [N], colsum [N])
std::tuple<at::Tensor, at::Tensor, at::Tensor> int8_pack_weight(const at::Tensor& w_in) {
  TORCH_CHECK(w_in.dim() == 2 && w_in.device().is_cpu(), "int8_pack_weight: w must be a 2-D CPU tensor");
  const at::Tensor w = w_in.to(at::kFloat).contiguous();
  const int64_t n = w.size(0), k = w.size(1), np = round_up(n, kBlockN), kp = round_up(k, kBlockK);
  at::Tensor packed = at::zeros({np * kp}, w.options().dtype(at::kChar));
  at::Tensor scale = at::empty({n}, w.options());
  at::Tensor colsum = at::empty({np}, w.options().dtype(at::kInt)).zero_();
  const float* src = w.data_ptr<float>();
  int8_t* dst = packed.data_ptr<int8_t>();
  float* sc = scale.data_ptr<float>();
  int32_t* cs = colsum.data_ptr<int32_t>();
  at::parallel_for(0, n, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      const float* row = src + c * k;
      float amax = 0.0f;
      for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(row[i]));
      const float s = std::max(amax, 1e-30f) / 127.0f;
      sc[c] = s;
      int8_t* block = dst + (c / kBlockN) * kp * kBlockN + (c % kBlockN) * kBlockK;
      int32_t sum = 0;
      for (int64_t i = 0; i < k; ++i) {
        const auto q = static_cast<int8_t>(std::clamp(std::nearbyint(row[i] / s), -127.0f, 127.0f));
        block[(i / kBlockK) * kBlockK * kBlockN + i % kBlockK] = q;
        sum += q;
      }
      cs[c] = sum;
    }
  });
  return {packed, scale, colsum};
}

// One row of x -> 7-bit codes (padding gets the zero point) and the row's dequantization factor.
float quantize_row(const float* x, int64_t k, int64_t kp, uint8_t* q) {
  float amax = 0.0f;
#pragma omp simd reduction(max : amax)
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inv = amax > 0.0f ? kLevels / amax : 0.0f;
#pragma omp simd
  for (int64_t i = 0; i < k; ++i) q[i] = static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(x[i] * inv)) + kZero);
  for (int64_t i = k; i < kp; ++i) q[i] = kZero;
  return amax / kLevels;
}

#if defined(__AVX2__)
inline __m256i dot_step(__m256i acc, __m256i x, __m256i w, __m256i ones) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), ones));
}

// Sums of each of 4 accumulators (8 int32 lanes each) -> 4 int32 lanes.
inline __m128i hsum4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
  const __m256i abcd = _mm256_hadd_epi32(ab, cd);
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

// Rows (r0, r1) of the codes against one packed block of 4 channels: out[r][j] = sum_k q[r][k] w[j][k].
template <int R>
void block_dot(const uint8_t* q0, const uint8_t* q1, const int8_t* wb, int64_t kp, int32_t* out0, int32_t* out1) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a03 = a00;
  __m256i a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  for (int64_t kc = 0; kc < kp; kc += kBlockK, wb += kBlockK * kBlockN) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32));
    const __m256i w2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64));
    const __m256i w3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 96));
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q0 + kc));
    a00 = dot_step(a00, x0, w0, ones);
    a01 = dot_step(a01, x0, w1, ones);
    a02 = dot_step(a02, x0, w2, ones);
    a03 = dot_step(a03, x0, w3, ones);
    if constexpr (R == 2) {
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q1 + kc));
      a10 = dot_step(a10, x1, w0, ones);
      a11 = dot_step(a11, x1, w1, ones);
      a12 = dot_step(a12, x1, w2, ones);
      a13 = dot_step(a13, x1, w3, ones);
    }
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out0), hsum4(a00, a01, a02, a03));
  if constexpr (R == 2) _mm_storeu_si128(reinterpret_cast<__m128i*>(out1), hsum4(a10, a11, a12, a13));
}
#else
template <int R>
void block_dot(const uint8_t* q0, const uint8_t* q1, const int8_t* wb, int64_t kp, int32_t* out0, int32_t* out1) {
  for (int j = 0; j < kBlockN; ++j) out0[j] = out1[j] = 0;
  for (int64_t kc = 0; kc < kp; kc += kBlockK, wb += kBlockK * kBlockN)
    for (int j = 0; j < kBlockN; ++j)
      for (int64_t i = 0; i < kBlockK; ++i) {
        out0[j] += q0[kc + i] * wb[j * kBlockK + i];
        if (R == 2) out1[j] += q1[kc + i] * wb[j * kBlockK + i];
      }
}
#endif

// x: [M, K] float (rows contiguous) -> y: [M, N] float.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                       const at::Tensor& colsum, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.scalar_type() == at::kFloat && x.stride(1) == 1,
              "int8_linear: x must be a 2-D float32 CPU tensor with contiguous rows");
  const int64_t m = x.size(0), k = x.size(1), n = scale.size(0), np = colsum.size(0);
  const int64_t kp = round_up(k, kBlockK);
  TORCH_CHECK(packed.numel() == np * kp, "int8_linear: packed weight does not match x's width");
  at::Tensor codes = at::empty({m, kp}, x.options().dtype(at::kByte));
  at::Tensor row_scale = at::empty({m}, x.options());
  at::Tensor y = at::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  uint8_t* qp = codes.data_ptr<uint8_t>();
  float* rs = row_scale.data_ptr<float>();
  for (int64_t r = 0; r < m; ++r) rs[r] = quantize_row(xp + r * x.stride(0), k, kp, qp + r * kp);
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* ws = scale.data_ptr<float>();
  const int32_t* cs = colsum.data_ptr<int32_t>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, np / kBlockN, 1, [&](int64_t lo, int64_t hi) {
    alignas(16) int32_t acc0[kBlockN], acc1[kBlockN];
    for (int64_t b = lo; b < hi; ++b) {
      const int8_t* wb = wp + b * kp * kBlockN;
      const int64_t c0 = b * kBlockN, cols = std::min(kBlockN, n - c0);
      for (int64_t r = 0; r < m; r += 2) {
        const bool pair = r + 1 < m;
        if (pair) block_dot<2>(qp + r * kp, qp + (r + 1) * kp, wb, kp, acc0, acc1);
        else block_dot<1>(qp + r * kp, qp + r * kp, wb, kp, acc0, acc1);
        for (int rr = 0; rr < (pair ? 2 : 1); ++rr) {
          const int32_t* acc = rr ? acc1 : acc0;
          float* out = yp + (r + rr) * n + c0;
          for (int64_t j = 0; j < cols; ++j) {
            const float v = static_cast<float>(acc[j] - kZero * cs[c0 + j]) * rs[r + rr] * ws[c0 + j];
            out[j] = bp ? v + bp[c0 + j] : v;
          }
        }
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(skiff_cpu, m) {
  m.def("int8_pack_weight(Tensor w) -> (Tensor, Tensor, Tensor)", &int8_pack_weight);
  m.def("int8_linear(Tensor x, Tensor packed, Tensor scale, Tensor colsum, Tensor? bias) -> Tensor", &int8_linear);
}
