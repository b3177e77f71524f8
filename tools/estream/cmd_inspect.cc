// `estream inspect FILE [--json]`: what a GGUF file holds.
//
// Architecture, hyper-parameters (the {arch}.* keys), tokenizer summary, other metadata, the
// tensor table (name, type, shape, bytes), bytes per tensor type, the routed experts (per layer:
// expert count, bytes, and W_e = bytes of one expert's gate + up + down, the unit the arena of
// docs/DESIGN.md section 4 is sized in) and totals. --json prints the same content as one JSON
// object.
// Works on any valid GGUF: models with fused expert tensors (blk.N.ffn_gate_exps.weight), older
// per-expert files (blk.N.ffn_gate.E.weight) and vocab-only files without tensors.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

using Json = nlohmann::ordered_json;

// Routed-expert bytes of one layer.
struct ExpertLayer {
  int layer = 0;
  int n_expert = 0;
  bool fused = true;  // ffn_*_exps tensors (false: per-expert ffn_*.E tensors)
  uint64_t gate = 0, up = 0, down = 0;  // bytes of the whole layer, per projection

  uint64_t bytes() const { return gate + up + down; }
  // W_e: one expert's gate + up + down.
  uint64_t per_expert() const { return n_expert > 0 ? bytes() / n_expert : 0; }
};

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

std::vector<ExpertLayer> FindExperts(const GgufFile& f) {
  std::map<int, ExpertLayer> layers;
  std::map<int, std::map<int, bool>> seen_experts;  // per-expert layout: layer -> experts seen
  for (const GgufTensorInfo& t : f.tensors()) {
    int layer, expert = -1;
    std::string rest;
    bool fused = true;
    if (!SplitBlockName(t.name, &layer, &rest)) continue;
    const int p = ExpertProjection(rest, &fused, &expert);
    if (p < 0) continue;
    ExpertLayer& el = layers[layer];
    el.layer = layer;
    el.fused = fused;
    (p == 0 ? el.gate : p == 1 ? el.up : el.down) += t.n_bytes;
    if (fused) el.n_expert = static_cast<int>(t.ne(2));
    else seen_experts[layer][expert] = true;
  }
  std::vector<ExpertLayer> out;
  for (auto& [layer, el] : layers) {
    if (!el.fused) el.n_expert = static_cast<int>(seen_experts[layer].size());
    out.push_back(el);
  }
  return out;
}

// A metadata value as JSON: scalars as themselves, arrays summarised (element type, length,
// and the values when there are at most 16 scalars).
Json ValueJson(const GgufValue& v) {
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
    case GgufType::kArray: {
      Json j = {{"array", GgufTypeName(v.elem_type)}, {"length", v.array.size()}};
      if (v.array.size() <= 16 && v.elem_type != GgufType::kArray) {
        Json values = Json::array();
        for (const GgufValue& e : v.array) values.push_back(ValueJson(e));
        j["values"] = values;
      }
      return j;
    }
  }
  return nullptr;
}

class InspectCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("file", path_, "GGUF file")->required();
    sub->add_flag("--json", json_, "Print one JSON object instead of text");
  }

  Result<int> Run() override {
    auto opened = GgufFile::Open(path_, {.mmap = false});
    if (!opened.ok()) return opened.status();
    const Json report = Build(**opened);
    if (json_) std::printf("%s\n", report.dump(2).c_str());
    else PrintText(report);
    return 0;
  }

 private:
  // Everything in one JSON object; the text form is printed from it so both say the same.
  static Json Build(const GgufFile& f) {
    Json j;
    j["file"] = f.path();
    j["file_bytes"] = f.file_size();
    j["gguf_version"] = f.version();
    j["alignment"] = f.alignment();
    j["data_offset"] = f.data_offset();
    const GgufValue* arch_v = f.Find("general.architecture");
    const std::string arch = arch_v && arch_v->type == GgufType::kString ? arch_v->str : "";
    j["architecture"] = arch;
    const GgufValue* name_v = f.Find("general.name");
    j["name"] = name_v && name_v->type == GgufType::kString ? name_v->str : "";

    Json hparams = Json::object(), tokenizer = Json::object(), other = Json::object();
    for (const GgufKv& kv : f.kvs()) {
      if (!arch.empty() && kv.key.rfind(arch + ".", 0) == 0) hparams[kv.key.substr(arch.size() + 1)] = ValueJson(kv.value);
      else if (kv.key.rfind("tokenizer.", 0) == 0) tokenizer[kv.key] = ValueJson(kv.value);
      else other[kv.key] = ValueJson(kv.value);
    }
    j["hyperparameters"] = hparams;
    j["tokenizer"] = tokenizer;
    j["metadata"] = other;

    Json tensors = Json::array();
    std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // type -> (tensors, bytes)
    uint64_t tensor_bytes = 0, n_params = 0;
    for (const GgufTensorInfo& t : f.tensors()) {
      Json shape = Json::array();
      for (int d = 0; d < t.n_dims; ++d) shape.push_back(t.dims[d]);
      tensors.push_back({{"name", t.name}, {"type", TypeName(t.type)}, {"shape", shape}, {"bytes", t.n_bytes},
                         {"offset", t.offset}});
      auto& bt = by_type[TypeName(t.type)];
      bt.first += 1;
      bt.second += t.n_bytes;
      tensor_bytes += t.n_bytes;
      n_params += t.n_elements;
    }
    j["tensors"] = tensors;
    Json types = Json::object();
    for (const auto& [type, tb] : by_type) types[type] = {{"tensors", tb.first}, {"bytes", tb.second}};
    j["bytes_by_type"] = types;

    const std::vector<ExpertLayer> experts = FindExperts(f);
    uint64_t expert_bytes = 0, w_e_max = 0;
    Json layers = Json::array();
    for (const ExpertLayer& el : experts) {
      expert_bytes += el.bytes();
      w_e_max = std::max(w_e_max, el.per_expert());
      const uint64_t n = el.n_expert > 0 ? el.n_expert : 1;
      layers.push_back({{"layer", el.layer}, {"n_expert", el.n_expert}, {"layout", el.fused ? "fused" : "per-expert"},
                        {"bytes", el.bytes()}, {"W_e", el.per_expert()}, {"gate_bytes_per_expert", el.gate / n},
                        {"up_bytes_per_expert", el.up / n}, {"down_bytes_per_expert", el.down / n}});
    }
    j["experts"] = {{"moe_layers", experts.size()},
                    {"n_expert", hparams.contains("expert_count") ? hparams["expert_count"] : Json(nullptr)},
                    {"n_expert_used", hparams.contains("expert_used_count") ? hparams["expert_used_count"] : Json(nullptr)},
                    {"W_e", w_e_max},
                    {"bytes", expert_bytes},
                    {"layers", layers}};
    j["totals"] = {{"tensors", f.tensors().size()},
                   {"parameters", n_params},
                   {"tensor_bytes", tensor_bytes},
                   {"expert_bytes", expert_bytes},
                   {"non_expert_bytes", tensor_bytes - expert_bytes},
                   {"file_bytes", f.file_size()},
                   {"bits_per_weight", n_params > 0 ? 8.0 * tensor_bytes / n_params : 0.0}};
    return j;
  }

  static std::string Human(uint64_t bytes) { return FormatBytes(bytes); }

  static void PrintText(const Json& j) {
    std::printf("file:          %s (%s)\n", j["file"].get<std::string>().c_str(), Human(j["file_bytes"]).c_str());
    std::printf("format:        GGUF v%u, alignment %u, %zu tensors, %zu metadata keys, data at byte %llu\n",
                j["gguf_version"].get<unsigned>(), j["alignment"].get<unsigned>(), j["tensors"].size(),
                j["hyperparameters"].size() + j["tokenizer"].size() + j["metadata"].size(),
                static_cast<unsigned long long>(j["data_offset"].get<uint64_t>()));
    std::printf("architecture:  %s\n", j["architecture"].get<std::string>().empty() ? "(none)"
                                                                                     : j["architecture"].get<std::string>().c_str());
    if (!j["name"].get<std::string>().empty()) std::printf("name:          %s\n", j["name"].get<std::string>().c_str());

    auto print_obj = [](const char* title, const Json& obj) {
      if (obj.empty()) return;
      std::printf("\n%s:\n", title);
      for (const auto& [k, v] : obj.items()) {
        std::string text;
        if (v.is_object() && v.contains("array"))
          text = "[" + v["array"].get<std::string>() + " x " + std::to_string(v["length"].get<size_t>()) + "]";
        else if (v.is_number_float()) {
          char buf[64];
          std::snprintf(buf, sizeof(buf), "%g", v.get<double>());
          text = buf;
        } else {
          text = v.dump();
        }
        std::printf("  %-40s %s\n", k.c_str(), text.c_str());
      }
    };
    print_obj("hyper-parameters", j["hyperparameters"]);
    print_obj("tokenizer", j["tokenizer"]);
    print_obj("metadata", j["metadata"]);

    const Json& tensors = j["tensors"];
    if (!tensors.empty()) {
      size_t w = 4;
      for (const Json& t : tensors) w = std::max(w, t["name"].get<std::string>().size());
      std::printf("\ntensors:\n  %-*s  %-5s  %-22s  %14s\n", static_cast<int>(w), "name", "type", "shape", "bytes");
      for (const Json& t : tensors) {
        std::string shape = "[";
        for (size_t d = 0; d < t["shape"].size(); ++d) shape += (d ? ", " : "") + std::to_string(t["shape"][d].get<int64_t>());
        shape += "]";
        std::printf("  %-*s  %-5s  %-22s  %14llu\n", static_cast<int>(w), t["name"].get<std::string>().c_str(),
                    t["type"].get<std::string>().c_str(), shape.c_str(),
                    static_cast<unsigned long long>(t["bytes"].get<uint64_t>()));
      }
      const uint64_t total = j["totals"]["tensor_bytes"].get<uint64_t>();
      std::printf("\nbytes per type:\n");
      for (const auto& [type, v] : j["bytes_by_type"].items())
        std::printf("  %-5s  %5llu tensors  %14llu bytes  %10s  %5.1f%%\n", type.c_str(),
                    static_cast<unsigned long long>(v["tensors"].get<uint64_t>()),
                    static_cast<unsigned long long>(v["bytes"].get<uint64_t>()), Human(v["bytes"]).c_str(),
                    total ? 100.0 * v["bytes"].get<uint64_t>() / total : 0.0);
    }

    const Json& ex = j["experts"];
    if (ex["moe_layers"].get<size_t>() > 0) {
      std::printf("\nexperts: %zu MoE layers, %s experts, top-%s; W_e (one expert's gate+up+down) = %llu bytes (%s)\n",
                  ex["moe_layers"].get<size_t>(), ex["n_expert"].dump().c_str(), ex["n_expert_used"].dump().c_str(),
                  static_cast<unsigned long long>(ex["W_e"].get<uint64_t>()), Human(ex["W_e"]).c_str());
      std::printf("  %5s  %7s  %-10s  %14s  %12s  %12s  %12s  %12s\n", "layer", "experts", "layout", "bytes", "W_e",
                  "gate/expert", "up/expert", "down/expert");
      for (const Json& l : ex["layers"])
        std::printf("  %5d  %7d  %-10s  %14llu  %12llu  %12llu  %12llu  %12llu\n", l["layer"].get<int>(),
                    l["n_expert"].get<int>(), l["layout"].get<std::string>().c_str(),
                    static_cast<unsigned long long>(l["bytes"].get<uint64_t>()),
                    static_cast<unsigned long long>(l["W_e"].get<uint64_t>()),
                    static_cast<unsigned long long>(l["gate_bytes_per_expert"].get<uint64_t>()),
                    static_cast<unsigned long long>(l["up_bytes_per_expert"].get<uint64_t>()),
                    static_cast<unsigned long long>(l["down_bytes_per_expert"].get<uint64_t>()));
    }

    const Json& t = j["totals"];
    const uint64_t tb = t["tensor_bytes"].get<uint64_t>(), eb = t["expert_bytes"].get<uint64_t>();
    std::printf("\ntotals: %llu tensors, %llu parameters, %.2f bits/weight\n",
                static_cast<unsigned long long>(t["tensors"].get<uint64_t>()),
                static_cast<unsigned long long>(t["parameters"].get<uint64_t>()), t["bits_per_weight"].get<double>());
    std::printf("  tensor bytes      %14llu  %s\n", static_cast<unsigned long long>(tb), Human(tb).c_str());
    std::printf("  expert bytes      %14llu  %s  (%.1f%%)\n", static_cast<unsigned long long>(eb), Human(eb).c_str(),
                tb ? 100.0 * eb / tb : 0.0);
    std::printf("  non-expert bytes  %14llu  %s\n", static_cast<unsigned long long>(tb - eb), Human(tb - eb).c_str());
    std::printf("  file bytes        %14llu  %s\n", static_cast<unsigned long long>(t["file_bytes"].get<uint64_t>()),
                Human(t["file_bytes"]).c_str());
  }

  std::string path_;
  bool json_ = false;
};

}  // namespace
ESTREAM_REGISTER_COMMAND(InspectCommand, "inspect",
                         "Show a GGUF file: architecture, hyper-parameters, tensors, bytes per type, expert sizes (W_e)");
}  // namespace estream::cli
