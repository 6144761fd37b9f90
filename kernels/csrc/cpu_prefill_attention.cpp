// Causal prefill attention on the CPU over the paged KV cache, fp32 or bf16 (cache and query),
// for every sequence of a step with at least `min_qlen` query tokens: a whole prompt, a chunk
// of one (chunked prefill) or the tail of a prefix-cache hit. Sequence b's queries sit at
// positions L - qlen .. L - 1 (L = seq_lens[b]) and see the keys 0 .. their own position, as
// torch's bottom-right causal mask in the torch backend (its reference).
//
// Per (sequence, KV head): K is packed once, transposed into 16-key tiles [D][16] fp32, and V
// into rows [L][D] fp32 (bf16 widened): a prompt's blocks lie anywhere in the pool. Then per
// block of 8 query rows (token-major, the G query heads of that KV head side by side):
//   1. scores: 8 x 16 fp32 accumulators, one K-tile load and 8 broadcast FMAs per dimension;
//      only the tiles up to the block's last visible key;
//   2. softmax per row over its visible keys (the Cephes exp of cpu_attention.cpp), the keys
//      past a row's position set to 0;
//   3. P V: 4 rows x 64 dimensions of accumulators, one V row read per key.
// Everything inside is fp32 (torch's CPU SDPA also accumulates bf16 in fp32); the result is
// rounded to the query's dtype.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vec_math.h"

#ifndef __AVX512F__
#error "cpu_prefill_attention needs AVX-512F (built with -march=native)"
#endif

namespace {

constexpr int64_t kRows = 8;  // query rows per score block
constexpr int64_t kKeys = 16;  // keys per K tile: one zmm of scores per row

inline float widen(float x) { return x; }
inline float widen(at::BFloat16 x) { return static_cast<float>(x); }


// K of one (sequence, KV head) -> kt [ceil(L/16)][D][16] (keys past L zero); V -> vp [L][D]
template <typename T>
void pack_kv(const T* kc, const T* vc, const int32_t* table, int64_t L, int64_t BS,
             int64_t Hkv, int64_t h, int64_t D, float* kt, float* vp) {
  const int64_t nt = (L + kKeys - 1) / kKeys;
  std::fill(kt + (nt - 1) * D * kKeys, kt + nt * D * kKeys, 0.f);
  for (int64_t t = 0; t < L; ++t) {
    const int64_t row = ((static_cast<int64_t>(table[t / BS]) * BS + t % BS) * Hkv + h) * D;
    float* kd = kt + (t / kKeys) * D * kKeys + t % kKeys;
    float* vd = vp + t * D;
    for (int64_t d = 0; d < D; ++d) {
      kd[d * kKeys] = widen(kc[row + d]);
      vd[d] = widen(vc[row + d]);
    }
  }
}

// s[r][16 j .. 16 j + 16) = q_r . k_{16 j + i} for the 8 rows of qb ([8][D]) and tiles j < nt
void scores(const float* qb, const float* kt, int64_t nt, int64_t D, float* s, int64_t lds) {
  for (int64_t j = 0; j < nt; ++j) {
    __m512 acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
    const float* kj = kt + j * D * kKeys;
    for (int64_t d = 0; d < D; ++d) {
      const __m512 kv = _mm512_loadu_ps(kj + d * kKeys);
      for (int r = 0; r < kRows; ++r)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qb[r * D + d]), kv, acc[r]);
    }
    for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(s + r * lds + j * kKeys, acc[r]);
  }
}

// s[0..n) <- softmax(s[0..lim)) with s[lim..n) = 0; n is a multiple of 16, lim >= 1
void softmax_row(float* s, int64_t lim, int64_t n) {
  __m512 mv = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t t = 0;
  for (; t + 16 <= lim; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + t));
  const __mmask16 tail = static_cast<__mmask16>((1u << (lim - t)) - 1);
  if (t < lim) mv = _mm512_mask_max_ps(mv, tail, mv, _mm512_loadu_ps(s + t));
  const __m512 mb = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 sv = _mm512_setzero_ps();
  for (t = 0; t + 16 <= lim; t += 16) {
    const __m512 e = cbb::exp16_nonpos(_mm512_sub_ps(_mm512_loadu_ps(s + t), mb));
    _mm512_storeu_ps(s + t, e);
    sv = _mm512_add_ps(sv, e);
  }
  if (t < lim) {  // the partial tile: visible lanes exp'd, the rest 0
    const __m512 e = _mm512_maskz_mov_ps(tail, cbb::exp16_nonpos(_mm512_sub_ps(_mm512_loadu_ps(s + t), mb)));
    _mm512_storeu_ps(s + t, e);
    sv = _mm512_add_ps(sv, e);
    t += 16;
  }
  for (; t < n; t += 16) _mm512_storeu_ps(s + t, _mm512_setzero_ps());
  const __m512 iv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sv));
  for (t = 0; t < lim; t += 16) _mm512_storeu_ps(s + t, _mm512_mul_ps(_mm512_loadu_ps(s + t), iv));
}

// o[r][c0 .. c0 + 16 NC) = sum_{t < L} p[r][t] v[t][c0 ..] for 4 rows
template <int NC>
void pv_tile(const float* p, int64_t lds, const float* vp, int64_t D, int64_t c0, int64_t L,
             float* o) {
  __m512 acc[4][NC];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < L; ++t) {
    __m512 v[NC];
    for (int c = 0; c < NC; ++c) v[c] = _mm512_loadu_ps(vp + t * D + c0 + 16 * c);
    for (int r = 0; r < 4; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * lds + t]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(pr, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + r * D + c0 + 16 * c, acc[r][c]);
}

void pv(const float* p, int64_t lds, const float* vp, int64_t D, int64_t L, float* o) {
  for (int64_t c0 = 0; c0 < D; c0 += 64) {
    switch (std::min<int64_t>(4, (D - c0) / 16)) {
      case 1: pv_tile<1>(p, lds, vp, D, c0, L, o); break;
      case 2: pv_tile<2>(p, lds, vp, D, c0, L, o); break;
      case 3: pv_tile<3>(p, lds, vp, D, c0, L, o); break;
      default: pv_tile<4>(p, lds, vp, D, c0, L, o); break;
    }
  }
}

template <typename T, typename Q>
void prefill_kernel(const Q* qp, const T* kp, const T* vp_cache, Q* op, const int32_t* lens,
                    const int32_t* starts, const int32_t* tables, int64_t B, int64_t Hq,
                    int64_t D, int64_t BS, int64_t Hkv, int64_t MB, float sc, int64_t min_qlen) {
  const int64_t G = Hq / Hkv;
  std::vector<int64_t> seqs;  // the sequences this call attends for
  for (int64_t b = 0; b < B; ++b)
    if (starts[b + 1] - starts[b] >= min_qlen) seqs.push_back(b);
  const int64_t items = static_cast<int64_t>(seqs.size()) * Hkv;
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt, vbuf, s, qb(kRows * D), ob(kRows * D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = seqs[item / Hkv], h = item % Hkv;
      const int64_t L = lens[b], q0 = starts[b], qlen = starts[b + 1] - q0;
      const int64_t nt = (L + kKeys - 1) / kKeys, lds = nt * kKeys;
      kt.resize(static_cast<size_t>(nt * D * kKeys));
      vbuf.resize(static_cast<size_t>(L * D));
      s.resize(static_cast<size_t>(kRows * lds));
      pack_kv(kp, vp_cache, tables + b * MB, L, BS, Hkv, h, D, kt.data(), vbuf.data());
      const int64_t R = qlen * G;  // rows: token-major, the group's heads side by side
      for (int64_t r0 = 0; r0 < R; r0 += kRows) {
        const int64_t nr = std::min(kRows, R - r0);
        int64_t lim[kRows];
        for (int64_t r = 0; r < kRows; ++r) {  // rows past R repeat the last one
          const int64_t row = r0 + std::min(r, nr - 1), i = row / G, g = row % G;
          lim[r] = L - qlen + i + 1;
          const Q* src = qp + ((q0 + i) * Hq + h * G + g) * D;
          for (int64_t d = 0; d < D; ++d) qb[r * D + d] = widen(src[d]) * sc;
        }
        const int64_t last = lim[kRows - 1];  // the block's furthest visible key + 1
        const int64_t ntb = (last + kKeys - 1) / kKeys;
        scores(qb.data(), kt.data(), ntb, D, s.data(), lds);
        for (int64_t r = 0; r < kRows; ++r) softmax_row(s.data() + r * lds, lim[r], ntb * kKeys);
        pv(s.data(), lds, vbuf.data(), D, last, ob.data());
        pv(s.data() + 4 * lds, lds, vbuf.data(), D, last, ob.data() + 4 * D);
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t row = r0 + r, i = row / G, g = row % G;
          Q* dst = op + ((q0 + i) * Hq + h * G + g) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<Q>(ob[r * D + d]);
        }
      }
    }
  });
}

template <typename Q>
void dispatch_cache(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                    at::Tensor& out, const int32_t* lens, const int32_t* starts,
                    const int32_t* tables, int64_t B, int64_t MB, float sc, int64_t min_qlen) {
  const int64_t Hq = q.size(1), D = q.size(2);
  const int64_t BS = k_cache.size(1), Hkv = k_cache.size(2);
  if (k_cache.scalar_type() == at::kFloat)
    prefill_kernel(q.data_ptr<Q>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                   out.data_ptr<Q>(), lens, starts, tables, B, Hq, D, BS, Hkv, MB, sc, min_qlen);
  else
    prefill_kernel(q.data_ptr<Q>(), k_cache.data_ptr<at::BFloat16>(),
                   v_cache.data_ptr<at::BFloat16>(), out.data_ptr<Q>(), lens, starts, tables,
                   B, Hq, D, BS, Hkv, MB, sc, min_qlen);
}

}  // namespace

// q [T, Hq, D] fp32 or bf16 contiguous, D a multiple of 16; caches [NB, BS, Hkv, D] fp32 or
// bf16 contiguous; block_tables [B, MB] int32; seq_lens [B] int32 (context after this step);
// query_start_loc [B + 1] int32. Writes out [T, Hq, D] (q's dtype) for the rows of every
// sequence with at least min_qlen queries; the other rows are left as they are.
void paged_prefill_attention(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& block_tables,
                             const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                             double scale, at::Tensor& out, int64_t min_qlen) {
  TORCH_CHECK(q.dim() == 3 && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16) &&
                  q.is_contiguous() && q.size(2) % 16 == 0,
              "paged_prefill_attention: q must be contiguous [T, Hq, D] fp32 or bf16, D % 16 == 0");
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type() &&
                  out.is_contiguous(),
              "paged_prefill_attention: out must be contiguous, of q's shape and dtype");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  (k_cache.scalar_type() == at::kFloat ||
                   k_cache.scalar_type() == at::kBFloat16) &&
                  v_cache.scalar_type() == k_cache.scalar_type() && k_cache.is_contiguous() &&
                  v_cache.is_contiguous() && k_cache.size(3) == q.size(2),
              "paged_prefill_attention: caches must be contiguous [NB, BS, Hkv, D] fp32 or bf16");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt &&
                  block_tables.is_contiguous() && seq_lens.dim() == 1 &&
                  seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous() &&
                  query_start_loc.dim() == 1 && query_start_loc.scalar_type() == at::kInt &&
                  query_start_loc.is_contiguous(),
              "paged_prefill_attention: block_tables [B, MB], seq_lens [B], query_start_loc "
              "[B + 1] must be contiguous int32");
  const int64_t B = seq_lens.size(0), MB = block_tables.size(1), NB = k_cache.size(0);
  const int64_t BS = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(block_tables.size(0) == B && query_start_loc.size(0) == B + 1,
              "paged_prefill_attention: one block-table row and one length per sequence");
  TORCH_CHECK(q.size(1) % Hkv == 0, "paged_prefill_attention: Hq must be a multiple of Hkv");
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  TORCH_CHECK(starts[0] == 0 && starts[B] == q.size(0),
              "paged_prefill_attention: query_start_loc must run from 0 to the token count");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t qlen = starts[b + 1] - starts[b];
    TORCH_CHECK(qlen >= 0 && qlen <= lens[b] && lens[b] <= MB * BS,
                "paged_prefill_attention: sequence ", b, " has ", qlen, " queries, length ",
                lens[b], ", ", MB, " blocks of ", BS);
    if (qlen < min_qlen) continue;
    for (int64_t j = 0; j < (lens[b] + BS - 1) / BS; ++j) {
      const int32_t blk = tables[b * MB + j];
      TORCH_CHECK(blk >= 0 && blk < NB, "paged_prefill_attention: block ", blk,
                  " outside the pool of ", NB);
    }
  }
  const float sc = static_cast<float>(scale);
  min_qlen = std::max<int64_t>(min_qlen, 1);
  if (q.scalar_type() == at::kFloat)
    dispatch_cache<float>(q, k_cache, v_cache, out, lens, starts, tables, B, MB, sc, min_qlen);
  else
    dispatch_cache<at::BFloat16>(q, k_cache, v_cache, out, lens, starts, tables, B, MB, sc,
                                 min_qlen);
}
