// Shared by the pipeline tests: a tiny synthetic Q4_0 model (3 layers, 16 experts, top-4) and
// its packed forms (identity and a fixed permutation), written once per test binary.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "pack/pack_model.h"
#include "model/synth.h"
#include "model_test_util.h"

namespace estream::pipeline_test {

using model_test::ScratchDir;

// One synthetic model (16 experts, top-4, 3 layers) and its packed forms, built once.
struct Models {
  ScratchDir dir;
  std::string gguf, packed, permuted;
};

// The tiny test model's shape: 3 layers of 16 experts, top-4, Q4_0.
inline synth::SynthOptions TinyOptions(uint64_t seed) {
  synth::SynthOptions so;
  so.layers = 3;
  so.experts = 16;
  so.top_k = 4;
  so.type = QuantType::kQ4_0;
  so.seed = seed;
  return so;
}

// Held until exit, when the directory and the models in it are removed.
inline Models& TestModels() {
  static std::unique_ptr<Models> m = [] {
    auto m = std::make_unique<Models>();
    m->gguf = m->dir.File("tiny.gguf");
    m->packed = m->dir.File("tiny.packed.gguf");
    m->permuted = m->dir.File("tiny.perm.gguf");
    auto sm = synth::SynthModel::Create(TinyOptions(7));
    EXPECT_TRUE(sm.ok()) << sm.status().ToString();
    EXPECT_TRUE((*sm)->Write(m->gguf, {.threads = 1}).ok());
    auto in = GgufFile::Open(m->gguf, {.mmap = false});
    EXPECT_TRUE(in.ok());
    EXPECT_TRUE(io::PackModel(**in, m->packed).ok());
    io::PackOptions po;
    for (int l = 0; l < 3; ++l) {
      std::vector<int32_t> perm(16);
      for (int p = 0; p < 16; ++p) perm[p] = (p * 5 + l) % 16;  // 5 is coprime with 16: a bijection
      po.permutations[l] = perm;
    }
    EXPECT_TRUE(io::PackModel(**in, m->permuted, po).ok());
    return m;
  }();
  return *m;
}

}  // namespace estream::pipeline_test
