// Random sampling of a step's rows at a temperature (no top-k / top-p) in one pass set per
// row, instead of the torch path's divide, softmax, fp64 cast, cumsum and searchsorted over
// [rows, vocab] (~1.8 ms a step at 8 x 32k on one thread; this: ~15 us a row, three reads).
//
// The draw is the torch path's inverse CDF: weights w_i = exp(x_i / T - max) (the softmax
// without its normalisation, which does not move the draw), summed in fp64; the token is
// the first index whose running sum reaches (1 - u) * the row's sum. The running sum is
// kept per 64-wide block (block sums in fp64, added in order), then element by element in
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

constexpr int64_t kBlock = 64;  // elements per fp64 running-sum block (four vectors)

// x[i..i+16) / temp (as torch's logits / temperature, in fp32), lanes past V at -inf
inline __m512 scaled(const float* x, int64_t i, int64_t V, const __m512 tv, bool scale) {
  const __mmask16 k = V - i >= 16 ? 0xFFFF : V - i <= 0 ? 0 : static_cast<__mmask16>((1u << (V - i)) - 1);
  const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);
  return scale ? _mm512_div_ps(v, tv) : v;
}

inline __m512d widen_sum(__m512 e) {  // the 16 lanes as two fp64 halves, added lane-wise
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
  const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
  return _mm512_add_pd(lo, hi);
}

// One row: the drawn index, or -1 where the row has a NaN, a +inf or no finite logit
// (the caller draws those rows with torch). Weights are recomputed, never stored: the
// crossing block's 64 are computed again by the same instructions, so they are the same.
int64_t draw(const float* x, int64_t V, float temp, double u, double* bsum) {
  const bool scale = temp != 1.f;
  const __m512 tv = _mm512_set1_ps(temp);
  __m512 mv = _mm512_set1_ps(-INFINITY);
  __mmask16 bad = 0;
  for (int64_t i = 0; i < V; i += 16) {
    const __m512 v = scaled(x, i, V, tv, scale);
    bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    mv = _mm512_max_ps(mv, v);
  }
  const float m = _mm512_reduce_max_ps(mv);
  if (bad || std::isinf(m)) return -1;
  const __m512 mb = _mm512_set1_ps(m);
  const int64_t nb = (V + kBlock - 1) / kBlock;
  double total = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i = b * kBlock;
    __m512d acc = widen_sum(cbb::exp16_nonpos(_mm512_sub_ps(scaled(x, i, V, tv, scale), mb)));
    acc = _mm512_add_pd(acc, widen_sum(cbb::exp16_nonpos(_mm512_sub_ps(scaled(x, i + 16, V, tv, scale), mb))));
    acc = _mm512_add_pd(acc, widen_sum(cbb::exp16_nonpos(_mm512_sub_ps(scaled(x, i + 32, V, tv, scale), mb))));
    acc = _mm512_add_pd(acc, widen_sum(cbb::exp16_nonpos(_mm512_sub_ps(scaled(x, i + 48, V, tv, scale), mb))));
    bsum[b] = _mm512_reduce_add_pd(acc);
    total += bsum[b];
  }
  const double target = (1.0 - u) * total;  // in (0, total]: u in [0, 1)
  double acc = 0.0;
  alignas(64) float w[kBlock];
  for (int64_t b = 0; b < nb; ++b) {
    if (acc + bsum[b] < target) {
      acc += bsum[b];
      continue;
    }
    const int64_t i0 = b * kBlock;
    for (int64_t j = 0; j < kBlock; j += 16)
      _mm512_store_ps(w + j, cbb::exp16_nonpos(_mm512_sub_ps(scaled(x, i0 + j, V, tv, scale), mb)));
    int64_t last = -1;
    for (int64_t j = 0; j < kBlock && i0 + j < V; ++j) {
      if (w[j] == 0.f) continue;
      last = i0 + j;
      acc += w[j];
      if (acc >= target) return last;
    }
    if (last >= 0) return last;  // the block's sum reached the target, its elements by rounding not
  }
  return -1;  // unreachable: the last block with weight holds the target (callers use torch)
}

}  // namespace

// x [N, V] fp32 contiguous; rows (rows of x to draw from), temps (> 0), u (in [0, 1)), one
// each per draw -> a token per draw, -1 where the row cannot be drawn here.
std::vector<int64_t> sample_rows(const at::Tensor& x, const std::vector<int64_t>& rows,
                                 const std::vector<double>& temps, const std::vector<double>& u) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.size(1) > 0,
              "sample_rows: x must be contiguous 2-D fp32 with at least one column");
  const int64_t R = static_cast<int64_t>(rows.size()), N = x.size(0), V = x.size(1);
  TORCH_CHECK(temps.size() == rows.size() && u.size() == rows.size(),
              "sample_rows: one temperature and one u per row");
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(rows[r] >= 0 && rows[r] < N, "sample_rows: row ", rows[r], " out of range");
    TORCH_CHECK(temps[r] > 0.0 && u[r] >= 0.0 && u[r] < 1.0,
                "sample_rows: temperature must be > 0 and u in [0, 1)");
  }
  std::vector<int64_t> out(R);
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> bsum((V + kBlock - 1) / kBlock);
    for (int64_t r = begin; r < end; ++r)  // temperature rounded to fp32, as torch.tensor does
      out[r] = draw(xp + rows[r] * V, V, static_cast<float>(temps[r]), u[r], bsum.data());
  });
  return out;
}
