// Scalar reference of LFM2's short convolution (kernels.h, ShortConv): plain loops, the sum over
// the L taps in fp64. Written for clarity; the vector paths are tested against it.
#include <cstdint>

#include "kernels/dispatch.h"

namespace estream::kernels {
namespace {

void ShortConvRowsRef(const float* bcx, int64_t ldb, const float* w, int L, int64_t d, int64_t t_begin,
                      int64_t t_end, float* y, int64_t ldy) {
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* c_row = bcx + t * ldb + d;  // C of token t
    for (int64_t c = 0; c < d; ++c) {
      double acc = 0.0;
      for (int j = 0; j < L; ++j) {
        const int64_t s = t - (L - 1) + j;
        if (s < 0) continue;
        const float* row = bcx + s * ldb;
        const double bx = static_cast<double>(row[c]) * static_cast<double>(row[2 * d + c]);  // B * x
        acc += static_cast<double>(w[j * d + c]) * bx;
      }
      y[t * ldy + c] = static_cast<float>(static_cast<double>(c_row[c]) * acc);
    }
  }
}

}  // namespace

void FillScalarShortConv(KernelTable* t) { t->short_conv_rows = ShortConvRowsRef; }

}  // namespace estream::kernels
