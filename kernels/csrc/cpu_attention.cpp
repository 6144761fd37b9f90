// Paged decode attention for AVX-512 CPUs over an fp32 or a bf16 KV cache: one query token
// per sequence, K/V read in place through the block table (no gather, no copy), one call per
// layer. The query, the scores and the output are fp32; a bf16 row is widened to fp32 in
// registers as it is read (bf16 is fp32's upper half), so a bf16 cache streams half the bytes.
//
// Work item = one sequence (its KV heads split in ranges only when there are fewer sequences
// than threads): a token's K (or V) row of all heads is Hkv * D contiguous floats, read whole
// and once. Two passes over the context, each reading one cache once:
//   1. scores s[j][t] = scale * q_j . k_t[head of j]   (K streamed, Hq dot products per row)
//   2. out_j = sum_t softmax(s_j)[t] * v_t[head of j]  (V streamed, Hq FMAs of D per row)
// Pass 1 takes 16 tokens at a time (16 dot products summed by one transpose-and-add tree);
// the softmax is vectorized (a polynomial exp within ~1 ulp of expf).
// GQA: the G = Hq / Hkv query heads of a KV head read the same row slice. The scores
// (Hq x L floats) and the outputs stay in L1/L2; rows ahead are prefetched into L2.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vec_math.h"

#ifndef __AVX512F__
#error "cpu_attention needs AVX-512F (built with -march=native)"
#endif

namespace {

// 16 cache elements as fp32: a plain load, or bf16 widened (its bits are fp32's upper half)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
template <typename T>
inline __m512 load_tail(const T* p, int64_t r) {  // r < 16 elements, the rest zero
  alignas(64) float buf[16] = {};
  for (int64_t i = 0; i < r; ++i) buf[i] = static_cast<float>(p[i]);
  return _mm512_load_ps(buf);
}

template <typename T>
inline float dot(const float* a, const T* b, int64_t d) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i), acc);
  if (i < d) {
    const __mmask16 m = static_cast<__mmask16>((1u << (d - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load_tail(b + i, d - i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

template <typename T>
inline void axpy(float p, const T* x, float* y, int64_t d) {  // y += p * x
  const __m512 pv = _mm512_set1_ps(p);
  int64_t i = 0;
  for (; i + 16 <= d; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(pv, load16(x + i), _mm512_loadu_ps(y + i)));
  if (i < d) {
    const __mmask16 m = static_cast<__mmask16>((1u << (d - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_fmadd_ps(pv, load_tail(x + i, d - i),
                                          _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// Lane i = the sum of v[i]'s 16 lanes (a transpose-and-add tree: 30 shuffles and adds for
// 16 dot products where 16 separate horizontal sums took ~5x as many).
inline __m512 hsum16(const __m512* v) {
  __m512 x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[i], v[i + 8], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 4; ++i)
    y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[i], x[i + 4], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x[i], x[i + 4], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)
    z[i] = _mm512_add_ps(_mm512_unpacklo_ps(y[i], y[i + 2]), _mm512_unpackhi_ps(y[i], y[i + 2]));
  const __m512 r = _mm512_add_ps(_mm512_unpacklo_ps(z[0], z[1]), _mm512_unpackhi_ps(z[0], z[1]));
  // 128-bit lanes now hold v0-3, v8-11, v4-7, v12-15
  return _mm512_shuffle_f32x4(r, r, _MM_SHUFFLE(3, 1, 2, 0));
}

// q . rows[i] for 16 rows of d elements -> lane i
template <typename T>
inline __m512 dot16(const float* q, const T* const* rows, int64_t d) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  int64_t e = 0;
  for (; e + 16 <= d; e += 16) {
    const __m512 qv = _mm512_loadu_ps(q + e);
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(qv, load16(rows[i] + e), acc[i]);
  }
  if (e < d) {
    const __mmask16 m = static_cast<__mmask16>((1u << (d - e)) - 1);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + e);
    for (int i = 0; i < 16; ++i)
      acc[i] = _mm512_fmadd_ps(qv, load_tail(rows[i] + e, d - e), acc[i]);
  }
  return hsum16(acc);
}


// s[0..L) <- softmax(s), vectorized (the scalar loop's expf was ~1/3 of a decode layer's
// attention at 128 tokens)
inline void softmax(float* s, int64_t L) {
  __m512 mv = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t t = 0;
  for (; t + 16 <= L; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + t));
  float m = _mm512_reduce_max_ps(mv);
  for (; t < L; ++t) m = std::max(m, s[t]);
  const __m512 mb = _mm512_set1_ps(m);
  __m512 sv = _mm512_setzero_ps();
  for (t = 0; t + 16 <= L; t += 16) {
    const __m512 e = cbb::exp16_nonpos(_mm512_sub_ps(_mm512_loadu_ps(s + t), mb));
    _mm512_storeu_ps(s + t, e);
    sv = _mm512_add_ps(sv, e);
  }
  if (t < L) {
    const __mmask16 k = static_cast<__mmask16>((1u << (L - t)) - 1);
    const __m512 e = cbb::exp16_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), mb));
    _mm512_mask_storeu_ps(s + t, k, e);
    sv = _mm512_add_ps(sv, _mm512_maskz_mov_ps(k, e));
  }
  const float inv = 1.f / _mm512_reduce_add_ps(sv);
  const __m512 iv = _mm512_set1_ps(inv);
  for (t = 0; t + 16 <= L; t += 16) _mm512_storeu_ps(s + t, _mm512_mul_ps(_mm512_loadu_ps(s + t), iv));
  for (; t < L; ++t) s[t] *= inv;
}

// Software prefetch into L2, this many tokens ahead: a sequence's blocks lie anywhere in the
// pool, so the hardware prefetcher restarts at every block (16 tokens); one row ahead into L1
// (as before) left the B=8 step's attention at ~10 GB/s. 32 K / 16 V tokens ahead: 9 layers
// of B=8 x 128 tokens, caches cold, one thread: bf16 1.98 -> 1.51 ms, fp32 2.49 -> 2.09 ms.
constexpr int64_t kPrefetchK = 32;
constexpr int64_t kPrefetchV = 16;

inline void prefetch_row(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T1);
}

template <typename T>
void decode_kernel(const float* qp, const T* kp, const T* vp, float* op, const int32_t* lens,
                   const int32_t* tables, int64_t B, int64_t Hq, int64_t D, int64_t BS,
                   int64_t Hkv, int64_t MB, float sc) {
  const int64_t G = Hq / Hkv;
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
      const int64_t row_bytes = (h1 - h0) * D * static_cast<int64_t>(sizeof(T));
      const int32_t* table = tables + b * MB;
      const float* qb = qp + (b * Hq + h0 * G) * D;
      float* ob = op + (b * Hq + h0 * G) * D;
      scores.resize(static_cast<size_t>(nq * L));
      float* s = scores.data();
      auto row_at = [&](const T* cache, int64_t t) {  // token t's heads h0.. of one cache
        return cache + ((static_cast<int64_t>(table[t / BS]) * BS + t % BS) * Hkv + h0) * D;
      };
      int64_t t = 0;
      const __m512 scv = _mm512_set1_ps(sc);
      for (int64_t u = 0; u < std::min(L, kPrefetchK); ++u) prefetch_row(row_at(kp, u), row_bytes);
      for (; t + 16 <= L; t += 16) {  // pass 1: scores of 16 tokens at a time, K read once
        const T* rows[16];
        for (int i = 0; i < 16; ++i) rows[i] = row_at(kp, t + i);
        for (int64_t u = t + kPrefetchK; u < std::min(L, t + kPrefetchK + 16); ++u)
          prefetch_row(row_at(kp, u), row_bytes);
        for (int64_t j = 0; j < nq; ++j) {
          const T* hr[16];
          for (int i = 0; i < 16; ++i) hr[i] = rows[i] + (j / G) * D;
          _mm512_storeu_ps(s + j * L + t, _mm512_mul_ps(scv, dot16(qb + j * D, hr, D)));
        }
      }
      for (; t < L; ++t) {  // the last < 16 tokens one by one
        const T* k = row_at(kp, t);
        for (int64_t j = 0; j < nq; ++j) s[j * L + t] = sc * dot(qb + j * D, k + (j / G) * D, D);
      }
      for (int64_t u = 0; u < std::min(L, kPrefetchV); ++u) prefetch_row(row_at(vp, u), row_bytes);
      for (int64_t j = 0; j < nq; ++j) softmax(s + j * L, L);  // per query head
      std::fill(ob, ob + nq * D, 0.f);
      for (int64_t t = 0; t < L; ++t) {  // pass 2: weighted V, V read once
        const T* v = row_at(vp, t);
        if (t + kPrefetchV < L) prefetch_row(row_at(vp, t + kPrefetchV), row_bytes);
        for (int64_t j = 0; j < nq; ++j) axpy(s[j * L + t], v + (j / G) * D, ob + j * D, D);
      }
    }
  });
}

}  // namespace

// q [B, Hq, D] fp32 contiguous; k_cache, v_cache [NB, BS, Hkv, D] fp32 or bf16 contiguous;
// block_tables [B, MB] int32; seq_lens [B] int32 (context length including this token).
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                     const at::Tensor& v_cache,
                                     const at::Tensor& block_tables,
                                     const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(),
              "paged_decode_attention: q must be contiguous [B, Hq, D] fp32");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  (k_cache.scalar_type() == at::kFloat ||
                   k_cache.scalar_type() == at::kBFloat16) &&
                  v_cache.scalar_type() == k_cache.scalar_type() && k_cache.is_contiguous() &&
                  v_cache.is_contiguous(),
              "paged_decode_attention: caches must be contiguous [NB, BS, Hkv, D] fp32 or bf16");
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
  if (k_cache.scalar_type() == at::kFloat) {
    decode_kernel(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                  out.data_ptr<float>(), lens, tables, B, Hq, D, BS, Hkv, MB,
                  static_cast<float>(scale));
  } else {
    decode_kernel(q.data_ptr<float>(), k_cache.data_ptr<at::BFloat16>(),
                  v_cache.data_ptr<at::BFloat16>(), out.data_ptr<float>(), lens, tables, B,
                  Hq, D, BS, Hkv, MB, static_cast<float>(scale));
  }
  return out;
}
