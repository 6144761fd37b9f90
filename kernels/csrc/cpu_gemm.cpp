// fp32 projections y = x @ W^T (+ bias) for AVX-512 CPUs, tuned for few rows (decode).
//
// W [N, K] is packed once into panels [NP][K][32]: panel n holds outputs 32n..32n+31, and
// for each k their 32 weights lie in one 128-byte run, so a panel is one sequential stream.
// The micro-kernel keeps MR <= 8 rows x 32 outputs of accumulators in 16 zmm registers and,
// per k, loads the panel's two vectors once and FMAs them with each row's broadcast x[m, k].
// Threads split the panels; each thread runs every m-block of a panel while it is in
// L1/L2, so a decode step (M <= 16) reads each weight from memory once.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#ifndef __AVX512F__
#error "cpu_gemm needs AVX-512F (built with -march=native)"
#endif

namespace {

constexpr int64_t kPanel = 32;  // outputs per panel (two zmm)
constexpr int kMR = 12;         // most rows per micro-kernel call (24 accumulators)
constexpr int kDecodeMR = 8;    // rows per call when M <= 16: 16 accumulators, one pass
#ifndef CBBENCH_PREFETCH_K
// k steps ahead, into L2 (64 x 128 B = 8 KB). With the weights on 2 MiB pages
// (reference_engine/execution/hugepages.py) the 37 linears of `small` at 8 rows, cold, one
// thread: 16 ahead into L1 8.97-9.09 ms, 64 ahead into L2 8.03-8.31 (256: 8.17-8.34); 1 row
// and 64 rows unchanged within the noise.
#define CBBENCH_PREFETCH_K 64
#endif
// Software prefetch only for tiles of 8 or more rows: below that a tile is a pure stream the
// hardware prefetcher keeps up with, and the prefetches cost more than they saved (the 37
// linears of `small`, cold, huge pages, one thread: 1 row 8.0 -> 7.4 ms, 2-3 rows 9.5-9.8 ->
// 7.2-7.4, 4-5 rows 9.8 -> 7.0-8.1 without them; 8 rows unchanged, where they stay).
constexpr int kPrefetchMinRows = 8;
#ifndef CBBENCH_M_BLOCK
#define CBBENCH_M_BLOCK 256     // rows per outer block: x block stays in L2 across panels
#endif

using Micro = void (*)(const float*, int64_t, const float*, int64_t, const float*, float*,
                       int64_t, const float*, __mmask16, __mmask16);

template <int MR>
void micro(const float* x, int64_t ldx, const float* p, int64_t K, const float* bias,
           float* y, int64_t ldy, const float* res, __mmask16 mask0, __mmask16 mask1) {
  __m512 a[MR], b[MR];
  const __m512 bias0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  const __m512 bias1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    a[r] = bias0;
    b[r] = bias1;
  }
  for (int64_t k = 0; k < K; ++k) {
    const float* pk = p + k * kPanel;
    // Past the panel's end this reads ahead into the next panel; prefetches never fault.
    if constexpr (MR >= kPrefetchMinRows) {
      _mm_prefetch(reinterpret_cast<const char*>(pk + CBBENCH_PREFETCH_K * kPanel), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(pk + CBBENCH_PREFETCH_K * kPanel + 16),
                   _MM_HINT_T1);
    }
    const __m512 w0 = _mm512_loadu_ps(pk);
    const __m512 w1 = _mm512_loadu_ps(pk + 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
      a[r] = _mm512_fmadd_ps(xv, w0, a[r]);
      b[r] = _mm512_fmadd_ps(xv, w1, b[r]);
    }
  }
  if (res) {  // + residual [.., ldy], after the sum: bitwise (x @ W^T + bias) + residual
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      a[r] = _mm512_add_ps(a[r], _mm512_maskz_loadu_ps(mask0, res + r * ldy));
      b[r] = _mm512_add_ps(b[r], _mm512_maskz_loadu_ps(mask1, res + r * ldy + 16));
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, mask0, a[r]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, mask1, b[r]);
  }
}

constexpr Micro kMicro[kMR + 1] = {nullptr,  micro<1>, micro<2>,  micro<3>,  micro<4>,
                                   micro<5>, micro<6>, micro<7>,  micro<8>,  micro<9>,
                                   micro<10>, micro<11>, micro<12>};

__mmask16 lanes(int64_t n) {  // the first n (clamped to 0..16) lanes
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

}  // namespace

// W [N, K] fp32 -> panels [ceil(N / 32), K, 32], outputs past N zero.
at::Tensor pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "pack: W must be 2-D fp32");
  const int64_t N = w.size(0), K = w.size(1), NP = (N + kPanel - 1) / kPanel;
  auto padded = at::zeros({NP * kPanel, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  return padded.view({NP, kPanel, K}).transpose(1, 2).contiguous();
}

// x [M, K] fp32 contiguous, panels from pack(), bias: none or [NP * 32] (zero past N),
// residual: none or [M, N] fp32 contiguous, added to the output (the residual stream).
at::Tensor linear(const at::Tensor& x, const at::Tensor& panels,
                     const c10::optional<at::Tensor>& bias, int64_t N,
                     const c10::optional<at::Tensor>& residual) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "linear: x must be contiguous 2-D fp32");
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == kPanel && panels.is_contiguous() &&
                  panels.scalar_type() == at::kFloat,
              "linear: panels must come from pack()");
  const int64_t M = x.size(0), K = x.size(1), NP = panels.size(0);
  TORCH_CHECK(panels.size(1) == K, "linear: x has ", K, " columns, W ", panels.size(1));
  TORCH_CHECK(N > (NP - 1) * kPanel && N <= NP * kPanel, "linear: N does not fit the panels");
  const float* bp = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == NP * kPanel &&
                    bias->scalar_type() == at::kFloat,
                "linear: bias must be fp32 [NP * 32]");
    bp = bias->data_ptr<float>();
  }
  const float* rp = nullptr;
  if (residual.has_value()) {
    TORCH_CHECK(residual->is_contiguous() && residual->scalar_type() == at::kFloat &&
                    residual->dim() == 2 && residual->size(0) == M && residual->size(1) == N,
                "linear: residual must be contiguous fp32 [M, N]");
    rp = residual->data_ptr<float>();
  }
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const float* xp = x.data_ptr<float>();
  const float* pp = panels.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t tail = N - (NP - 1) * kPanel;  // outputs in the last panel, 1..32
  const int64_t mr = M <= 16 ? kDecodeMR : kMR;
  for (int64_t mc = 0; mc < M; mc += CBBENCH_M_BLOCK) {
    const int64_t mc_end = std::min<int64_t>(M, mc + CBBENCH_M_BLOCK);
    at::parallel_for(0, NP, 1, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const bool last = n == NP - 1;
        const __mmask16 m0 = last ? lanes(tail) : lanes(16);
        const __mmask16 m1 = last ? lanes(tail - 16) : lanes(16);
        const float* pn = pp + n * K * kPanel;
        const float* bn = bp ? bp + n * kPanel : nullptr;
        for (int64_t m = mc; m < mc_end; m += mr) {
          const int64_t rows = std::min<int64_t>(mr, mc_end - m);
          kMicro[rows](xp + m * K, K, pn, K, bn, yp + m * N + n * kPanel, N,
                       rp ? rp + m * N + n * kPanel : nullptr, m0, m1);
        }
      }
    });
  }
  return y;
}
