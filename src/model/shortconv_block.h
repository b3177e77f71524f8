// LFM2's short-convolution block (arch_lfm2moe.cc), the token mixer of an LFM2 model's conv
// layers in place of attention:
//   h = RMSNorm(x) * attn_norm                                   -> ws->xn   [T x d]
//   [B | C | xs] = h in_proj^T                                   -> ws->bcx  [T x 3d]
//   y[t] = C[t] * sum_j kernel[j] * (B * xs)[t - L + 1 + j]      -> ws->q    [T x d] (kernels::ShortConv)
//   x += y out_proj^T                                            (through ws->xn)
// The convolution state of a prefill is the prompt itself (L - 1 rows of B * xs before each
// token, zero before the first): nothing outlives the layer, as with the KV cache.
//
// Threading: called outside parallel regions; parallel inside (the GEMMs and ShortConv).
#pragma once

#include <cstdint>
#include <span>

#include "model/blocks.h"
#include "model/model.h"

namespace estream::model {

// x += ShortConv(RMSNorm(x)) for layer il. `seqs` as for AttentionBlock (blocks.h): each
// sequence of a packed batch is convolved alone (zero before its first token), and a
// continuation's first L - 1 rows see its context's last rows before them, as if it followed the
// context in one sequence; empty: one sequence of n_tokens. REQUIRES:
// model.config().is_conv_layer(il); the Workspace reserved for this model (its bcx buffer).
void ShortConvBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws, std::span<const SeqSpan> seqs = {});

}  // namespace estream::model
