#include "gguf/summary.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <utility>

#include "base/format.h"
#include "base/json_text.h"
#include "base/stats.h"

namespace estream {
namespace {

using Json = nlohmann::ordered_json;

// Parses "blk.<N>.<rest>"; returns false for other names.
bool SplitBlockName(const std::string& name, int* layer, std::string* rest) {
  if (name.rfind("blk.", 0) != 0) return false;
  size_t i = 4, j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return false;
  *layer = std::stoi(name.substr(i, j - i));
  *rest = name.substr(j + 1);
  return true;
}

// Which projection of which expert layout a tensor is: 0 gate, 1 up, 2 down, -1 none.
// `expert` is set for the per-expert form ffn_gate.E.weight.
int ExpertProjection(const std::string& rest, bool* fused, int* expert) {
  static const char* const kProj[] = {"gate", "up", "down"};
  for (int p = 0; p < 3; ++p) {
    const std::string fused_name = std::string("ffn_") + kProj[p] + "_exps.weight";
    if (rest == fused_name) {
      *fused = true;
      return p;
    }
    const std::string prefix = std::string("ffn_") + kProj[p] + ".";
    if (rest.rfind(prefix, 0) == 0 && rest.size() > prefix.size() + 7 &&
        rest.compare(rest.size() - 7, 7, ".weight") == 0) {
      const std::string num = rest.substr(prefix.size(), rest.size() - 7 - prefix.size());
      if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) continue;
      *fused = false;
      *expert = std::stoi(num);
      return p;
    }
  }
  return -1;
}

// A packed layer's region tensor (pack/packed_layout.h): I8 [record_bytes, n_expert].
constexpr char kPackedRegion[] = "ffn_exps.packed";

std::vector<GgufExpertLayer> FindExperts(const GgufFile& f) {
  using Layout = GgufExpertLayer::Layout;
  std::map<int, GgufExpertLayer> layers;
  std::map<int, std::map<int, bool>> seen_experts;  // per-expert layout: layer -> experts seen
  for (const GgufTensorInfo& t : f.tensors()) {
    int layer, expert = -1;
    std::string rest;
    bool fused = true;
    if (!SplitBlockName(t.name, &layer, &rest)) continue;
    if (rest == kPackedRegion && t.n_dims == 2) {
      GgufExpertLayer& el = layers[layer];
      el.layer = layer;
      el.layout = Layout::kPacked;
      el.record_bytes = static_cast<uint64_t>(t.ne(0));
      el.n_expert = static_cast<int>(t.ne(1));
      continue;
    }
    const int p = ExpertProjection(rest, &fused, &expert);
    if (p < 0) continue;
    GgufExpertLayer& el = layers[layer];
    el.layer = layer;
    el.layout = fused ? Layout::kFused : Layout::kPerExpert;
    (p == 0 ? el.gate : p == 1 ? el.up : el.down) += t.n_bytes;
    if (fused) el.n_expert = static_cast<int>(t.ne(2));
    else seen_experts[layer][expert] = true;
  }
  std::vector<GgufExpertLayer> out;
  for (auto& [layer, el] : layers) {
    if (el.layout == Layout::kPerExpert) el.n_expert = static_cast<int>(seen_experts[layer].size());
    out.push_back(el);
  }
  return out;
}

// A metadata entry: scalars as they are; arrays keep their element type, their length and their
// elements when there are at most 16 scalars.
GgufMetadataEntry Entry(std::string key, const GgufValue& v) {
  GgufMetadataEntry e;
  e.key = std::move(key);
  if (v.type != GgufType::kArray) {
    e.value = v;
    return e;
  }
  e.value.type = GgufType::kArray;
  e.value.elem_type = v.elem_type;
  e.array_length = v.array.size();
  if (v.array.size() <= 16 && v.elem_type != GgufType::kArray) e.value.array = v.array;
  return e;
}

Json ScalarJson(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64:
      return v.u;
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
      return v.i;
    case GgufType::kF32: case GgufType::kF64:
      return v.f;
    case GgufType::kBool:
      return v.u != 0;
    case GgufType::kString:
      return v.str;
    case GgufType::kArray:
      break;
  }
  return nullptr;
}

// A metadata value as JSON: scalars as themselves, arrays summarised (element type, length,
// and the values when there are at most 16 scalars).
Json EntryJson(const GgufMetadataEntry& e) {
  if (e.value.type != GgufType::kArray) return ScalarJson(e.value);
  Json j = {{"array", GgufTypeName(e.value.elem_type)}, {"length", e.array_length}};
  if (e.array_length <= 16 && e.value.elem_type != GgufType::kArray) {
    Json values = Json::array();
    for (const GgufValue& x : e.value.array) values.push_back(ScalarJson(x));
    j["values"] = values;
  }
  return j;
}

Json EntriesJson(const std::vector<GgufMetadataEntry>& entries) {
  Json o = Json::object();
  for (const GgufMetadataEntry& e : entries) o[e.key] = EntryJson(e);
  return o;
}

Json SummaryJson(const GgufSummary& s) {
  Json j;
  j["file"] = s.path;
  j["file_bytes"] = s.file_bytes;
  j["gguf_version"] = s.version;
  j["alignment"] = s.alignment;
  j["data_offset"] = s.data_offset;
  j["architecture"] = s.architecture;
  j["name"] = s.name;
  const Json hparams = EntriesJson(s.hyperparameters);
  j["hyperparameters"] = hparams;
  j["tokenizer"] = EntriesJson(s.tokenizer);
  j["metadata"] = EntriesJson(s.metadata);

  Json tensors = Json::array();
  for (const GgufTensorEntry& t : s.tensors)
    tensors.push_back({{"name", t.name}, {"type", TypeName(t.type)}, {"shape", t.shape}, {"bytes", t.bytes},
                       {"offset", t.offset}});
  j["tensors"] = tensors;
  Json types = Json::object();
  for (const GgufTypeTotal& tb : s.bytes_by_type) types[tb.type] = {{"tensors", tb.tensors}, {"bytes", tb.bytes}};
  j["bytes_by_type"] = types;

  Json layers = Json::array();
  for (const GgufExpertLayer& el : s.expert_layers) {
    const uint64_t n = el.n_expert > 0 ? el.n_expert : 1;
    Json l = {{"layer", el.layer}, {"n_expert", el.n_expert}, {"layout", ExpertLayoutName(el.layout)},
              {"bytes", el.bytes()}, {"W_e", el.per_expert()}};
    if (el.layout == GgufExpertLayer::Layout::kPacked) {
      l["record_bytes"] = el.record_bytes;  // the parts' types and sizes: the estream.part_* keys
    } else {
      l["gate_bytes_per_expert"] = el.gate / n;
      l["up_bytes_per_expert"] = el.up / n;
      l["down_bytes_per_expert"] = el.down / n;
    }
    layers.push_back(l);
  }
  j["experts"] = {{"moe_layers", s.expert_layers.size()},
                  {"n_expert", hparams.contains("expert_count") ? hparams["expert_count"] : Json(nullptr)},
                  {"n_expert_used", hparams.contains("expert_used_count") ? hparams["expert_used_count"] : Json(nullptr)},
                  {"W_e", s.w_e},
                  {"bytes", s.expert_bytes},
                  {"layers", layers}};
  j["totals"] = {{"tensors", s.tensors.size()},
                 {"parameters", s.parameters},
                 {"tensor_bytes", s.tensor_bytes},
                 {"expert_bytes", s.expert_bytes},
                 {"non_expert_bytes", s.tensor_bytes - s.expert_bytes},
                 {"file_bytes", s.file_bytes},
                 {"bits_per_weight", s.parameters > 0 ? 8.0 * s.tensor_bytes / s.parameters : 0.0}};
  return j;
}

std::string Human(const Json& bytes) { return FormatBytes(bytes.get<uint64_t>()); }

}  // namespace

const char* ExpertLayoutName(GgufExpertLayer::Layout layout) {
  switch (layout) {
    case GgufExpertLayer::Layout::kFused: return "fused";
    case GgufExpertLayer::Layout::kPerExpert: return "per-expert";
    case GgufExpertLayer::Layout::kPacked: return "packed";
  }
  return "?";
}

const GgufValue* GgufSummary::hyperparameter(const std::string& key) const {
  for (const GgufMetadataEntry& e : hyperparameters)
    if (e.key == key) return &e.value;
  return nullptr;
}

GgufSummary SummarizeGguf(const GgufFile& f) {
  GgufSummary s;
  s.path = f.path();
  s.file_bytes = f.file_size();
  s.version = f.version();
  s.alignment = f.alignment();
  s.data_offset = f.data_offset();
  const GgufValue* arch_v = f.Find("general.architecture");
  s.architecture = arch_v && arch_v->type == GgufType::kString ? arch_v->str : "";
  const GgufValue* name_v = f.Find("general.name");
  s.name = name_v && name_v->type == GgufType::kString ? name_v->str : "";
  const std::string& arch = s.architecture;
  for (const GgufKv& kv : f.kvs()) {
    if (!arch.empty() && kv.key.rfind(arch + ".", 0) == 0) s.hyperparameters.push_back(Entry(kv.key.substr(arch.size() + 1), kv.value));
    else if (kv.key.rfind("tokenizer.", 0) == 0) s.tokenizer.push_back(Entry(kv.key, kv.value));
    else s.metadata.push_back(Entry(kv.key, kv.value));
  }

  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // type -> (tensors, bytes)
  for (const GgufTensorInfo& t : f.tensors()) {
    s.tensors.push_back({.name = t.name, .type = t.type, .shape = std::vector<int64_t>(t.dims, t.dims + t.n_dims),
                         .bytes = t.n_bytes, .offset = t.offset});
    auto& bt = by_type[TypeName(t.type)];
    bt.first += 1;
    bt.second += t.n_bytes;
    s.tensor_bytes += t.n_bytes;
    // A packed region's elements are bytes of records; its experts' weights are counted below.
    const size_t r = t.name.size(), k = std::char_traits<char>::length(kPackedRegion);
    if (r <= k || t.name.compare(r - k, k, kPackedRegion) != 0) s.parameters += t.n_elements;
  }
  for (const auto& [type, tb] : by_type) s.bytes_by_type.push_back({.type = type, .tensors = tb.first, .bytes = tb.second});

  s.expert_layers = FindExperts(f);
  // A packed expert's weights: gate and up n_embd x n_ff, down n_ff x n_embd (n_ff: the expert
  // width key, else the FFN width, as the loader reads them).
  const auto hparam = [&](const char* key) -> uint64_t {
    const GgufValue* v = s.hyperparameter(key);
    if (!v) return 0;
    switch (v->type) {
      case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64: return v->u;
      case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
        return static_cast<uint64_t>(std::max<int64_t>(v->i, 0));
      default: return 0;
    }
  };
  const uint64_t d = hparam("embedding_length");
  const uint64_t ff = hparam("expert_feed_forward_length") ? hparam("expert_feed_forward_length")
                                                           : hparam("feed_forward_length");
  for (const GgufExpertLayer& el : s.expert_layers) {
    s.expert_bytes += el.bytes();
    s.w_e = std::max(s.w_e, el.per_expert());
    if (el.layout == GgufExpertLayer::Layout::kPacked) s.parameters += el.n_expert * 3 * d * ff;
  }
  return s;
}

std::string GgufSummaryJson(const GgufSummary& s) { return DumpJson(SummaryJson(s), 2); }

std::string GgufSummaryText(const GgufSummary& s) {
  const Json j = SummaryJson(s);
  std::string out;
  Appendf(&out, "file:          %s (%s)\n", j["file"].get<std::string>().c_str(), Human(j["file_bytes"]).c_str());
  Appendf(&out, "format:        GGUF v%u, alignment %u, %zu tensors, %zu metadata keys, data at byte %llu\n",
          j["gguf_version"].get<unsigned>(), j["alignment"].get<unsigned>(), j["tensors"].size(),
          j["hyperparameters"].size() + j["tokenizer"].size() + j["metadata"].size(),
          static_cast<unsigned long long>(j["data_offset"].get<uint64_t>()));
  Appendf(&out, "architecture:  %s\n", s.architecture.empty() ? "(none)" : s.architecture.c_str());
  if (!s.name.empty()) Appendf(&out, "name:          %s\n", s.name.c_str());

  auto print_obj = [&](const char* title, const Json& obj) {
    if (obj.empty()) return;
    Appendf(&out, "\n%s:\n", title);
    for (const auto& [k, v] : obj.items()) {
      std::string text;
      if (v.is_object() && v.contains("array"))
        text = "[" + v["array"].get<std::string>() + " x " + std::to_string(v["length"].get<size_t>()) + "]";
      else if (v.is_number_float()) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%g", v.get<double>());
        text = buf;
      } else {
        text = DumpJson(v);
      }
      Appendf(&out, "  %-40s %s\n", k.c_str(), text.c_str());
    }
  };
  print_obj("hyper-parameters", j["hyperparameters"]);
  print_obj("tokenizer", j["tokenizer"]);
  print_obj("metadata", j["metadata"]);

  const Json& tensors = j["tensors"];
  if (!tensors.empty()) {
    size_t w = 4;
    for (const Json& t : tensors) w = std::max(w, t["name"].get<std::string>().size());
    Appendf(&out, "\ntensors:\n  %-*s  %-5s  %-22s  %14s\n", static_cast<int>(w), "name", "type", "shape", "bytes");
    for (const Json& t : tensors) {
      std::string shape = "[";
      for (size_t d = 0; d < t["shape"].size(); ++d) shape += (d ? ", " : "") + std::to_string(t["shape"][d].get<int64_t>());
      shape += "]";
      Appendf(&out, "  %-*s  %-5s  %-22s  %14llu\n", static_cast<int>(w), t["name"].get<std::string>().c_str(),
              t["type"].get<std::string>().c_str(), shape.c_str(),
              static_cast<unsigned long long>(t["bytes"].get<uint64_t>()));
    }
    const uint64_t total = j["totals"]["tensor_bytes"].get<uint64_t>();
    Appendf(&out, "\nbytes per type:\n");
    for (const auto& [type, v] : j["bytes_by_type"].items())
      Appendf(&out, "  %-5s  %5llu tensors  %14llu bytes  %10s  %5.1f%%\n", type.c_str(),
              static_cast<unsigned long long>(v["tensors"].get<uint64_t>()),
              static_cast<unsigned long long>(v["bytes"].get<uint64_t>()), Human(v["bytes"]).c_str(),
              total ? 100.0 * v["bytes"].get<uint64_t>() / total : 0.0);
  }

  const Json& ex = j["experts"];
  if (ex["moe_layers"].get<size_t>() > 0) {
    const bool packed = std::any_of(ex["layers"].begin(), ex["layers"].end(),
                                    [](const Json& l) { return l["layout"] == "packed"; });
    Appendf(&out, "\nexperts: %zu MoE layers, %s experts, top-%s; W_e (one expert's %s) = %llu bytes (%s)\n",
            ex["moe_layers"].get<size_t>(), ex["n_expert"].dump().c_str(), ex["n_expert_used"].dump().c_str(),
            packed ? "record: gate+up+down, 4 KiB-aligned" : "gate+up+down",
            static_cast<unsigned long long>(ex["W_e"].get<uint64_t>()), Human(ex["W_e"]).c_str());
    Appendf(&out, "  %5s  %7s  %-10s  %14s  %12s  %12s  %12s  %12s\n", "layer", "experts", "layout", "bytes", "W_e",
            "gate/expert", "up/expert", "down/expert");
    // Packed layers hold records, not per-projection tensors: "-" in those columns.
    const auto part = [](const Json& l, const char* key) {
      return l.contains(key) ? std::to_string(l[key].get<uint64_t>()) : std::string("-");
    };
    for (const Json& l : ex["layers"])
      Appendf(&out, "  %5d  %7d  %-10s  %14llu  %12llu  %12s  %12s  %12s\n", l["layer"].get<int>(),
              l["n_expert"].get<int>(), l["layout"].get<std::string>().c_str(),
              static_cast<unsigned long long>(l["bytes"].get<uint64_t>()),
              static_cast<unsigned long long>(l["W_e"].get<uint64_t>()), part(l, "gate_bytes_per_expert").c_str(),
              part(l, "up_bytes_per_expert").c_str(), part(l, "down_bytes_per_expert").c_str());
  }

  const Json& t = j["totals"];
  const uint64_t tb = t["tensor_bytes"].get<uint64_t>(), eb = t["expert_bytes"].get<uint64_t>();
  Appendf(&out, "\ntotals: %llu tensors, %llu parameters, %.2f bits/weight\n",
          static_cast<unsigned long long>(t["tensors"].get<uint64_t>()),
          static_cast<unsigned long long>(t["parameters"].get<uint64_t>()), t["bits_per_weight"].get<double>());
  Appendf(&out, "  tensor bytes      %14llu  %s\n", static_cast<unsigned long long>(tb), FormatBytes(tb).c_str());
  Appendf(&out, "  expert bytes      %14llu  %s  (%.1f%%)\n", static_cast<unsigned long long>(eb),
          FormatBytes(eb).c_str(), tb ? 100.0 * eb / tb : 0.0);
  Appendf(&out, "  non-expert bytes  %14llu  %s\n", static_cast<unsigned long long>(tb - eb),
          FormatBytes(tb - eb).c_str());
  Appendf(&out, "  file bytes        %14llu  %s\n", static_cast<unsigned long long>(t["file_bytes"].get<uint64_t>()),
          Human(t["file_bytes"]).c_str());
  return out;
}

}  // namespace estream
