// ShortConv (kernels.h): the public wrapper of LFM2's short convolution: argument checks and the
// OpenMP split over tokens. The per-ISA rows live in ref/shortconv_ref.cc,
// x86_avx2/shortconv_avx2.cc, x86_avx512/shortconv_avx512.cc.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "base/check.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"

namespace estream::kernels {

void ShortConv(const float* bcx, int64_t ldb, const float* w, int L, int64_t d, int64_t n_tokens, float* y,
               int64_t ldy) {
  ESTREAM_CHECK(L >= 1 && d >= 1 && ldb >= 3 * d && ldy >= d, "ShortConv: bad shape");
  if (n_tokens <= 0) return;
  const auto fn = Kernels().short_conv_rows;
  // Each token reads L rows of 3d and writes d values: memory-bound, so blocks of rows per thread
  // (static split, equal cost per token).
  constexpr int64_t kMinRowsPerThread = 16;
  const int threads = static_cast<int>(std::clamp<int64_t>(n_tokens / kMinRowsPerThread, 1, omp_get_max_threads()));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t t0 = n_tokens * id / nt, t1 = n_tokens * (id + 1) / nt;
    if (t1 > t0) fn(bcx, ldb, w, L, d, t0, t1, y, ldy);
  }
}

}  // namespace estream::kernels
