// What the CLI writes, as a user reads it: `estream bench`'s --json and --csv (the same in both
// modes), `estream prefill --logprobs`'s table, its warning for flags that do nothing on a run
// that does not stream, and the lanes of a --trace. Runs the built binary on a tiny model that
// the test makes with `estream synth` and `estream pack`. Nothing is timed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_test_util.h"

namespace estream {
namespace {

using cli_test::CliResult;
using Json = nlohmann::json;

class CliOutput : public cli_test::TinyModelCli {
 protected:
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // "1,2,...": n token ids below the tiny vocabulary's 512.
  static std::string Ids(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(1 + (i * 37) % 500);
    return s;
  }
};

// Both modes write one JSON document (scripts/plot_frontier.py reads "runs") and the CSV, with a
// row per (configuration, length); a configuration that fails gives error rows and exit code 1.
TEST_F(CliOutput, BenchWritesTheSameJsonAndCsvInBothModes) {
  for (const std::string mode : {"", " --in-process"}) {
    const std::string json = dir_->File("b.json"), csv = dir_->File("b.csv");
    std::remove(json.c_str());
    std::remove(csv.c_str());
    const CliResult r = Run("bench -m " + Packed() + " --prompt-lengths 8,16 --budgets 100M,1M --resident -t 1" +
                            mode + " --json " + json + " --csv " + csv);
    EXPECT_EQ(r.exit_code, 1) << mode << "\n" << r.out << r.err;  // the 1M runs fail
    const Json doc = Json::parse(Read(json), nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << mode << ": --json is not one JSON document:\n" << Read(json);
    EXPECT_EQ(doc["in_process"], !mode.empty());
    ASSERT_EQ(doc["runs"].size(), 6u) << doc.dump();
    std::set<std::string> budgets;
    for (const Json& run : doc["runs"]) {
      budgets.insert(run["budget"].get<std::string>());
      if (run["budget"] == "1M") {
        EXPECT_NE(run["error"].get<std::string>().find("too small"), std::string::npos) << run.dump();
        continue;
      }
      EXPECT_FALSE(run.contains("error")) << run.dump();
      EXPECT_GT(run["seconds"].get<double>(), 0) << run.dump();
      EXPECT_GT(run["peak_rss_bytes"].get<uint64_t>(), 0u) << run.dump();
      EXPECT_EQ(run.contains("config"), run["budget"] == "100M") << run.dump();
      if (!mode.empty()) {
        EXPECT_TRUE(run.contains("gops") && run.contains("cpu_seconds_per_thread")) << run.dump();
      }
    }
    EXPECT_EQ(budgets, (std::set<std::string>{"resident", "100M", "1M"}));
    std::istringstream lines(Read(csv));
    std::string header, line;
    std::getline(lines, header);
    EXPECT_EQ(header.rfind("n_tokens,budget,schedule,seconds,", 0), 0u) << header;
    int rows = 0;
    while (std::getline(lines, line)) ++rows;
    EXPECT_EQ(rows, 6) << mode << "\n" << Read(csv);
  }
}

// --logprobs in text: one row per scored token (position, id, logprob, piece), the values of
// --json; a long prompt shows its first and last 32 rows and says how many were left out.
TEST_F(CliOutput, PrefillLogprobsTable) {
  const CliResult j = Run("prefill -m " + Model() + " --tokens " + Ids(10) + " --logprobs --json -t 1");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const std::vector<float> lp = Json::parse(j.out)["logprobs"].get<std::vector<float>>();
  ASSERT_EQ(lp.size(), 9u);
  const CliResult t = Run("prefill -m " + Model() + " --tokens " + Ids(10) + " --logprobs -t 1");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("position     token    logprob  piece"), std::string::npos) << t.out;
  for (size_t i = 0; i < lp.size(); ++i) {
    char row[64];
    std::snprintf(row, sizeof(row), "  %8zu  %8d  %9.4f  \"", i + 1, 1 + static_cast<int>((i + 1) * 37 % 500), lp[i]);
    EXPECT_NE(t.out.find(row), std::string::npos) << "missing row: " << row << "\n" << t.out;
  }
  EXPECT_NE(t.out.find("log-likelihood:"), std::string::npos);

  const CliResult l = Run("prefill -m " + Model() + " --tokens " + Ids(101) + " --logprobs -t 1");
  ASSERT_EQ(l.exit_code, 0) << l.err;
  EXPECT_NE(l.out.find("... 36 rows left out (--json prints every one)"), std::string::npos) << l.out;
  EXPECT_NE(l.out.find("\n        32  "), std::string::npos) << l.out;   // the last of the first 32
  EXPECT_EQ(l.out.find("\n        33  "), std::string::npos) << l.out;   // left out
  EXPECT_EQ(l.out.find("\n        68  "), std::string::npos) << l.out;   // left out
  EXPECT_NE(l.out.find("\n        69  "), std::string::npos) << l.out;   // the first of the last 32
  EXPECT_NE(l.out.find("\n       100  "), std::string::npos) << l.out;
}

// Streaming flags on a run that does not stream: one warning line naming them, and the run.
TEST_F(CliOutput, PrefillWarnsAboutStreamingFlagsThatDoNothing) {
  const CliResult u = Run("prefill -m " + Model() + " -p hi -t 1 --schedule on-demand --expert-cache auto");
  EXPECT_EQ(u.exit_code, 0) << u.err;
  EXPECT_EQ(std::count(u.err.begin(), u.err.end(), '\n'), 1) << u.err;
  EXPECT_EQ(u.err.rfind("estream prefill: warning: --schedule, --expert-cache do nothing here: ", 0), 0u) << u.err;
  EXPECT_NE(u.err.find("is not packed"), std::string::npos) << u.err;
  const CliResult p = Run("prefill -m " + Packed() + " -p hi -t 1 --queue-depth 4");
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.err.find("warning: --queue-depth does nothing here: no --budget"), std::string::npos) << p.err;
  // Streamed, or no such flag: no warning.
  for (const std::string& args : {"-m " + Packed() + " -p hi -t 1 --budget 100M --schedule on-demand",
                                  "-m " + Model() + " -p hi -t 1"}) {
    const CliResult r = Run("prefill " + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("warning"), std::string::npos) << args << "\n" << r.err;
  }
}

// A streamed prefill's trace names the lanes it has events on: compute and loader (the engine
// checks checksums on the compute threads, so no feeder lane), and every event is on one of them.
TEST_F(CliOutput, TraceNamesOnlyTheLanesItUses) {
  const std::string trace = dir_->File("t.json");
  ASSERT_EQ(Run("prefill -m " + Packed() + " -p hi -t 1 --budget 100M --trace " + trace).exit_code, 0);
  const Json j = Json::parse(Read(trace));
  std::set<int> named, used;
  std::set<std::string> names;
  for (const Json& e : j["traceEvents"]) {
    if (e["ph"] == "M") {
      named.insert(e["tid"].get<int>());
      names.insert(e["args"]["name"].get<std::string>());
    } else {
      used.insert(e["tid"].get<int>());
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"compute", "loader (reads)"}));
  EXPECT_EQ(named, used);
}

}  // namespace
}  // namespace estream
