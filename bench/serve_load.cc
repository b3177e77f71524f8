// Load generator for `estream serve` (and, for comparison, any server that takes the same
// OpenAI-style bodies, e.g. llama-server): C concurrent clients, each on its own keep-alive
// connection (--keep-alive 0: a new connection per request), send requests of T prompt tokens for a fixed number of requests per level; prints
// throughput (requests/s, prompt tokens/s) and latency percentiles per concurrency level.
//
//   serve_load --port 8080 [--host 127.0.0.1] [--clients 1,4,16,64] [--tokens 128] [--requests N]
//              [--vocab V] [--api-key KEY] [--warmup N] [--route echo|next|embed] [--pooling P]
//              [--keep-alive 1|0]
//
// --route echo (default): POST /v1/completions {prompt: ids, max_tokens: 0, echo: true,
//   logprobs: 1} (lm-eval's loglikelihood: every prompt position's logprob; estream only).
// --route next: POST /v1/completions {prompt: ids, max_tokens: 1, logprobs: 1} (the next token
//   and its top-1 logprob; llama-server serves the same body).
// --route embed: POST /v1/embeddings {input: ids, pooling: P} (P = last by default; --pooling ""
//   leaves the field out, for servers that fix the pooling at start, as llama-server --pooling).
//
// Prompts are random token ids in [10, V) (a different prompt per request, fixed seed), so no
// cache can answer them. --requests is per level (default max(16, 2 x clients)): one number for
// every level, or a list with one count per --clients level (e.g. --clients 1,64 --requests 8,128).
// From the server's /metrics before and after each level: the engine batches run, their mean
// jobs, and the share of the level's wall time the engine was busy (engine seconds / seconds);
// for streamed models (--budget) also the expert bytes read per request (expert_gb_per_request,
// 1e9 bytes) and the share of the engine's time its compute threads waited for expert data
// (bubble_share = bubble seconds / engine seconds). All 0 for servers without these metrics.
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) v.push_back(std::atoi(x.c_str()));
  return v;
}

// The value of an unlabelled sample `name` in Prometheus text, 0 when absent.
double Sample(const std::string& text, const std::string& name) {
  size_t at = 0;
  while ((at = text.find(name + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::atof(text.c_str() + at + name.size() + 1);
    at += name.size();
  }
  return 0;
}

struct EngineFigures {
  double batches = 0, jobs = 0, seconds = 0, bubble = 0, expert_bytes = 0;
};

EngineFigures ReadMetrics(const std::string& host, int port, const httplib::Headers& headers) {
  httplib::Client c(host, port);
  auto r = c.Get("/metrics", headers);
  if (!r || r->status != 200) return {};
  return {Sample(r->body, "estream_batches_total"), Sample(r->body, "estream_batch_jobs_sum"),
          Sample(r->body, "estream_engine_seconds_total"), Sample(r->body, "estream_bubble_seconds_total"),
          Sample(r->body, "estream_expert_bytes_read_total")};
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", key, clients_list = "1,4,16,64", route = "echo", pooling = "last";
  std::string requests_list;
  int port = 8080, tokens = 128, vocab = 50000, warmup = 2, keep_alive = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "serve_load: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--host") host = next();
    else if (a == "--port") port = std::atoi(next().c_str());
    else if (a == "--clients") clients_list = next();
    else if (a == "--tokens") tokens = std::atoi(next().c_str());
    else if (a == "--requests") requests_list = next();
    else if (a == "--vocab") vocab = std::atoi(next().c_str());
    else if (a == "--api-key") key = next();
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--route") route = next();
    else if (a == "--pooling") pooling = next();
    else if (a == "--keep-alive") keep_alive = std::atoi(next().c_str());
    else {
      std::fprintf(stderr, "serve_load: unknown argument %s (see the comment at the top of bench/serve_load.cc)\n", a.c_str());
      return 2;
    }
  }
  if (tokens < 1 || vocab <= 10) {
    std::fprintf(stderr, "serve_load: --tokens must be >= 1 and --vocab > 10\n");
    return 2;
  }
  if (route != "echo" && route != "next" && route != "embed") {
    std::fprintf(stderr, "serve_load: --route must be echo, next or embed\n");
    return 2;
  }
  const std::vector<int> levels = ParseList(clients_list), requests = ParseList(requests_list);
  if (!requests.empty() && requests.size() != 1 && requests.size() != levels.size()) {
    std::fprintf(stderr, "serve_load: --requests takes one count or one per --clients level\n");
    return 2;
  }
  const std::string path = route == "embed" ? "/v1/embeddings" : "/v1/completions";
  httplib::Headers headers;
  if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
  std::mt19937 rng(1234);
  auto body = [&](std::mt19937& r) {
    std::vector<int> ids(static_cast<size_t>(tokens));
    for (int& t : ids) t = std::uniform_int_distribution<int>(10, vocab - 1)(r);
    if (route == "next") return nlohmann::json({{"prompt", ids}, {"max_tokens", 1}, {"logprobs", 1}}).dump();
    if (route == "embed") {
      nlohmann::json j = {{"input", ids}};
      if (!pooling.empty()) j["pooling"] = pooling;
      return j.dump();
    }
    return nlohmann::json({{"prompt", ids}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}}).dump();
  };
  {  // warm-up: fault in the weights, size the buffers
    httplib::Client c(host, port);
    c.set_read_timeout(600, 0);
    c.set_keep_alive(keep_alive != 0);
    c.set_tcp_nodelay(true);
    for (int i = 0; i < warmup; ++i) {
      auto r = c.Post(path, headers, body(rng), "application/json");
      if (!r || r->status != 200) {
        std::fprintf(stderr, "serve_load: warm-up request to %s failed (%s)\n", path.c_str(),
                     r ? r->body.c_str() : "no response");
        return 1;
      }
    }
  }
  std::printf("clients,requests,seconds,requests_per_s,prompt_tokens_per_s,p50_ms,p99_ms,errors,batches,"
              "jobs_per_batch,engine_busy,no_response,expert_gb_per_request,bubble_share\n");
  for (size_t level = 0; level < levels.size(); ++level) {
    const int clients = levels[level];
    const int given = requests.empty() ? 0 : requests[requests.size() == 1 ? 0 : level];
    const int n = given > 0 ? given : std::max(16, 2 * clients);
    std::vector<std::string> bodies;
    for (int i = 0; i < n; ++i) bodies.push_back(body(rng));
    const EngineFigures before = ReadMetrics(host, port, headers);
    std::atomic<int> next{0}, errors{0}, no_response{0};
    std::vector<std::vector<double>> lat(static_cast<size_t>(clients));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        httplib::Client cli(host, port);
        cli.set_read_timeout(600, 0);
        cli.set_keep_alive(keep_alive != 0);
        cli.set_tcp_nodelay(true);  // headers and body go out at once (no Nagle wait on the server's ACK)
        for (int i; (i = next++) < n;) {
          const auto s = std::chrono::steady_clock::now();
          auto r = cli.Post(path, headers, bodies[static_cast<size_t>(i)], "application/json");
          if (!r || r->status != 200) {
            // A request without an answer (`no_response`: the connection broke or timed out) is an
            // error too; the first few are described on stderr.
            if (!r) ++no_response;
            if (++errors <= 3)
              std::fprintf(stderr, "serve_load: request %d: %s\n", i,
                           r ? (std::to_string(r->status) + " " + r->body.substr(0, 200)).c_str()
                             : ("no response (" + httplib::to_string(r.error()) + ")").c_str());
          }
          lat[static_cast<size_t>(c)].push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
        }
      });
    for (auto& t : threads) t.join();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const EngineFigures after = ReadMetrics(host, port, headers);
    const double batches = after.batches - before.batches;
    std::vector<double> all;
    for (const auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    const double engine_secs = after.seconds - before.seconds;
    std::printf("%d,%d,%.3f,%.3f,%.1f,%.1f,%.1f,%d,%.0f,%.2f,%.3f,%d,%.3f,%.3f\n", clients, n, secs, n / secs, n * tokens / secs,
                Percentile(all, 0.5), Percentile(all, 0.99), errors.load(), batches,
                batches > 0 ? (after.jobs - before.jobs) / batches : 0.0, engine_secs / secs,
                no_response.load(), (after.expert_bytes - before.expert_bytes) / n / 1e9,
                engine_secs > 0 ? (after.bubble - before.bubble) / engine_secs : 0.0);
    std::fflush(stdout);
  }
  return 0;
}
