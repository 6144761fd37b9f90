// bf16 in, bf16 out on CPUs with AVX512-BF16 (vdpbf16ps: 16 lanes x a pair of bf16 products
// summed into fp32 in one instruction), for the engine's bf16 decode step; built on its own as
// `cbbench_cpu_bf16dp_kernels` by kernels/cpu_bf16_dot.py. Without __AVX512BF16__ (the
// compiler targets -march=native) the same entry points run plain loops, and `isa()` says
// "scalar" so Python keeps oneDNN.
//
// - linear_bf16dp: y[M, N] = x[M, K] @ w[N, K]^T (+ bias fp32), x and w bf16, fp32 accumulation,
//   y rounded to bf16 (nearest even), as F.linear in bf16. Weight layout (packed once,
//   `pack`): panels [P = ceil(N / 16), K2 = ceil(K / 2), 16, 2] bf16, one zmm per k pair: lane o
//   holds w[16p + o, 2j] (low half) and w[16p + o, 2j + 1] (high half); zero past N and K.
//   Micro-kernel: up to 8 rows x 3 panels (48 outputs) = 24 zmm accumulators; each k pair
//   loads 3 weight zmm once and broadcasts each row's x pair (one 32-bit load). A decode batch
//   of <= 8 rows streams every weight once, in half of fp32's bytes, with 8 dot-products per
//   64-byte load: memory-bound, where fp32 FMAs on widened weights were compute-bound at 8.
// - rms_norm_bf16: HF's half-type RMSNorm, y = w * bf16(x * rsqrt(mean(x^2) + eps)), x and w
//   bf16, the statistics in fp32 (torch: six ops and two fp32 copies).
// - rope_and_cache_bf16: rotary embedding of q and k (fp32 cos/sin, as RotaryEmbedding.apply:
//   widen, rotate in fp32 without fused multiply-adds, round to bf16) with k and v written into
//   their bf16 cache slots, one pass (torch: a cat, five copies and two index_copy_).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

#include "vec_math.h"
#define CBB_BF16DP 1
#endif

namespace {

constexpr int64_t kPanel = 16;  // outputs per panel, as in cpu_bf16_dot.py
constexpr int kMR = 8;          // rows of x per micro-kernel call
constexpr int kNP = 3;          // panels per micro-kernel call

inline float bf2f(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t f2bf(float f) {  // round to nearest even; NaN stays a (quiet) NaN
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

#if defined(CBB_BF16DP)
inline __m512 widen16(const uint16_t* p) {  // 16 bf16 -> fp32 (exact)
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
#endif

#if defined(CBB_BF16DP)
// Software prefetch of the grouped weight stream (one 192-byte k pair = 3 lines an iteration)
// 48 pairs (9 KiB) ahead into L2, for 4 or more rows: there the 24 dot products of a pair
// keep the core busy and the hardware prefetcher alone left the 37 linears of `small` at 8
// rows 5.0 ms against 4.5 with it (one thread, huge pages). One row is a pure stream (3 dot
// products a pair) that the hardware prefetcher keeps up with; prefetches there cost more
// than they saved (3.7 -> 4.1 ms). Prefetches past the end never fault. The same sums.
constexpr int kPrefetchRows = 4;
constexpr int64_t kPrefetchPairs = 48;
#endif

// Rows 0..MR-1 of x (bf16, row stride K) times panels p0..p0+np-1 -> y (bf16, row stride N).
// Panel p0 + j's k pair t starts at w + at(j) + t * step (`at` / `step` from the layout).
template <int MR>
void micro(const uint16_t* x, int64_t K, const uint16_t* w, int64_t K2, int64_t p0, int np,
           const float* bias, uint16_t* y, int64_t N, bool grouped) {
  // plain [P, K2, 16, 2]: a panel's pairs are contiguous; grouped [P/3, K2, 3, 16, 2]: the
  // k pair of a group's three panels is one 192-byte run, the weight one stream
  const int64_t step = grouped ? kNP * 2 * kPanel : 2 * kPanel;
  auto at = [&](int64_t j) {
    return grouped ? (p0 / kNP) * K2 * step + j * 2 * kPanel : (p0 + j) * K2 * step;
  };
  const int64_t n0 = p0 * kPanel;
  alignas(64) float acc[kMR][kNP * kPanel];
#if defined(CBB_BF16DP)
  const uint16_t* wp[kNP];
  for (int j = 0; j < kNP; ++j) wp[j] = w + at(j < np ? j : 0);
  const uint16_t *w0 = wp[0], *w1 = wp[1], *w2 = wp[2];
  const int64_t full = K / 2;  // whole pairs; an odd K's last pair is built below
#define CBB_DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = c##i##0, c##i##2 = c##i##0;
  CBB_DECL(0) CBB_DECL(1) CBB_DECL(2) CBB_DECL(3) CBB_DECL(4) CBB_DECL(5) CBB_DECL(6) CBB_DECL(7)
#undef CBB_DECL
#define CBB_DOT(i, XPAIR)                                                   \
  if constexpr (MR > i) {                                                   \
    const __m512bh xv = (__m512bh)_mm512_set1_epi32(XPAIR(i));              \
    c##i##0 = _mm512_dpbf16_ps(c##i##0, xv, v0);                            \
    c##i##1 = _mm512_dpbf16_ps(c##i##1, xv, v1);                            \
    c##i##2 = _mm512_dpbf16_ps(c##i##2, xv, v2);                            \
  }
#define CBB_PAIR(i) pair_at(x + (i) * K + 2 * j)
#define CBB_LAST(i) static_cast<int32_t>(x[(i) * K + K - 1])
  auto pair_at = [](const uint16_t* p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  for (int64_t j = 0; j < full; ++j) {
    const int64_t o = j * step;
    if constexpr (MR >= kPrefetchRows) {  // the k pair kPrefetchPairs ahead, into L2
      const char* pf = reinterpret_cast<const char*>(w0 + o + kPrefetchPairs * step);
      _mm_prefetch(pf, _MM_HINT_T1);
      _mm_prefetch(pf + 64, _MM_HINT_T1);
      _mm_prefetch(pf + 128, _MM_HINT_T1);
    }
    const __m512bh v0 = (__m512bh)_mm512_loadu_si512(w0 + o);
    const __m512bh v1 = (__m512bh)_mm512_loadu_si512(w1 + o);
    const __m512bh v2 = (__m512bh)_mm512_loadu_si512(w2 + o);
    CBB_DOT(0, CBB_PAIR) CBB_DOT(1, CBB_PAIR) CBB_DOT(2, CBB_PAIR) CBB_DOT(3, CBB_PAIR)
    CBB_DOT(4, CBB_PAIR) CBB_DOT(5, CBB_PAIR) CBB_DOT(6, CBB_PAIR) CBB_DOT(7, CBB_PAIR)
  }
  if (K % 2) {  // the last k alone: x's high half zero (the weight's is zero padding too)
    const int64_t o = full * step;
    const __m512bh v0 = (__m512bh)_mm512_loadu_si512(w0 + o);
    const __m512bh v1 = (__m512bh)_mm512_loadu_si512(w1 + o);
    const __m512bh v2 = (__m512bh)_mm512_loadu_si512(w2 + o);
    CBB_DOT(0, CBB_LAST) CBB_DOT(1, CBB_LAST) CBB_DOT(2, CBB_LAST) CBB_DOT(3, CBB_LAST)
    CBB_DOT(4, CBB_LAST) CBB_DOT(5, CBB_LAST) CBB_DOT(6, CBB_LAST) CBB_DOT(7, CBB_LAST)
  }
#undef CBB_DOT
#undef CBB_PAIR
#undef CBB_LAST
  const __m512 tile[kMR][kNP] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22},
                                 {c30, c31, c32}, {c40, c41, c42}, {c50, c51, c52},
                                 {c60, c61, c62}, {c70, c71, c72}};
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < np; ++j) {
      __m512 s = tile[i][j];
      const int64_t n = n0 + j * kPanel;
      if (n + kPanel <= N) {  // a whole panel inside N: vector bias add, round and store
        if (bias) s = _mm512_add_ps(s, _mm512_loadu_ps(bias + n));
        const __m256bh h = _mm512_cvtneps_pbh(s);
        std::memcpy(y + i * N + n, &h, sizeof h);
      } else {
        _mm512_store_ps(acc[i] + j * kPanel, s);
        for (int64_t c = 0; n + c < N; ++c)
          y[i * N + n + c] = f2bf(acc[i][j * kPanel + c] + (bias ? bias[n + c] : 0.f));
      }
    }
  }
#else
  for (int i = 0; i < MR; ++i)
    for (int c = 0; c < kNP * kPanel; ++c) acc[i][c] = 0.f;
  for (int j = 0; j < np; ++j) {
    const uint16_t* panel = w + at(j);
    for (int i = 0; i < MR; ++i)
      for (int64_t k = 0; k < K; ++k) {
        const float xv = bf2f(x[i * K + k]);
        const uint16_t* row = panel + (k / 2) * step + (k % 2);
        for (int64_t c = 0; c < kPanel; ++c) acc[i][j * kPanel + c] += xv * bf2f(row[2 * c]);
      }
  }
  for (int i = 0; i < MR; ++i)
    for (int64_t c = 0; c < np * kPanel && n0 + c < N; ++c)
      y[i * N + n0 + c] = f2bf(acc[i][c] + (bias ? bias[n0 + c] : 0.f));
#endif
}


// x [M, K] fp32 -> bf16, round to nearest even (x.to(torch.bfloat16)).
at::Tensor to_bf16(const at::Tensor& x) {
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(at::kBFloat16));
  const float* xp = x.data_ptr<float>();
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int64_t n = x.numel();
  int64_t i = 0;
#if defined(CBB_BF16DP)
  for (; i + 16 <= n; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(xp + i));
    std::memcpy(yp + i, &h, sizeof h);
  }
#endif
  for (; i < n; ++i) yp[i] = f2bf(xp[i]);
  return y;
}

// y[i, n0:n1] = bf16(y + r) for rows 0..mr-1 (row stride N): torch's bf16 residual add, fused
// into the projection while its outputs are still in cache.
void add_residual(uint16_t* y, const uint16_t* r, int mr, int64_t N, int64_t n0, int64_t n1) {
  for (int i = 0; i < mr; ++i) {
    int64_t n = n0;
#if defined(CBB_BF16DP)
    for (; n + 16 <= n1; n += 16) {
      const __m512 a = widen16(y + i * N + n), b = widen16(r + i * N + n);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_add_ps(a, b));
      std::memcpy(y + i * N + n, &h, sizeof h);
    }
#endif
    for (; n < n1; ++n) y[i * N + n] = f2bf(bf2f(y[i * N + n]) + bf2f(r[i * N + n]));
  }
}

using MicroFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, int,
                         const float*, uint16_t*, int64_t, bool);

MicroFn pick(int mr) {
  switch (mr) {
    case 1: return &micro<1>;
    case 2: return &micro<2>;
    case 3: return &micro<3>;
    case 4: return &micro<4>;
    case 5: return &micro<5>;
    case 6: return &micro<6>;
    case 7: return &micro<7>;
    default: return &micro<8>;
  }
}

}  // namespace

// x [M, K] bf16, panels [ceil(N/16), ceil(K/2), 16, 2] bf16 (from `pack`), bias [N] fp32 or
// None -> y [M, N] bf16.
at::Tensor linear_bf16dp(const at::Tensor& x_in, const at::Tensor& panels,
                         const c10::optional<at::Tensor>& bias, int64_t N,
                         const c10::optional<at::Tensor>& residual) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.is_contiguous() &&
                  (x_in.scalar_type() == at::kBFloat16 || x_in.scalar_type() == at::kFloat),
              "linear_bf16dp: x must be a contiguous bf16 or fp32 [M, K] tensor");
  // fp32 x is rounded to bf16 first (as x.to(torch.bfloat16)): the attention's fp32 output
  const at::Tensor x = x_in.scalar_type() == at::kFloat ? to_bf16(x_in) : x_in;
  const bool grouped = panels.dim() == 5;  // [ceil(P / 3), K2, 3, 16, 2]
  TORCH_CHECK((panels.dim() == 4 || (grouped && panels.size(2) == kNP)) &&
                  panels.scalar_type() == at::kBFloat16 && panels.is_contiguous() &&
                  panels.size(-2) == kPanel && panels.size(-1) == 2,
              "linear_bf16dp: panels must be contiguous bf16 [P, K2, 16, 2] or [G, K2, 3, 16, 2]");
  const int64_t M = x.size(0), K = x.size(1), K2 = panels.size(1);
  const int64_t P = grouped ? (N + kPanel - 1) / kPanel : panels.size(0);
  TORCH_CHECK(!grouped || panels.size(0) == (P + kNP - 1) / kNP, "linear_bf16dp: N=", N,
              " needs ", (P + kNP - 1) / kNP, " groups of panels, got ", panels.size(0));
  TORCH_CHECK(K2 == (K + 1) / 2, "linear_bf16dp: x has K=", K, ", panels ", K2, " pairs");
  TORCH_CHECK(N >= 1 && (N + kPanel - 1) / kPanel == P, "linear_bf16dp: N=", N, " needs ",
              (N + kPanel - 1) / kPanel, " panels, got ", P);
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N,
                "linear_bf16dp: bias must be contiguous fp32 [N]");
    b = bias->data_ptr<float>();
  }
  const uint16_t* rp = nullptr;
  if (residual.has_value() && residual->defined()) {
    TORCH_CHECK(residual->scalar_type() == at::kBFloat16 && residual->is_contiguous() &&
                    residual->dim() == 2 && residual->size(0) == M && residual->size(1) == N,
                "linear_bf16dp: residual must be contiguous bf16 [M, N]");
    rp = reinterpret_cast<const uint16_t*>(residual->data_ptr<at::BFloat16>());
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int64_t groups = (P + kNP - 1) / kNP;
  const int64_t bytes = kNP * kPanel * K2 * 2 * 2;  // one group's weight
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, bytes));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = g * kNP;
      const int np = static_cast<int>(std::min<int64_t>(kNP, P - p0));
      for (int64_t m = 0; m < M; m += kMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kMR, M - m));
        pick(mr)(xp + m * K, K, wp, K2, p0, np, b, yp + m * N, N, grouped);
        if (rp) add_residual(yp + m * N, rp + m * N, mr, N, p0 * kPanel,
                             std::min<int64_t>(N, (p0 + np) * kPanel));
      }
    }
  });
  return y;
}

// x [M, H] bf16, w [H] bf16 -> bf16: w * bf16(x * rsqrt(mean(x^2) + eps)), fp32 statistics.
at::Tensor rms_norm_bf16(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "rms_norm_bf16: x must be a contiguous bf16 [M, H] tensor");
  const int64_t M = x.size(0), H = x.size(1);
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.is_contiguous() && w.numel() == H,
              "rms_norm_bf16: weight must be contiguous bf16 [H]");
  at::Tensor y = at::empty_like(x);
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const float e = static_cast<float>(eps);
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const uint16_t* r = xp + m * H;
      uint16_t* o = yp + m * H;
      float ss = 0.f;
      int64_t h = 0;
#if defined(CBB_BF16DP)
      __m512 vs = _mm512_setzero_ps();
      for (; h + 16 <= H; h += 16) {
        const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + h))),
            16));
        vs = _mm512_fmadd_ps(v, v, vs);
      }
      ss = _mm512_reduce_add_ps(vs);
#endif
      for (; h < H; ++h) ss += bf2f(r[h]) * bf2f(r[h]);
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + e);
      for (int64_t c = 0; c < H; ++c) o[c] = f2bf(bf2f(wp[c]) * bf2f(f2bf(bf2f(r[c]) * inv)));
    }
  });
  return y;
}

// No fused multiply-add here: torch's x1 * c - x2 * s rounds each product to fp32.
__attribute__((optimize("fp-contract=off"))) static void rotate_bf16(
    const uint16_t* x, const float* c, const float* s, uint16_t* y, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = bf2f(x[i]), x2 = bf2f(x[half + i]);
    const float a = x1 * c[i], b = x2 * s[i], d = x2 * c[i], e = x1 * s[i];
    y[i] = f2bf(a - b);
    y[half + i] = f2bf(d + e);
  }
}

// qkv [T, (Hq + 2 Hkv) * D] bf16 (q | k | v columns), cos/sin [T, D/2] fp32, caches
// [NB, BS, Hkv, D] bf16, slots [T] int64 (< 0: padding, not written) -> rotated q [T, Hq, D].
at::Tensor rope_and_cache_bf16(const at::Tensor& qkv, const at::Tensor& cos,
                               const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                               const at::Tensor& slots, int64_t Hq, int64_t Hkv, int64_t D,
                               bool q_float) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kBFloat16 && qkv.is_contiguous() &&
                  qkv.size(1) == (Hq + 2 * Hkv) * D,
              "rope_and_cache_bf16: qkv must be contiguous bf16 [T, (Hq + 2 Hkv) * D]");
  const int64_t T = qkv.size(0), half = D / 2;
  TORCH_CHECK(D % 2 == 0, "rope_and_cache_bf16: head_dim must be even");
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == T && cos.size(1) == half && cos.is_contiguous() &&
                  sin.sizes() == cos.sizes() && sin.is_contiguous() &&
                  cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "rope_and_cache_bf16: cos/sin must be contiguous fp32 [T, D/2]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(2) == Hkv && k_cache.size(3) == D &&
                  k_cache.scalar_type() == at::kBFloat16 &&
                  v_cache.scalar_type() == at::kBFloat16 && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "rope_and_cache_bf16: caches must be contiguous bf16 [NB, BS, Hkv, D]");
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == T && slots.scalar_type() == at::kLong &&
                  slots.is_contiguous(),
              "rope_and_cache_bf16: slots must be contiguous int64 [T]");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(sp[t] < num_slots, "rope_and_cache_bf16: slot ", sp[t],
                " outside the cache of ", num_slots);
  // q_float: q widened to fp32 (exact; as q.float() for the attention kernel's fp32 query)
  auto q = at::empty({T, Hq, D}, qkv.options().dtype(q_float ? at::kFloat : at::kBFloat16));
  const auto* in = reinterpret_cast<const uint16_t*>(qkv.data_ptr<at::BFloat16>());
  const float* cp = cos.data_ptr<float>();
  const float* snp = sin.data_ptr<float>();
  auto* qp = q_float ? nullptr : reinterpret_cast<uint16_t*>(q.data_ptr<at::BFloat16>());
  float* qf = q_float ? q.data_ptr<float>() : nullptr;
  auto* kc = reinterpret_cast<uint16_t*>(k_cache.data_ptr<at::BFloat16>());
  auto* vc = reinterpret_cast<uint16_t*>(v_cache.data_ptr<at::BFloat16>());
  const int64_t width = (Hq + 2 * Hkv) * D;
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* row = in + t * width;
      const float* c = cp + t * half;
      const float* s = snp + t * half;
      if (qp) {
        for (int64_t h = 0; h < Hq; ++h) rotate_bf16(row + h * D, c, s, qp + (t * Hq + h) * D, half);
      } else {
        std::vector<uint16_t> tmp(D);
        for (int64_t h = 0; h < Hq; ++h) {
          rotate_bf16(row + h * D, c, s, tmp.data(), half);
          for (int64_t d = 0; d < D; ++d) qf[(t * Hq + h) * D + d] = bf2f(tmp[d]);
        }
      }
      if (sp[t] < 0) continue;
      uint16_t* kdst = kc + sp[t] * Hkv * D;
      for (int64_t h = 0; h < Hkv; ++h) rotate_bf16(row + (Hq + h) * D, c, s, kdst + h * D, half);
      std::memcpy(vc + sp[t] * Hkv * D, row + (Hq + Hkv) * D, sizeof(uint16_t) * Hkv * D);
    }
  });
  return q;
}

// gu [M, 2I] bf16 (gate | up columns) -> [M, I] bf16: bf16(bf16(silu(gate)) * up), as
// F.silu(gate) * up in bf16 (silu in fp32 and rounded; exp within ~1 ulp of torch's).
at::Tensor silu_mul_bf16(const at::Tensor& gu) {
  TORCH_CHECK(gu.dim() == 2 && gu.scalar_type() == at::kBFloat16 && gu.is_contiguous() &&
                  gu.size(1) % 2 == 0,
              "silu_mul_bf16: gu must be a contiguous bf16 [M, 2I] tensor");
  const int64_t M = gu.size(0), I = gu.size(1) / 2;
  at::Tensor y = at::empty({M, I}, gu.options());
  const auto* gp = reinterpret_cast<const uint16_t*>(gu.data_ptr<at::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* g = gp + m * 2 * I;
    const uint16_t* u = g + I;
    uint16_t* o = yp + m * I;
    int64_t i = 0;
#if defined(CBB_BF16DP)
    const __m512 one = _mm512_set1_ps(1.f);
    for (; i + 16 <= I; i += 16) {
      const __m512 a = widen16(g + i);
      const __m512 s = _mm512_div_ps(a, _mm512_add_ps(one, cbb::exp16(_mm512_sub_ps(_mm512_setzero_ps(), a))));
      const __m512 sr = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(s));  // silu's bf16 result
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_mul_ps(sr, widen16(u + i)));
      std::memcpy(o + i, &h, sizeof h);
    }
#endif
    for (; i < I; ++i) {
      const float a = bf2f(g[i]);
      o[i] = f2bf(bf2f(f2bf(a / (1.f + std::exp(-a)))) * bf2f(u[i]));
    }
  }
  return y;
}

std::string isa() {
#if defined(CBB_BF16DP)
  return "avx512bf16";
#else
  return "scalar";
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_bf16dp", &linear_bf16dp,
        "x [M, K] bf16, panels [ceil(N/16), ceil(K/2), 16, 2] bf16, bias [N] fp32 or None, N "
        "-> [M, N] bf16",
        py::arg("x"), py::arg("panels"), py::arg("bias"), py::arg("N"),
        py::arg("residual") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("silu_mul_bf16", &silu_mul_bf16, "gu [M, 2I] bf16 -> silu(gate) * up [M, I] bf16",
        py::arg("gu"), py::call_guard<py::gil_scoped_release>());
  m.def("rms_norm_bf16", &rms_norm_bf16, "x [M, H] bf16, w [H] bf16, eps -> [M, H] bf16",
        py::arg("x"), py::arg("w"), py::arg("eps"), py::call_guard<py::gil_scoped_release>());
  m.def("rope_and_cache_bf16", &rope_and_cache_bf16,
        "qkv [T, (Hq + 2 Hkv) * D] bf16, cos/sin [T, D/2] fp32, k/v caches bf16, slots [T] "
        "int64, Hq, Hkv, D -> rotated q [T, Hq, D] bf16 (k, v written into the caches)",
        py::arg("qkv"), py::arg("cos"), py::arg("sin"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("slots"), py::arg("Hq"), py::arg("Hkv"), py::arg("D"), py::arg("q_float") = false,
        py::call_guard<py::gil_scoped_release>());
  m.def("isa", &isa, "the instruction set the kernel was compiled for");
}
