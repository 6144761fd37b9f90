// Small fp32 row ops of a CPU decode step, each one call instead of a chain of torch ops
// (F.rms_norm on [8, 512] runs pow, mean, add, rsqrt and two muls: ~65 us; this: a few us).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "vec_math.h"

#ifndef __AVX512F__
#error "cpu_ops needs AVX-512F (built with -march=native)"
#endif

namespace {

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

}  // namespace

// y = x / sqrt(mean(x^2) + eps) * weight, per row; x [N, H] fp32 contiguous, weight [H].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "rms_norm: x must be contiguous 2-D fp32");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) &&
                  weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "rms_norm: weight must be fp32 [H]");
  const int64_t N = x.size(0), H = x.size(1);
  auto y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* r = xp + n * H;
      float* o = yp + n * H;
      __m512 acc = _mm512_setzero_ps();
      int64_t i = 0;
      for (; i + 16 <= H; i += 16) {
        const __m512 v = _mm512_loadu_ps(r + i);
        acc = _mm512_fmadd_ps(v, v, acc);
      }
      if (i < H) {
        const __m512 v = _mm512_maskz_loadu_ps(tail_mask(H - i), r + i);
        acc = _mm512_fmadd_ps(v, v, acc);
      }
      const float inv = 1.f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(H) + e);
      const __m512 s = _mm512_set1_ps(inv);
      for (i = 0; i + 16 <= H; i += 16)
        _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(r + i), s),
                                              _mm512_loadu_ps(wp + i)));
      if (i < H) {
        const __mmask16 m = tail_mask(H - i);
        _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, r + i), s),
                                                      _mm512_maskz_loadu_ps(m, wp + i)));
      }
    }
  });
  return y;
}

// Index of each row's largest value, the first one on ties, the first NaN if the row has
// one (torch.argmax's rules); x [N, V] fp32 contiguous -> int64 [N].
at::Tensor argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.size(1) > 0,
              "argmax_rows: x must be contiguous 2-D fp32 with at least one column");
  const int64_t N = x.size(0), V = x.size(1);
  auto out = at::empty({N}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* r = xp + n * V;
      __m512 best = _mm512_set1_ps(-INFINITY);
      __mmask16 nan = 0;
      int64_t i = 0;
      for (; i + 16 <= V && !nan; i += 16) {
        const __m512 v = _mm512_loadu_ps(r + i);
        nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        best = _mm512_max_ps(best, v);
      }
      float m = _mm512_reduce_max_ps(best);
      int64_t start = nan ? i - 16 : i;
      int64_t found = -1;
      for (int64_t j = start; j < V; ++j) {  // the tail, or from the first NaN's vector on
        if (std::isnan(r[j])) { found = j; break; }
        if (r[j] > m) m = r[j];
      }
      if (found < 0) {  // no NaN: the first index holding the maximum
        for (int64_t j = 0; j < V; ++j)
          if (r[j] == m) { found = j; break; }
      }
      op[n] = found;
    }
  });
  return out;
}

// Rotary embedding of q and k (half-split layout, as HF's rotate_half) and the KV-cache write
// of one layer, in one pass over the fused projection's output:
//   qkv [T, (Hq + 2 Hkv) * D] fp32 contiguous (q | k | v columns), cos/sin [T, D/2],
//   caches [NB, BS, Hkv, D] fp32 contiguous, slots [T] int64 (< 0: padding, not written).
// Returns the rotated q [T, Hq, D]; rotated k and v go into their slots.
at::Tensor rope_and_cache(const at::Tensor& qkv, const at::Tensor& cos,
                             const at::Tensor& sin, at::Tensor& k_cache,
                             at::Tensor& v_cache, const at::Tensor& slots, int64_t Hq,
                             int64_t Hkv, int64_t D) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous() &&
                  qkv.size(1) == (Hq + 2 * Hkv) * D,
              "rope_and_cache: qkv must be contiguous fp32 [T, (Hq + 2 Hkv) * D]");
  const int64_t T = qkv.size(0), half = D / 2;
  TORCH_CHECK(D % 2 == 0, "rope_and_cache: head_dim must be even");
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == T && cos.size(1) == half && cos.is_contiguous() &&
                  sin.sizes() == cos.sizes() && sin.is_contiguous() &&
                  cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "rope_and_cache: cos/sin must be contiguous fp32 [T, D/2]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(2) == Hkv && k_cache.size(3) == D &&
                  k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "rope_and_cache: caches must be contiguous fp32 [NB, BS, Hkv, D]");
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == T && slots.scalar_type() == at::kLong &&
                  slots.is_contiguous(),
              "rope_and_cache: slots must be contiguous int64 [T]");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(sp[t] < num_slots, "rope_and_cache: slot ", sp[t], " outside the cache of ",
                num_slots);
  auto q = at::empty({T, Hq, D}, qkv.options());
  const float* in = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* snp = sin.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const int64_t width = (Hq + 2 * Hkv) * D;
  auto rotate = [&](const float* x, const float* c, const float* s, float* y) {
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = x[i], x2 = x[half + i];
      y[i] = x1 * c[i] - x2 * s[i];
      y[half + i] = x2 * c[i] + x1 * s[i];
    }
  };
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = in + t * width;
      const float* c = cp + t * half;
      const float* s = snp + t * half;
      for (int64_t h = 0; h < Hq; ++h) rotate(row + h * D, c, s, qp + (t * Hq + h) * D);
      if (sp[t] < 0) continue;
      float* kdst = kc + sp[t] * Hkv * D;
      float* vdst = vc + sp[t] * Hkv * D;
      for (int64_t h = 0; h < Hkv; ++h) rotate(row + (Hq + h) * D, c, s, kdst + h * D);
      std::memcpy(vdst, row + (Hq + Hkv) * D, sizeof(float) * Hkv * D);
    }
  });
  return q;
}

// silu(gate) * up of a fused gate|up projection, one pass: gu [M, 2I] fp32 contiguous (gate
// columns, then up) -> [M, I]. silu(g) = g / (1 + exp(-g)) as torch writes it; the exp is
// vec_math.h's (~1 ulp), so values are torch's F.silu(gate) * up within a few ulp.
at::Tensor silu_mul(const at::Tensor& gu, int64_t I) {
  TORCH_CHECK(gu.dim() == 2 && gu.scalar_type() == at::kFloat && gu.is_contiguous() &&
                  I > 0 && gu.size(1) == 2 * I,
              "silu_mul: gu must be contiguous fp32 [M, 2 * I]");
  const int64_t M = gu.size(0);
  auto out = at::empty({M, I}, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const __m512 one = _mm512_set1_ps(1.f);
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float* g = gp + m * 2 * I;
      const float* u = g + I;
      float* o = op + m * I;
      for (int64_t i = 0; i < I; i += 16) {
        const __mmask16 k = I - i >= 16 ? 0xFFFF : tail_mask(I - i);
        const __m512 gv = _mm512_maskz_loadu_ps(k, g + i);
        const __m512 e = cbb::exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(o + i, k, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, u + i)));
      }
    }
  });
  return out;
}
