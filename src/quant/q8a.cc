// Scalar reference of the kernels' 8-bit activation format BlockQ8A (quant/types.h).
//
// Definition (every fast quantiser must match it bit for bit):
//   amax = max |x_j| over the 32 values of the block;
//   d    = amax / 127 (fp32 division);  id = amax != 0 ? 127 / amax : 0 (fp32 division);
//   q_j  = round-half-to-even(x_j * id) (fp32 product), which lies in [-127, 127];
//   sum  = the int sums of q over values 0..15 and 16..31.
// Round-half-to-even is what the vector conversion (cvtps2dq) does in the default rounding
// mode, and `id` is a division rather than 1 / d so that the largest value maps to exactly
// +-127. A NaN in the block is not supported (the result is unspecified but memory-safe).
#include <cmath>

#include "base/check.h"
#include "quant/quant.h"

namespace estream {

void QuantizeRowQ8A(const float* x, BlockQ8A* y, int64_t n) {
  ESTREAM_CHECK(n % kQK8A == 0, "QuantizeRowQ8A: n must be a multiple of 32");
  for (int64_t b = 0; b < n / kQK8A; ++b) {
    const float* xb = x + b * kQK8A;
    float amax = 0.0f;
    for (int j = 0; j < kQK8A; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int s0 = 0, s1 = 0;
    for (int j = 0; j < kQK8A; ++j) {
      const int q = static_cast<int>(std::nearbyint(xb[j] * id));
      y[b].qs[j] = static_cast<int8_t>(q);
      (j < kQK8A / 2 ? s0 : s1) += q;
    }
    y[b].d = d;
    y[b].sum[0] = static_cast<int16_t>(s0);
    y[b].sum[1] = static_cast<int16_t>(s1);
  }
}

void DequantizeRowQ8A(const BlockQ8A* x, float* y, int64_t n) {
  ESTREAM_CHECK(n % kQK8A == 0, "DequantizeRowQ8A: n must be a multiple of 32");
  for (int64_t b = 0; b < n / kQK8A; ++b)
    for (int j = 0; j < kQK8A; ++j) y[b * kQK8A + j] = x[b].d * static_cast<float>(x[b].qs[j]);
}

}  // namespace estream
