// `estream inspect FILE [--json]`: what a GGUF file holds (SummarizeGguf, src/gguf/summary.h,
// which says what is shown), printed as text or as one JSON object.
#include <cstdio>
#include <string>

#include "gguf/gguf.h"
#include "gguf/summary.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

class InspectCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("file", path_, "GGUF file")->required();
    sub->add_flag("--json", json_, "Print one JSON object instead of text");
  }

  Result<int> Run() override {
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path_, {.mmap = false}));
    const GgufSummary summary = SummarizeGguf(*file);
    if (json_) std::printf("%s\n", GgufSummaryJson(summary).c_str());
    else std::fputs(GgufSummaryText(summary).c_str(), stdout);
    return 0;
  }

 private:
  std::string path_;
  bool json_ = false;
};

}  // namespace
ESTREAM_REGISTER_COMMAND(InspectCommand, "inspect",
                         "Show a GGUF file: architecture, hyper-parameters, tensors, bytes per type, expert sizes (W_e)");
}  // namespace estream::cli
