// What a GGUF file holds, summarised (`estream inspect`): architecture, hyper-parameters (the
// {arch}.* keys), tokenizer keys, other metadata, the tensor table, bytes per tensor type, the
// routed experts (per layer: expert count, bytes, and W_e = bytes of one expert's gate + up +
// down, the unit the arena of docs/DESIGN.md section 4 is sized in) and totals. SummarizeGguf
// computes it; GgufSummaryJson and GgufSummaryText write it (the text is printed from the JSON,
// so both say the same).
//
// Works on any valid GGUF: models with fused expert tensors (blk.N.ffn_gate_exps.weight), older
// per-expert files (blk.N.ffn_gate.E.weight) and vocab-only files without tensors.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace estream {

// One metadata key.
struct GgufMetadataEntry {
  std::string key;            // hyper-parameters: without the "{arch}." prefix; others: the whole key
  GgufValue value;            // an array keeps its element type, and its elements only when it holds
                              // at most 16 scalars
  uint64_t array_length = 0;  // arrays: the number of elements
};

struct GgufTensorEntry {
  std::string name;
  QuantType type = QuantType::kF32;
  std::vector<int64_t> shape;  // fastest first, n_dims values
  uint64_t bytes = 0, offset = 0;
};

// Tensors of one type.
struct GgufTypeTotal {
  std::string type;  // TypeName
  uint64_t tensors = 0, bytes = 0;
};

// Routed-expert bytes of one layer.
struct GgufExpertLayer {
  int layer = 0;
  int n_expert = 0;
  bool fused = true;  // ffn_*_exps tensors (false: per-expert ffn_*.E tensors)
  uint64_t gate = 0, up = 0, down = 0;  // bytes of the whole layer, per projection

  uint64_t bytes() const { return gate + up + down; }
  // W_e: one expert's gate + up + down.
  uint64_t per_expert() const { return n_expert > 0 ? bytes() / n_expert : 0; }
};

struct GgufSummary {
  std::string path;
  uint64_t file_bytes = 0, data_offset = 0;
  uint32_t version = 0, alignment = 0;
  std::string architecture, name;  // empty when absent
  std::vector<GgufMetadataEntry> hyperparameters, tokenizer, metadata;  // in file order
  std::vector<GgufTensorEntry> tensors;                                 // in file order
  std::vector<GgufTypeTotal> bytes_by_type;                             // by type name
  std::vector<GgufExpertLayer> expert_layers;                           // by layer
  uint64_t expert_bytes = 0;
  uint64_t w_e = 0;  // the largest W_e of the layers
  uint64_t tensor_bytes = 0, parameters = 0;

  // The hyper-parameter `key` ("expert_count"), or null when absent.
  const GgufValue* hyperparameter(const std::string& key) const;
};

GgufSummary SummarizeGguf(const GgufFile& file);

// `estream inspect --json`: one object, two-space indent, no trailing newline.
std::string GgufSummaryJson(const GgufSummary& s);
// `estream inspect`: the text form, lines ending with a newline.
std::string GgufSummaryText(const GgufSummary& s);

}  // namespace estream
