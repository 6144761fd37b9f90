// fp32 paged decode attention for AVX-512 CPUs: one query token per sequence, K/V read in
// place through the block table (no gather, no copy), one call per layer.
//
// Work item = one sequence (its KV heads split in ranges only when there are fewer sequences
// than threads): a token's K (or V) row of all heads is Hkv * D contiguous floats, read whole
// and once. Two passes over the context, each reading one cache once:
//   1. scores s[j][t] = scale * q_j . k_t[head of j]   (K streamed, Hq dot products per row)
//   2. out_j = sum_t softmax(s_j)[t] * v_t[head of j]  (V streamed, Hq FMAs of D per row)
// GQA: the G = Hq / Hkv query heads of a KV head read the same row slice. The scores
// (Hq x L floats) and the outputs stay in L1/L2; the next row is prefetched.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <limits>
#include <vector>

#ifndef __AVX512F__
#error "cpu_attention needs AVX-512F (built with -march=native)"
#endif

namespace {

inline float dot(const float* a, const float* b, int64_t d) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < d) {
    const __mmask16 m = static_cast<__mmask16>((1u << (d - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

inline void axpy(float p, const float* x, float* y, int64_t d) {  // y += p * x
  const __m512 pv = _mm512_set1_ps(p);
  int64_t i = 0;
  for (; i + 16 <= d; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(pv, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < d) {
    const __mmask16 m = static_cast<__mmask16>((1u << (d - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(m, x + i),
                                          _mm512_maskz_loadu_ps(m, y + i)));
  }
}

inline void prefetch_row(const float* p, int64_t d) {
  for (int64_t i = 0; i < d; i += 16) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

}  // namespace

// q [B, Hq, D] fp32 contiguous; k_cache, v_cache [NB, BS, Hkv, D] fp32 contiguous;
// block_tables [B, MB] int32; seq_lens [B] int32 (context length including this token).
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                     const at::Tensor& v_cache,
                                     const at::Tensor& block_tables,
                                     const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(),
              "paged_decode_attention: q must be contiguous [B, Hq, D] fp32");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "paged_decode_attention: caches must be contiguous [NB, BS, Hkv, D] fp32");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt &&
                  block_tables.is_contiguous(),
              "paged_decode_attention: block_tables must be contiguous [B, MB] int32");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kInt &&
                  seq_lens.is_contiguous(),
              "paged_decode_attention: seq_lens must be contiguous [B] int32");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t NB = k_cache.size(0), BS = k_cache.size(1), Hkv = k_cache.size(2);
  const int64_t MB = block_tables.size(1);
  TORCH_CHECK(k_cache.size(3) == D, "paged_decode_attention: head_dim of q and cache differ");
  TORCH_CHECK(Hq % Hkv == 0, "paged_decode_attention: Hq must be a multiple of Hkv");
  TORCH_CHECK(block_tables.size(0) == B && seq_lens.size(0) == B,
              "paged_decode_attention: one block-table row and one length per sequence");
  const int64_t G = Hq / Hkv;
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= MB * BS, "paged_decode_attention: sequence ", b,
                " has length ", lens[b], " for ", MB, " blocks of ", BS);
    for (int64_t j = 0; j < (lens[b] + BS - 1) / BS; ++j) {
      const int32_t blk = tables[b * MB + j];
      TORCH_CHECK(blk >= 0 && blk < NB, "paged_decode_attention: block ", blk,
                  " outside the pool of ", NB);
    }
  }
  auto out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  // Split a sequence's KV heads only when there are fewer sequences than threads.
  const int64_t threads = at::get_num_threads();
  const int64_t split = std::min<int64_t>(Hkv, std::max<int64_t>(1, (threads + B - 1) / B));
  const int64_t per = (Hkv + split - 1) / split;
  at::parallel_for(0, B * split, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / split, h0 = (item % split) * per;
      const int64_t h1 = std::min(Hkv, h0 + per), L = lens[b];
      if (h0 >= h1) continue;
      const int64_t nq = (h1 - h0) * G;  // query heads of this item, consecutive in q
      const int32_t* table = tables + b * MB;
      const float* qb = qp + (b * Hq + h0 * G) * D;
      float* ob = op + (b * Hq + h0 * G) * D;
      scores.resize(static_cast<size_t>(nq * L));
      float* s = scores.data();
      auto row_at = [&](const float* cache, int64_t t) {  // token t's heads h0.. of one cache
        return cache + ((static_cast<int64_t>(table[t / BS]) * BS + t % BS) * Hkv + h0) * D;
      };
      for (int64_t t = 0; t < L; ++t) {  // pass 1: scores, K read once
        const float* k = row_at(kp, t);
        if (t + 1 < L) prefetch_row(row_at(kp, t + 1), (h1 - h0) * D);
        for (int64_t j = 0; j < nq; ++j) s[j * L + t] = sc * dot(qb + j * D, k + (j / G) * D, D);
      }
      for (int64_t j = 0; j < nq; ++j) {  // softmax per query head
        float* sj = s + j * L;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < L; ++t) m = std::max(m, sj[t]);
        float sum = 0.f;
        for (int64_t t = 0; t < L; ++t) {
          sj[t] = std::exp(sj[t] - m);
          sum += sj[t];
        }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < L; ++t) sj[t] *= inv;
      }
      std::fill(ob, ob + nq * D, 0.f);
      for (int64_t t = 0; t < L; ++t) {  // pass 2: weighted V, V read once
        const float* v = row_at(vp, t);
        if (t + 1 < L) prefetch_row(row_at(vp, t + 1), (h1 - h0) * D);
        for (int64_t j = 0; j < nq; ++j) axpy(s[j * L + t], v + (j / G) * D, ob + j * D, D);
      }
    }
  });
  return out;
}
