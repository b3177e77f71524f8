// What a GGUF file holds, summarised (`estream inspect`): architecture, hyper-parameters (the
// {arch}.* keys), tokenizer keys, other metadata, the tensor table, bytes per tensor type, the
// routed experts (per layer: expert count, bytes, and W_e = bytes of one expert's gate + up +
// down, the unit the arena of docs/DESIGN.md section 4 is sized in) and totals. SummarizeGguf
// computes it; GgufSummaryJson and GgufSummaryText write it (the text is printed from the JSON,
// so both say the same).
//
// Works on any valid GGUF: models with fused expert tensors (blk.N.ffn_gate_exps.weight), older
// per-expert files (blk.N.ffn_gate.E.weight), packed models (`estream pack`: one region tensor
// blk.N.ffn_exps.packed of n_expert records per layer, pack/packed_layout.h; W_e is then the
// record stride, the arena's slot) and vocab-only files without tensors.
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
  enum class Layout {
    kFused,      // ffn_{gate,up,down}_exps tensors
    kPerExpert,  // ffn_{gate,up,down}.E tensors (older Mixtral files)
    kPacked,     // one region of records, ffn_exps.packed (estream pack)
  };
  int layer = 0;
  int n_expert = 0;
  Layout layout = Layout::kFused;
  uint64_t gate = 0, up = 0, down = 0;  // bytes of the whole layer, per projection (0 when packed)
  uint64_t record_bytes = 0;            // packed: one record (an expert's gate, up, down, padding)

  uint64_t bytes() const { return layout == Layout::kPacked ? record_bytes * n_expert : gate + up + down; }
  // W_e: one expert's gate + up + down (packed: its record, the unit the arena is sized in).
  uint64_t per_expert() const {
    if (layout == Layout::kPacked) return record_bytes;
    return n_expert > 0 ? bytes() / n_expert : 0;
  }
};
const char* ExpertLayoutName(GgufExpertLayer::Layout layout);  // "fused", "per-expert", "packed"

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
