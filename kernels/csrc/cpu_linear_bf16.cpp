// A projection with compressed weights for x86-64 CPUs without a native bf16 matmul (AVX-512
// or AVX2/FMA where the compiler targets them, plain loops otherwise): y[M, N] = x[M, K] @ w[N, K]^T (+ bias),
// x fp32, w bf16 or int8 (weight-only, one fp32 scale per output), y fp32, fp32 accumulation.
// Built on its own as `cbbench_cpu_bf16_kernels` by kernels/cpu_linear_bf16.py (no AVX-512
// needed).
//
// Weight layout (packed once at load, kernels/cpu_linear_bf16.py `pack` / `pack_int8`): panels
// [P = ceil(N / 8), K, 8] bf16 or int8, panel p holding outputs 8p..8p+7 (zero rows past N), so
// each k step reads the 8 outputs' weights as one 16-byte (bf16) or 8-byte (int8) load. bf16 ->
// fp32 is a 16-bit left shift of the raw bits (exact); int8 codes widen exactly and the output's
// scale multiplies the finished sum. Decode is memory-bound: every step streams the whole
// weight, half (bf16) or a quarter (int8) of fp32's bytes.
//
// Work: panel groups of up to NP panels (NP * 8 outputs) split across threads
// (at::parallel_for over N); MR x NP accumulators of 8 outputs in registers (AVX2: MR = 4,
// NP = 3, 12 of the 16 ymm registers; AVX-512: MR = 8, NP = 6, two panels' 8-byte or 16-byte
// k rows joined into one zmm, 24 of the 32). Each group's panels (NP * K * 16 bytes, L2-sized) are read once
// per MR rows of x, widened to fp32 as they are read: one pass over all weights for decode
// (up to MR rows), cache-resident re-reads for more. (Widening a group once into an fp32
// buffer for many rows measured slower than re-widening here, AVX2, 8 rows.)
// Any K works (the k loop is scalar, the vector is over outputs); the N tail is the last
// panel's zero padding, stored through a small buffer.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define CBB_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CBB_AVX2 1
#endif

namespace {

constexpr int64_t kPanel = 8;  // outputs per panel, as in cpu_linear_bf16.py
#ifdef CBB_AVX512
constexpr int kMR = 8;  // rows of x per micro-kernel call: a decode batch of 8 widens once
constexpr int kNP = 6;  // panels per micro-kernel call: 3 zmm of 2 panels each
#else
constexpr int kMR = 4;  // rows of x per micro-kernel call
constexpr int kNP = 3;  // panels per micro-kernel call: 3 ymm of 1 panel each
#endif

inline float to_float(uint16_t b) {  // bf16 bits -> fp32
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float to_float(int8_t c) { return static_cast<float>(c); }

#ifdef CBB_AVX512
inline __m512 load16(const uint16_t* a, const uint16_t* b) {  // 8 bf16 of 2 panels -> 16 fp32
  const __m256i raw = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 load16(const int8_t* a, const int8_t* b) {  // 8 codes of 2 panels -> 16 fp32
  const __m128i raw = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
}
#endif

#ifdef CBB_AVX2
inline __m256 load8(const uint16_t* p) {  // 8 bf16 -> 8 fp32 (exact)
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline __m256 load8(const int8_t* p) {  // 8 int8 codes -> 8 fp32 (exact)
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
}
#endif

// Rows 0..MR-1 of x and y, the outputs of panels p0..p0+np-1 (y_ld: y's row stride; n_valid:
// outputs of this group inside N; scale: fp32 per output (int8) or null; bias: fp32 or null);
// w: all the panels. The vector paths always run NP panels (a group's missing tail panels re-read
// panel p0, results dropped) with named accumulators: GCC keeps an array of vector
// accumulators in memory, not registers.
template <int MR, typename W>
void micro(const float* x, int64_t K, const W* w, int64_t p0, int np, const float* scale,
           const float* bias, float* y, int64_t y_ld, int64_t n0, int64_t n_valid) {
  static_assert(MR >= 1 && MR <= kMR, "the tile is at most kMR rows");
  const W* wp[kNP];
  for (int j = 0; j < kNP; ++j) wp[j] = w + (p0 + (j < np ? j : 0)) * K * kPanel;
  alignas(64) float acc[kMR][kNP][kPanel];
#if defined(CBB_AVX512)
  // zmm j holds panels 2j and 2j+1: 16 outputs, so 8 rows x 3 zmm = 24 accumulators
  static_assert(kNP == 6 && kMR == 8, "8 rows x 3 zmm of 2 panels");
  const W *w0 = wp[0], *w1 = wp[1], *w2 = wp[2], *w3 = wp[3], *w4 = wp[4], *w5 = wp[5];
#define CBB_ROW_DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = c##i##0, c##i##2 = c##i##0;
  CBB_ROW_DECL(0) CBB_ROW_DECL(1) CBB_ROW_DECL(2) CBB_ROW_DECL(3)
  CBB_ROW_DECL(4) CBB_ROW_DECL(5) CBB_ROW_DECL(6) CBB_ROW_DECL(7)
#undef CBB_ROW_DECL
#define CBB_ROW_FMA(i)                                   \
  if constexpr (MR > i) {                                \
    const __m512 xv = _mm512_set1_ps(x[i * K + k]);      \
    c##i##0 = _mm512_fmadd_ps(xv, v0, c##i##0);          \
    c##i##1 = _mm512_fmadd_ps(xv, v1, c##i##1);          \
    c##i##2 = _mm512_fmadd_ps(xv, v2, c##i##2);          \
  }
  for (int64_t k = 0; k < K; ++k) {
    const int64_t o = k * kPanel;
    const __m512 v0 = load16(w0 + o, w1 + o), v1 = load16(w2 + o, w3 + o),
                 v2 = load16(w4 + o, w5 + o);
    CBB_ROW_FMA(0) CBB_ROW_FMA(1) CBB_ROW_FMA(2) CBB_ROW_FMA(3)
    CBB_ROW_FMA(4) CBB_ROW_FMA(5) CBB_ROW_FMA(6) CBB_ROW_FMA(7)
  }
#undef CBB_ROW_FMA
  const __m512 tile[kMR][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22},
                               {c30, c31, c32}, {c40, c41, c42}, {c50, c51, c52},
                               {c60, c61, c62}, {c70, c71, c72}};
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 3; ++j) _mm512_store_ps(acc[i][2 * j], tile[i][j]);
#elif defined(CBB_AVX2)
  static_assert(kNP == 3, "3 ymm of 1 panel");
  const W *w0 = wp[0], *w1 = wp[1], *w2 = wp[2];
  const float *x0 = x, *x1 = x + K, *x2 = x + 2 * K, *x3 = x + 3 * K;
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
  __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 v0 = load8(w0 + k * kPanel), v1 = load8(w1 + k * kPanel),
                 v2 = load8(w2 + k * kPanel);
    __m256 xv = _mm256_broadcast_ss(x0 + k);
    c00 = _mm256_fmadd_ps(xv, v0, c00), c01 = _mm256_fmadd_ps(xv, v1, c01);
    c02 = _mm256_fmadd_ps(xv, v2, c02);
    if constexpr (MR > 1) {
      xv = _mm256_broadcast_ss(x1 + k);
      c10 = _mm256_fmadd_ps(xv, v0, c10), c11 = _mm256_fmadd_ps(xv, v1, c11);
      c12 = _mm256_fmadd_ps(xv, v2, c12);
    }
    if constexpr (MR > 2) {
      xv = _mm256_broadcast_ss(x2 + k);
      c20 = _mm256_fmadd_ps(xv, v0, c20), c21 = _mm256_fmadd_ps(xv, v1, c21);
      c22 = _mm256_fmadd_ps(xv, v2, c22);
    }
    if constexpr (MR > 3) {
      xv = _mm256_broadcast_ss(x3 + k);
      c30 = _mm256_fmadd_ps(xv, v0, c30), c31 = _mm256_fmadd_ps(xv, v1, c31);
      c32 = _mm256_fmadd_ps(xv, v2, c32);
    }
  }
  const __m256 tile[kMR][kNP] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22},
                                 {c30, c31, c32}};
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kNP; ++j) _mm256_store_ps(acc[i][j], tile[i][j]);
#else
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kNP; ++j)
      for (int64_t c = 0; c < kPanel; ++c) acc[i][j][c] = 0.f;
  for (int64_t k = 0; k < K; ++k)
    for (int i = 0; i < MR; ++i) {
      const float xv = x[i * K + k];
      for (int j = 0; j < np; ++j)
        for (int64_t c = 0; c < kPanel; ++c)
          acc[i][j][c] += xv * to_float(wp[j][k * kPanel + c]);
    }
#endif
  for (int i = 0; i < MR; ++i) {
    float* row = y + i * y_ld + n0;
    for (int64_t n = 0; n < n_valid; ++n) {
      const float sum = acc[i][n / kPanel][n % kPanel];
      row[n] = (scale ? sum * scale[n0 + n] : sum) + (bias ? bias[n0 + n] : 0.f);
    }
  }
}

template <typename W>
using MicroFn = void (*)(const float*, int64_t, const W*, int64_t, int, const float*,
                         const float*, float*, int64_t, int64_t, int64_t);

template <typename W>
MicroFn<W> pick(int mr) {
  switch (mr) {
    case 1: return &micro<1, W>;
    case 2: return &micro<2, W>;
    case 3: return &micro<3, W>;
#ifdef CBB_AVX512
    case 4: return &micro<4, W>;
    case 5: return &micro<5, W>;
    case 6: return &micro<6, W>;
    case 7: return &micro<7, W>;
    default: return &micro<8, W>;
#else
    default: return &micro<4, W>;
#endif
  }
}

// y [M, N] = x [M, K] @ panels^T (x scale) (+ bias), threads over groups of NP panels.
template <typename W>
void run(const float* xp, int64_t M, int64_t K, const W* wp, int64_t P, int64_t N,
         const float* scale, const float* b, float* yp) {
  const int64_t groups = (P + kNP - 1) / kNP;
  // grain: about 64 KiB of weight per task, so small layers stay on one thread
  const int64_t bytes = kNP * kPanel * K * static_cast<int64_t>(sizeof(W));
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, bytes));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = g * kNP;
      const int np = static_cast<int>(std::min<int64_t>(kNP, P - p0));
      const int64_t n0 = p0 * kPanel;
      const int64_t n_valid = std::min<int64_t>(np * kPanel, N - n0);
      for (int64_t m = 0; m < M; m += kMR) {
        const int mr = static_cast<int>(std::min<int64_t>(kMR, M - m));
        pick<W>(mr)(xp + m * K, K, wp, p0, np, scale, b, yp + m * N, N, n0, n_valid);
      }
    }
  });
}

// The checks both entry points share: x [M, K] fp32, panels [P, K, 8] of `dtype`, bias.
const float* check(const char* fn, const at::Tensor& x, const at::Tensor& panels,
                   at::ScalarType dtype, const c10::optional<at::Tensor>& bias, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), fn,
              ": x must be a contiguous fp32 [M, K] tensor");
  TORCH_CHECK(panels.dim() == 3 && panels.scalar_type() == dtype && panels.is_contiguous() &&
                  panels.size(2) == kPanel,
              fn, ": panels must be contiguous ", c10::toString(dtype), " [P, K, 8]");
  const int64_t K = x.size(1), P = panels.size(0);
  TORCH_CHECK(panels.size(1) == K, fn, ": x has K=", K, ", panels ", panels.size(1));
  TORCH_CHECK(N >= 1 && (N + kPanel - 1) / kPanel == P, fn, ": N=", N, " needs ",
              (N + kPanel - 1) / kPanel, " panels, got ", P);
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N,
              fn, ": bias must be contiguous fp32 [N]");
  return bias->data_ptr<float>();
}

}  // namespace

// x [M, K] fp32, panels [P, K, 8] bf16 (from `pack`), bias [N] fp32 or None -> y [M, N] fp32.
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& panels,
                       const c10::optional<at::Tensor>& bias, int64_t N) {
  const float* b = check("linear_bf16", x, panels, at::kBFloat16, bias, N);
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return y;
  const auto* wp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
  run<uint16_t>(x.data_ptr<float>(), x.size(0), x.size(1), wp, panels.size(0), N, nullptr, b,
                y.data_ptr<float>());
  return y;
}

// x [M, K] fp32, panels [P, K, 8] int8 codes (from `pack_int8`), scales [N] fp32, bias [N]
// fp32 or None -> y [M, N] fp32: y[m, n] = scales[n] * sum_k x[m, k] * codes[n, k] + bias[n].
at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& scales,
                       const c10::optional<at::Tensor>& bias, int64_t N) {
  const float* b = check("linear_int8", x, panels, at::kChar, bias, N);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
                  scales.numel() == N,
              "linear_int8: scales must be contiguous fp32 [N]");
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return y;
  run<int8_t>(x.data_ptr<float>(), x.size(0), x.size(1), panels.data_ptr<int8_t>(),
              panels.size(0), N, scales.data_ptr<float>(), b, y.data_ptr<float>());
  return y;
}

// Which code path this build compiled: "avx512", "avx2" or "scalar" (for describe() and the
// tests).
std::string isa() {
#if defined(CBB_AVX512)
  return "avx512";
#elif defined(CBB_AVX2)
  return "avx2";
#else
  return "scalar";
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_bf16", &linear_bf16,
        "x [M, K] fp32, panels [ceil(N/8), K, 8] bf16, bias [N] fp32 or None, N -> [M, N] fp32",
        py::arg("x"), py::arg("panels"), py::arg("bias"), py::arg("N"),
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_int8", &linear_int8,
        "x [M, K] fp32, panels [ceil(N/8), K, 8] int8, scales [N] fp32, bias [N] fp32 or None, "
        "N -> [M, N] fp32",
        py::arg("x"), py::arg("panels"), py::arg("scales"), py::arg("bias"), py::arg("N"),
        py::call_guard<py::gil_scoped_release>());
  m.def("isa", &isa, "the instruction set the kernel was compiled for");
}
