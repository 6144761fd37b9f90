// Paged decode attention over an int8 KV cache, for any x86-64 CPU (AVX2/FMA where the
// compiler targets it, plain loops otherwise): one query token per sequence, K/V rows read
// in place through the block table and dequantized as they are read. Built on its own as
// `cbbench_cpu_kv_kernels` by kernels/cpu_kv_attention.py (no AVX-512 needed).
//
// Row layout (kernels/kv_quant.py, the source of truth): a (token, KV head) row is W bytes,
// head_dim = W - SCALE_BYTES int8 codes then the scale. SCALE_BYTES 1: an E8M0 exponent e,
// scale = 2^(e - 127), built as the fp32 bits e << 23 (e in [1, 254], never subnormal).
// SCALE_BYTES 2: an fp16 scale (the layout before E8M0). The row width tells which:
// W - D. x = code * scale in fp32; the scale is a power of two, so the product is exact.
//
// Same shape as cpu_attention.cpp: work item = one sequence (its KV heads split in ranges
// only when there are fewer sequences than threads); pass 1 streams K once (each row
// dequantized into a D-float buffer, then the G query heads of its KV head dot it), softmax
// per query head, pass 2 streams V once (dequantized, G FMAs of D). fp32 accumulation.
// MHA (G = 1) skips the buffer: the codes feed the FMAs and the scale multiplies the score
// (pass 1) or the softmax weight (pass 2), exact for a power-of-two scale.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CBB_AVX2 1
#endif

namespace {

inline float e8m0_scale(uint8_t e) {  // 2^(e - 127): e as fp32's exponent field
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  float s;
  std::memcpy(&s, &bits, sizeof s);
  return s;
}

inline float row_scale(const int8_t* row, int64_t D, int64_t scale_bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(row + D);
  if (scale_bytes == 1) return e8m0_scale(p[0]);
  uint16_t h;  // fp16 scale (little-endian bytes, as torch stores it)
  std::memcpy(&h, p, sizeof h);
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

// out[i] = code[i] * scale (exact: scale is a power of two for E8M0)
inline void dequant_row(const int8_t* c, float scale, float* out, int64_t d) {
  int64_t i = 0;
#ifdef CBB_AVX2
  const __m256 sv = _mm256_set1_ps(scale);
  for (; i + 8 <= d; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), sv));
  }
#endif
  for (; i < d; ++i) out[i] = static_cast<float>(c[i]) * scale;
}

inline float dot(const float* a, const float* b, int64_t d) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef CBB_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= d; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= d; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  const __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
  sum = _mm_cvtss_f32(s4);
#endif
  for (; i < d; ++i) sum += a[i] * b[i];
  return sum;
}

inline void axpy(float p, const float* x, float* y, int64_t d) {  // y += p * x
  int64_t i = 0;
#ifdef CBB_AVX2
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= d; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < d; ++i) y[i] += p * x[i];
}

// q . codes (the row's scale applied by the caller: a power of two, so s * (q . c) is
// (q . (c * s)) bit for bit, barring overflow). MHA's path: no dequantized buffer.
inline float dot_i8(const float* a, const int8_t* c, int64_t d) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef CBB_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= d; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i));
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8),
                           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), acc1);
  }
  for (; i + 8 <= d; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + i));
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), acc0);
  }
  const __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
  sum = _mm_cvtss_f32(s4);
#endif
  for (; i < d; ++i) sum += a[i] * static_cast<float>(c[i]);
  return sum;
}

inline void axpy_i8(float p, const int8_t* c, float* y, int64_t d) {  // y += p * codes
  int64_t i = 0;
#ifdef CBB_AVX2
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= d; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + i));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(pv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                                            _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < d; ++i) y[i] += p * static_cast<float>(c[i]);
}

inline void prefetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 3);
}

}  // namespace

// q [B, Hq, D] fp32 contiguous; k_cache, v_cache [NB, BS, Hkv, D + SCALE_BYTES] int8
// contiguous; block_tables [B, MB] int32; seq_lens [B] int32 (context incl. this token).
at::Tensor paged_decode_attention_int8(const at::Tensor& q, const at::Tensor& k_cache,
                                       const at::Tensor& v_cache,
                                       const at::Tensor& block_tables,
                                       const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(),
              "paged_decode_attention_int8: q must be contiguous [B, Hq, D] fp32");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.scalar_type() == at::kChar && v_cache.scalar_type() == at::kChar &&
                  k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_decode_attention_int8: caches must be contiguous [NB, BS, Hkv, D + scale] int8");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt &&
                  block_tables.is_contiguous(),
              "paged_decode_attention_int8: block_tables must be contiguous [B, MB] int32");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kInt &&
                  seq_lens.is_contiguous(),
              "paged_decode_attention_int8: seq_lens must be contiguous [B] int32");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t NB = k_cache.size(0), BS = k_cache.size(1), Hkv = k_cache.size(2);
  const int64_t W = k_cache.size(3), SB = W - D, MB = block_tables.size(1);
  TORCH_CHECK(SB == 1 || SB == 2, "paged_decode_attention_int8: cache rows of ", W,
              " bytes for head_dim ", D, ": expected ", D, " codes + 1 (E8M0) or 2 (fp16) scale bytes");
  TORCH_CHECK(Hq % Hkv == 0, "paged_decode_attention_int8: Hq must be a multiple of Hkv");
  TORCH_CHECK(block_tables.size(0) == B && seq_lens.size(0) == B,
              "paged_decode_attention_int8: one block-table row and one length per sequence");
  const int64_t G = Hq / Hkv;
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= MB * BS, "paged_decode_attention_int8: sequence ",
                b, " has length ", lens[b], " for ", MB, " blocks of ", BS);
    for (int64_t j = 0; j < (lens[b] + BS - 1) / BS; ++j) {
      const int32_t blk = tables[b * MB + j];
      TORCH_CHECK(blk >= 0 && blk < NB, "paged_decode_attention_int8: block ", blk,
                  " outside the pool of ", NB);
    }
  }
  auto out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const int8_t* kp = k_cache.data_ptr<int8_t>();
  const int8_t* vp = v_cache.data_ptr<int8_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t threads = at::get_num_threads();
  const int64_t split = std::min<int64_t>(Hkv, std::max<int64_t>(1, (threads + B - 1) / B));
  const int64_t per = (Hkv + split - 1) / split;
  at::parallel_for(0, B * split, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> row(static_cast<size_t>(D));
    float* x = row.data();
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / split, h0 = (item % split) * per;
      const int64_t h1 = std::min(Hkv, h0 + per), L = lens[b];
      if (h0 >= h1) continue;
      const int64_t nh = h1 - h0, nq = nh * G;  // query heads of this item, consecutive in q
      const int32_t* table = tables + b * MB;
      const float* qb = qp + (b * Hq + h0 * G) * D;
      float* ob = op + (b * Hq + h0 * G) * D;
      scores.resize(static_cast<size_t>(nq * L));
      float* s = scores.data();
      auto row_at = [&](const int8_t* cache, int64_t t) {  // token t's heads h0.. of a cache
        return cache + ((static_cast<int64_t>(table[t / BS]) * BS + t % BS) * Hkv + h0) * W;
      };
      for (int64_t t = 0; t < L; ++t) {  // pass 1: scores, K read once
        const int8_t* k = row_at(kp, t);
        if (t + 1 < L) prefetch(row_at(kp, t + 1), nh * W);
        for (int64_t h = 0; h < nh; ++h) {
          const int8_t* kr = k + h * W;
          if (G == 1) {  // one query head per row: fold the scale into the score
            s[h * L + t] = sc * row_scale(kr, D, SB) * dot_i8(qb + h * D, kr, D);
            continue;
          }
          dequant_row(kr, row_scale(kr, D, SB), x, D);
          for (int64_t g = 0; g < G; ++g) {
            const int64_t j = h * G + g;
            s[j * L + t] = sc * dot(qb + j * D, x, D);
          }
        }
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
        const int8_t* v = row_at(vp, t);
        if (t + 1 < L) prefetch(row_at(vp, t + 1), nh * W);
        for (int64_t h = 0; h < nh; ++h) {
          const int8_t* vr = v + h * W;
          if (G == 1) {  // fold the scale into the weight
            axpy_i8(s[h * L + t] * row_scale(vr, D, SB), vr, ob + h * D, D);
            continue;
          }
          dequant_row(vr, row_scale(vr, D, SB), x, D);
          for (int64_t g = 0; g < G; ++g) {
            const int64_t j = h * G + g;
            axpy(s[j * L + t], x, ob + j * D, D);
          }
        }
      }
    }
  });
  return out;
}

// Which code path this build compiled: "avx2" or "scalar" (for describe() and the tests).
std::string isa() {
#ifdef CBB_AVX2
  return "avx2";
#else
  return "scalar";
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention_int8", &paged_decode_attention_int8,
        "q [B, Hq, D] fp32, int8 caches [NB, BS, Hkv, D + scale bytes], block_tables [B, MB] "
        "int32, seq_lens [B] int32 -> [B, Hq, D] fp32",
        py::call_guard<py::gil_scoped_release>());
  m.def("isa", &isa, "the instruction set the kernel was compiled for");
}
