// Vector math shared by the CPU kernels (AVX-512F).
#pragma once
#include <immintrin.h>

namespace cbb {

// e^x of fp32 lanes with x in [-104, 89]: Cephes' range reduction and polynomial (~1 ulp),
// the scaling by 2^n under- and overflowing to 0 and inf as expf does.
inline __m512 exp16_core(__m512 x) {
  const __m512 fx = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, fx);
}

// exp(x) of fp32 lanes with x <= 0 (a value minus its row's maximum); a lane below -103.97
// (where expf underflows to 0), -inf included, is exactly 0, so a masked-out value never
// gets a denormal weight.
inline __m512 exp16_nonpos(__m512 x0) {
  const __mmask16 zero = _mm512_cmp_ps_mask(x0, _mm512_set1_ps(-103.972077f), _CMP_LT_OQ);
  const __m512 e = exp16_core(_mm512_max_ps(x0, _mm512_set1_ps(-104.f)));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~zero), e);
}

// exp(x) of any fp32 lanes: under- and overflows to 0 and inf as expf does, NaN stays NaN.
inline __m512 exp16(__m512 x0) {
  const __mmask16 nan = _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q);
  const __m512 x = _mm512_min_ps(_mm512_max_ps(x0, _mm512_set1_ps(-104.f)), _mm512_set1_ps(89.f));
  return _mm512_mask_mov_ps(exp16_core(x), nan, x0);
}

}  // namespace cbb
