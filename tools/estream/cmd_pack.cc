// `estream pack`: a GGUF MoE model -> the packed layout (src/io/packed_layout.h), streamed
// expert by expert with bounded memory.
#include <unistd.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "base/memory.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "pack/pack_model.h"
#include "pack/packed_layout.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

class PackCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("model", input_, "Source GGUF model (olmoe, qwen3moe, llama/Mixtral, deepseek2, lfm2moe)")->required();
    sub->add_option("-o,--output", output_, "Packed GGUF to write (written to a temporary name, then renamed)")
        ->required();
    sub->add_option("--permutation", permutation_,
                    "JSON file: {\"LAYER\": [expert at position 0, expert at position 1, ...], ...}; layers not "
                    "listed keep the identity order");
    sub->add_option("-t,--threads", options_threads_, "Repacking threads (default 1: the work is mostly I/O)")
        ->check(CLI::Range(1, kMaxThreads));
    sub->add_flag("--json", json_, "Print a JSON summary on stdout");
    sub->add_flag("-q,--quiet", quiet_, "No progress output");
  }

  Result<int> Run() override {
    io::PackOptions options;
    options.threads = options_threads_;
    if (!permutation_.empty()) {
      Result<io::ExpertPermutations> perms = io::ReadPermutationFile(permutation_);
      if (!perms.ok()) return perms.status();
      options.permutations = std::move(perms).value();
    }
    // Pages read with pread: the source is never mapped, so RSS stays at a few records.
    Result<std::unique_ptr<GgufFile>> in = GgufFile::Open(input_, {.mmap = false});
    if (!in.ok()) return in.status();
    // The loader's own checks (hyper-parameters, every tensor's presence, shape and type), no
    // tensor read: a model that prefill would refuse is refused here, with the same message,
    // instead of being packed into a file that cannot run. An already packed input is left to
    // PackModel, which says so.
    if (!io::IsPackedModel(**in)) ESTREAM_RETURN_IF_ERROR(model::Model::Validate(**in));

    const bool tty = ::isatty(STDERR_FILENO) != 0;
    double last_print = -1;
    int last_decile = -1;
    if (!quiet_) {
      options.progress = [&](const io::PackProgress& p) {
        const double frac = p.bytes_total ? static_cast<double>(p.bytes_done) / p.bytes_total : 1.0;
        const int decile = static_cast<int>(frac * 10);
        // On a terminal: one updating line, at most 5 times a second; otherwise a line per 10%.
        if (tty ? p.seconds - last_print < 0.2 : decile == last_decile) return;
        last_print = p.seconds;
        last_decile = decile;
        const double mbps = p.seconds > 0 ? p.bytes_done / 1e6 / p.seconds : 0;
        std::fprintf(stderr, "%spack: %5.1f%%  %s / %s  %.0f MB/s  %s%s", tty ? "\r" : "", 100 * frac,
                     FormatBytes(p.bytes_done).c_str(), FormatBytes(p.bytes_total).c_str(), mbps,
                     p.layer >= 0 ? ("layer " + std::to_string(p.layer)).c_str() : "dense tensors",
                     tty ? "   " : "\n");
      };
    }
    Result<io::PackStats> stats = io::PackModel(**in, output_, options);
    if (!quiet_ && tty) std::fprintf(stderr, "\n");
    if (!stats.ok()) return stats.status();
    const io::PackStats& s = *stats;
    const double mbps = s.seconds > 0 ? s.output_bytes / 1e6 / s.seconds : 0;
    if (!quiet_)
      std::fprintf(stderr, "pack: wrote %s (%s): %d layers, %lld expert records (%s), %s dense, in %.1f s, %.0f MB/s, "
                           "peak RSS %s\n",
                   output_.c_str(), FormatBytes(s.output_bytes).c_str(), s.layers, static_cast<long long>(s.records),
                   FormatBytes(s.record_bytes).c_str(), FormatBytes(s.dense_bytes).c_str(), s.seconds, mbps,
                   FormatBytes(PeakRssBytes()).c_str());
    if (json_) {
      nlohmann::json j = {{"input", input_},
                          {"output", output_},
                          {"layers", s.layers},
                          {"records", s.records},
                          {"input_bytes", s.input_bytes},
                          {"bytes", s.output_bytes},
                          {"record_bytes", s.record_bytes},
                          {"dense_bytes", s.dense_bytes},
                          {"seconds", s.seconds},
                          {"mb_per_s", mbps},
                          {"peak_rss_bytes", PeakRssBytes()}};
      std::printf("%s\n", DumpJson(j, 2).c_str());
    }
    return 0;
  }

 private:
  std::string input_;
  std::string output_;
  std::string permutation_;
  int options_threads_ = 1;
  bool json_ = false;
  bool quiet_ = false;
};

}  // namespace
ESTREAM_REGISTER_COMMAND(PackCommand, "pack",
                         "Pack a GGUF MoE model for expert streaming: per layer one region of 4 KiB-aligned expert records "
                         "[gate|up|down] in the kernels' layout, with checksums (the output is still a GGUF)");
}  // namespace estream::cli
