#include "model/arch.h"

namespace estream::model {
namespace {

const ArchTraits* const* AllArchs() {
  static const ArchTraits* const kAll[] = {&OlmoeArch(), &Qwen3MoeArch(), &LlamaMoeArch(), &Deepseek2Arch(),
                                           &Lfm2MoeArch(), nullptr};
  return kAll;
}

}  // namespace

const ArchTraits* FindArch(std::string_view gguf_name) {
  for (const ArchTraits* const* a = AllArchs(); *a; ++a)
    if (gguf_name == (*a)->gguf_name) return *a;
  return nullptr;
}

std::string SupportedArchNames() {
  std::string s;
  for (const ArchTraits* const* a = AllArchs(); *a; ++a) {
    if (!s.empty()) s += ", ";
    s += (*a)->gguf_name;
  }
  return s;
}

}  // namespace estream::model
