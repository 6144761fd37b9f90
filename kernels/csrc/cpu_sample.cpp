// Random sampling of a step's rows at a temperature (no top-k / top-p) in one pass set per
// row, instead of the torch path's divide, softmax, fp64 cast, cumsum and searchsorted over
// [rows, vocab] (~1 ms a step at 8 x 32k on one thread; this: ~25 us a row).
//
// The draw is the torch path's inverse CDF: weights w_i = exp(x_i / T - max) (the softmax
// without its normalisation, which does not move the draw), summed in fp64; the token is
// the first index whose running sum reaches (1 - u) * the row's sum. The running sum is
// kept per 16-wide block (block sums in fp64, added in order), then element by element in
// the block that crosses: the pick equals the torch path's except where the target lies
// within rounding of a boundary. A weight of 0 (a -inf logit, or one 104 below the maximum)
// is never picked: the target is > 0, so the first index reaching it has a positive weight.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "vec_math.h"

namespace {

// One row: the drawn index, or -1 where the row has a NaN, a +inf or no finite logit
// (the caller draws those rows with torch).
int64_t draw(const float* x, int64_t V, float temp, double u, float* w, double* bsum) {
  const bool scale = temp != 1.f;
  const __m512 tv = _mm512_set1_ps(temp);
  __m512 mv = _mm512_set1_ps(-INFINITY);
  __mmask16 bad = 0;
  const int64_t nb = (V + 15) / 16;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i = b * 16;
    const __mmask16 k = V - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (V - i)) - 1);
    __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);
    if (scale) v = _mm512_div_ps(v, tv);  // as torch's logits / temperature, in fp32
    bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    _mm512_storeu_ps(w + i, v);
    mv = _mm512_max_ps(mv, v);
  }
  const float m = _mm512_reduce_max_ps(mv);
  if (bad || std::isinf(m)) return -1;
  const __m512 mb = _mm512_set1_ps(m);
  double total = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 e = cbb::exp16_nonpos(_mm512_sub_ps(_mm512_loadu_ps(w + b * 16), mb));
    _mm512_storeu_ps(w + b * 16, e);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    bsum[b] = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
    total += bsum[b];
  }
  const double target = (1.0 - u) * total;  // in (0, total]: u in [0, 1)
  double acc = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    if (acc + bsum[b] < target) {
      acc += bsum[b];
      continue;
    }
    int64_t last = -1;
    for (int64_t i = b * 16; i < std::min(V, b * 16 + 16); ++i) {
      if (w[i] == 0.f) continue;
      last = i;
      acc += w[i];
      if (acc >= target) return i;
    }
    if (last >= 0) return last;  // the block's sum reached the target, its elements by rounding not
  }
  for (int64_t i = V - 1; i >= 0; --i)  // rounding left the target past the end
    if (w[i] > 0.f) return i;
  return -1;
}

}  // namespace

// x [N, V] fp32 contiguous; rows [R] int64 (rows of x to draw from); temps [R] fp32 > 0;
// u [R] fp64 in [0, 1) -> int64 [R]: a token per row, -1 where the row cannot be drawn here.
at::Tensor sample_rows(const at::Tensor& x, const at::Tensor& rows, const at::Tensor& temps,
                       const at::Tensor& u) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.size(1) > 0,
              "sample_rows: x must be contiguous 2-D fp32 with at least one column");
  const int64_t R = rows.numel(), N = x.size(0), V = x.size(1);
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.is_contiguous(), "sample_rows: rows int64");
  TORCH_CHECK(temps.scalar_type() == at::kFloat && temps.is_contiguous() && temps.numel() == R,
              "sample_rows: temps [R] fp32");
  TORCH_CHECK(u.scalar_type() == at::kDouble && u.is_contiguous() && u.numel() == R,
              "sample_rows: u [R] fp64");
  auto out = at::empty({R}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  const int64_t* rp = rows.data_ptr<int64_t>();
  const float* tp = temps.data_ptr<float>();
  const double* up = u.data_ptr<double>();
  int64_t* op = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(rp[r] >= 0 && rp[r] < N, "sample_rows: row ", rp[r], " out of range");
    TORCH_CHECK(tp[r] > 0.f && up[r] >= 0.0 && up[r] < 1.0,
                "sample_rows: temperature must be > 0 and u in [0, 1)");
  }
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    const int64_t nb = (V + 15) / 16;
    std::vector<float> w(nb * 16);
    std::vector<double> bsum(nb);
    for (int64_t r = begin; r < end; ++r)
      op[r] = draw(xp + rp[r] * V, V, tp[r], up[r], w.data(), bsum.data());
  });
  return out;
}
