// estream bench: latency / memory of prefill over prompt lengths x schedules x memory budgets
// (and the all-resident run) on one (packed) model. Every configuration runs in a fresh child
// process (this binary re-executed as `estream prefill --json`), so each peak RSS is that run's.
// --in-process: one engine per configuration in this process, the prompt lengths run on it by
// the library's prompt-length benchmark (profiler::BenchPromptLengths): load once, op rates and
// CPU time per thread (peak RSS is then the configuration's, all lengths together). Both modes
// print the same table and write the same --json document and --csv rows (in-process rows add
// the op rate, CPU time and per-part timing).
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "base/json_text.h"
#include "base/status.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "profiler/measure.h"
#include "profiler/prompt_lengths.h"
#include "tools/estream/command.h"
#include "tools/estream/common_flags.h"
#include "tools/estream/response_json.h"

namespace estream::cli {
namespace {

class BenchCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("-m,--model", model_, "packed model (estream pack) or GGUF")->required();
    sub->add_option("--prompt-lengths", lengths_, "prompt lengths (default 128,256,512,1024,2048,4096)")
        ->delimiter(',');
    sub->add_option("--schedules", schedules_, "schedules (default early)")->delimiter(',')
        ->check(CLI::IsMember({"on-demand", "after-routing", "early"}));
    sub->add_option("--budgets", budgets_, "memory budgets, e.g. 1G,2G (K/M/G suffixes; default: none, the resident run only)")->delimiter(',');
    sub->add_flag("--resident", resident_, "also run with all experts resident (no budget)");
    sub->add_option("--repeat", repeat_, "runs per configuration (median reported)")->capture_default_str()->check(PositiveInt());
    AddThreadsFlag(sub, &threads_);
    sub->add_flag("--in-process", in_process_, "run every prompt length on one engine per configuration in this "
                  "process (load once; adds op rates and CPU time per thread; peak RSS is the configuration's, "
                  "over all its lengths)");
    sub->add_option("--json", json_, "write all results to FILE as one JSON object {\"model\", \"in_process\", "
                    "\"runs\": [one object per run]} (scripts/plot_frontier.py reads it)");
    sub->add_option("--csv", csv_, "write all results to FILE as CSV, one row per run");
  }
  Result<int> Run() override {
    if (lengths_.empty()) lengths_ = {128, 256, 512, 1024, 2048, 4096};
    if (schedules_.empty()) schedules_ = {"early"};
    if (budgets_.empty() && !resident_) resident_ = true;
    ESTREAM_RETURN_IF_ERROR(CheckWritableOutput(json_, "--json"));
    ESTREAM_RETURN_IF_ERROR(CheckWritableOutput(csv_, "--csv"));
    for (const std::string& b : budgets_) {
      if (Result<uint64_t> bytes = ParseBudget(b); !bytes.ok())
        return Status::InvalidArgument("--budgets: " + bytes.status().message());
    }
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(model_, {.mmap = false}));
    const GgufTensorInfo* emb = f->FindTensor("token_embd.weight");
    if (!emb) return Status::Corruption(model_ + ": tensor 'token_embd.weight' is missing");
    const int64_t n_vocab = emb->ne(1);
    if (in_process_) return RunInProcess(n_vocab);
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return Status::Internal("cannot find this executable (/proc/self/exe)");
    exe[n] = 0;
    struct Cfg { std::string schedule, budget; };
    std::vector<Cfg> cfgs;
    if (resident_) cfgs.push_back({"", ""});
    for (const std::string& b : budgets_)
      for (const std::string& s : schedules_) cfgs.push_back({s, b});
    nlohmann::json rows = nlohmann::json::array();
    std::printf("%-10s %-14s %6s %10s %9s %10s %8s %9s %6s\n", "budget", "schedule", "T", "latency_s", "tok/s",
                "peak_rss", "bubble", "read_GB/s", "G/B/Q");
    for (int T : lengths_) {
      const std::string tokens = "/tmp/estream_bench_tokens_" + std::to_string(getpid()) + ".txt";
      {
        std::ofstream out(tokens);
        for (int i = 0; i < T; ++i) out << (i ? "," : "") << (static_cast<int64_t>(i) * 7919 + 13) % n_vocab;
      }
      for (const Cfg& c : cfgs) {
        std::string cmd = std::string("'") + exe + "' prefill -m '" + model_ + "' --tokens @" + tokens +
                          " --json --top-k 1 --repeat " + std::to_string(repeat_);
        if (threads_ > 0) cmd += " -t " + std::to_string(threads_);
        if (!c.budget.empty()) cmd += " --budget " + c.budget + " --schedule " + c.schedule;
        cmd += " 2>&1";
        std::string out;
        if (std::FILE* p = popen(cmd.c_str(), "r")) {
          char buf[4096];
          size_t k;
          while ((k = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, k);
          pclose(p);
        }
        nlohmann::json row{{"n_tokens", T}, {"budget", c.budget.empty() ? "resident" : c.budget},
                           {"schedule", c.budget.empty() ? "resident" : c.schedule}};
        const size_t brace = out.find('{');
        nlohmann::json j = brace == std::string::npos ? nlohmann::json() : nlohmann::json::parse(out.substr(brace), nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("seconds")) {
          row["error"] = out.substr(0, out.find('\n'));
          std::printf("%-10s %-14s %6d  error: %s\n", row["budget"].get<std::string>().c_str(),
                      row["schedule"].get<std::string>().c_str(), T, row["error"].get<std::string>().c_str());
        } else {
          for (const char* k : {"seconds", "tokens_per_second", "peak_rss_bytes", "bubble_rate", "bubble_seconds",
                                "read_gbps", "bytes_read", "expert_seconds", "nonexpert_seconds", "seconds_all"})
            if (j.contains(k)) row[k] = j[k];
          if (j.contains("config")) row["config"] = j["config"];
          std::string gbq = "-";
          if (j.contains("config"))
            gbq = std::to_string(j["config"]["group_size"].get<int>()) + "/" + std::to_string(j["config"]["banks"].get<int>()) +
                  "/" + std::to_string(j["config"]["queue_depth"].get<int>());
          std::printf("%-10s %-14s %6d %10.3f %9.1f %8.0fMi %7.1f%% %9.2f %6s\n", row["budget"].get<std::string>().c_str(),
                      row["schedule"].get<std::string>().c_str(), T, j["seconds"].get<double>(),
                      j["tokens_per_second"].get<double>(), j["peak_rss_bytes"].get<double>() / (1 << 20),
                      100 * j.value("bubble_rate", 0.0), j.value("read_gbps", 0.0), gbq.c_str());
        }
        std::fflush(stdout);
        rows.push_back(row);
      }
      std::remove(tokens.c_str());
    }
    return Finish(rows, /*in_process=*/false);
  }

 private:
  // Writes --json (one document: {"model", "in_process", "runs": [...]}, one object per run) and
  // --csv (one row per run) from the rows of either mode, and returns the exit code: 1 when any
  // run failed (its row's "error" says why).
  Result<int> Finish(const nlohmann::json& rows, bool in_process) const {
    nlohmann::json doc{{"model", model_}, {"in_process", in_process}, {"runs", rows}};
    if (!json_.empty()) {
      std::ofstream o(json_);
      o << DumpJson(doc, 2) << "\n";
      if (!o) return Status::IOError(json_ + ": cannot write");
    }
    if (!csv_.empty()) {
      std::ofstream o(csv_);
      o << "n_tokens,budget,schedule,seconds,tokens_per_second,peak_rss_bytes,bubble_rate,read_gbps,bytes_read,"
           "group_size,banks,queue_depth,error\n";
      for (const auto& r : rows) {
        const bool c = r.contains("config");
        o << r["n_tokens"] << "," << r["budget"].get<std::string>() << "," << r["schedule"].get<std::string>() << ","
          << r.value("seconds", 0.0) << "," << r.value("tokens_per_second", 0.0) << ","
          << r.value("peak_rss_bytes", uint64_t{0}) << "," << r.value("bubble_rate", 0.0) << ","
          << r.value("read_gbps", 0.0) << "," << r.value("bytes_read", uint64_t{0}) << ","
          << (c ? r["config"]["group_size"].get<int>() : 0) << "," << (c ? r["config"]["banks"].get<int>() : 0) << ","
          << (c ? r["config"]["queue_depth"].get<int>() : 0) << ","
          << (r.contains("error") ? DumpJson(r["error"]) : "") << "\n";
      }
      if (!o) return Status::IOError(csv_ + ": cannot write");
    }
    const auto failed = std::count_if(rows.begin(), rows.end(), [](const nlohmann::json& r) { return r.contains("error"); });
    if (failed > 0) {
      std::fprintf(stderr, "estream bench: %lld of %zu runs failed (their error column says why)\n",
                   static_cast<long long>(failed), rows.size());
      return 1;
    }
    return 0;
  }

  // The prompt: token i is (7919 i + 13) mod n_vocab, as in the child-process runs.
  static std::vector<int32_t> BenchTokens(int n, int64_t n_vocab) {
    std::vector<int32_t> ids(n);
    for (int i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7919 + 13) % n_vocab);
    return ids;
  }

  // One engine per configuration (its peak RSS reset before the load where the kernel allows:
  // the figure is then that configuration's, all its lengths together), the rows as the child
  // runs' (the same keys), plus the op rate and CPU time per thread. A configuration that fails
  // to load or run gives an error row per length, and the others still run.
  Result<int> RunInProcess(int64_t n_vocab) {
    int longest = 0;
    for (int T : lengths_) longest = std::max(longest, T);
    const std::vector<int32_t> ids = BenchTokens(longest, n_vocab);
    struct Cfg { std::string schedule, budget; };
    std::vector<Cfg> cfgs;
    if (resident_) cfgs.push_back({"", ""});
    for (const std::string& b : budgets_)
      for (const std::string& sch : schedules_) cfgs.push_back({sch, b});
    std::printf("%-10s %-14s %6s %10s %9s %10s %8s %9s %6s %8s %9s\n", "budget", "schedule", "T", "latency_s", "tok/s",
                "peak_rss", "bubble", "read_GB/s", "G/B/Q", "GOP/s", "cpu_s/thr");
    nlohmann::json rows = nlohmann::json::array();
    bool warned = false;
    for (const Cfg& c : cfgs) {
      const std::string budget = c.budget.empty() ? "resident" : c.budget;
      const std::string schedule = c.budget.empty() ? "resident" : c.schedule;
      EngineOptions eo{.n_threads = threads_};
      if (!c.budget.empty()) {
        ESTREAM_ASSIGN_OR_RETURN(eo.budget_bytes, ParseBudget(c.budget));
        ESTREAM_ASSIGN_OR_RETURN(eo.schedule, ParseSchedule(c.schedule));
        eo.budget_tokens = longest;
      }
      profiler::ReleaseFreedMemory();  // the previous engine's pages, before this one's budget check
      const bool exact = profiler::ResetPeakRssForMeasurement();
      if (!exact && !warned) {
        std::fprintf(stderr, "estream bench: warning: %s\n", profiler::CumulativePeakWarning().c_str());
        warned = true;
      }
      Result<std::unique_ptr<Engine>> engine = Engine::Load(model_, eo);
      Result<profiler::PromptLengthsResult> r =
          engine.ok() ? profiler::BenchPromptLengths(**engine, ids, lengths_, repeat_)
                      : Result<profiler::PromptLengthsResult>(engine.status());
      if (!r.ok()) {
        const std::string error = r.status().message();
        for (int T : lengths_) {
          rows.push_back({{"n_tokens", T}, {"budget", budget}, {"schedule", schedule}, {"error", error}});
          std::printf("%-10s %-14s %6d  error: %s\n", budget.c_str(), schedule.c_str(), T, error.c_str());
        }
        continue;
      }
      for (const profiler::PromptLengthPoint& p : r->points) {
        const Response& last = p.last;
        nlohmann::json row{{"n_tokens", p.n_tokens}, {"budget", budget}, {"schedule", schedule},
                           {"seconds", p.seconds}, {"tokens_per_second", static_cast<double>(p.n_tokens) / p.seconds},
                           {"peak_rss_bytes", r->peak_rss_bytes}, {"peak_rss_exact", exact},
                           {"bubble_rate", last.bubble_rate}, {"bubble_seconds", last.bubble_seconds},
                           {"read_gbps", last.read_gbps}, {"bytes_read", last.bytes_read},
                           {"expert_seconds", last.expert_seconds}, {"nonexpert_seconds", last.nonexpert_seconds},
                           {"seconds_all", p.seconds_all}, {"gops", p.gops},
                           {"cpu_seconds_per_thread", p.cpu_seconds_per_thread},
                           {"timing", {{"attention", p.timing.attention},
                                       {"attention_projections", p.timing.attention_projections},
                                       {"attention_kernel", p.timing.attention_kernel}, {"router", p.timing.router},
                                       {"experts", p.timing.experts}, {"dense_ffn", p.timing.dense_ffn},
                                       {"head", p.timing.embed + p.timing.head}}}};
        std::string gbq = "-";
        if (last.config.streamed) {
          row["config"] = StreamConfigJson(last);
          gbq = std::to_string(last.config.group_size) + "/" + std::to_string(last.config.banks) + "/" +
                std::to_string(last.config.queue_depth);
        }
        std::printf("%-10s %-14s %6lld %10.3f %9.1f %8.0fMi %7.1f%% %9.2f %6s %8.1f %9.3f\n", budget.c_str(),
                    schedule.c_str(), static_cast<long long>(p.n_tokens), p.seconds,
                    static_cast<double>(p.n_tokens) / p.seconds, static_cast<double>(r->peak_rss_bytes) / (1 << 20),
                    100 * last.bubble_rate, last.read_gbps, gbq.c_str(), p.gops, p.cpu_seconds_per_thread);
        rows.push_back(std::move(row));
      }
      std::fflush(stdout);
    }
    return Finish(rows, /*in_process=*/true);
  }

  std::string model_;
  std::vector<int> lengths_;
  std::vector<std::string> schedules_;
  std::vector<std::string> budgets_;
  bool resident_ = false;
  bool in_process_ = false;
  int repeat_ = 1;
  int threads_ = 0;
  std::string json_, csv_;
};

ESTREAM_REGISTER_COMMAND(BenchCommand, "bench",
                         "Prefill latency, tokens/s, peak RSS, bubble rate and read bandwidth over prompt lengths x schedules x "
                         "memory budgets (each run in a fresh process)");

}  // namespace
}  // namespace estream::cli
