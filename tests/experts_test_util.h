// The synthetic model of the expert-path tests (model_experts_test, moe_model_test): one qwen3moe
// layer of 16 experts, top-4, with a strongly skewed router (the most popular expert gets far more
// than its share of the routes), weights of one type, loaded with repacked weights.
#pragma once

#include <memory>
#include <string>

#include "estream/status.h"
#include "model/model.h"
#include "model/synth.h"

namespace estream::model_test {

// Writes the model to `path` and loads it.
inline Result<std::unique_ptr<model::Model>> SkewedQwenLayer(const std::string& path, QuantType type, uint64_t seed) {
  ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<synth::SynthModel> synth,
                           synth::SynthModel::Create({.preset = "tiny", .arch = "qwen3moe", .layers = 1,
                                                      .experts = 16, .top_k = 4, .type = type,
                                                      .router_skew = 2.0f, .seed = seed}));
  ESTREAM_RETURN_IF_ERROR(synth->Write(path, {.threads = 2}));
  return model::Model::Load(path, {.repack_experts = true, .repack_dense = true});
}

}  // namespace estream::model_test
