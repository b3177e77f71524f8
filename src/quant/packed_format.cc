// Sizes of the kernel-native packed weight layout (packed_format.h).
#include "quant/packed_format.h"

namespace estream {

bool CanRepack(QuantType t) { return PackedScaleBytes(t) > 0; }

size_t PackedWeightBytes(QuantType t, int64_t n, int64_t k) {
  if (!CanRepack(t)) return 0;
  return static_cast<size_t>(PackedPanels(n) * PackedPanelBytes(t, k));
}

}  // namespace estream
