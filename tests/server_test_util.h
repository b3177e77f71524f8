// Helpers for the server tests: a free port, a fake engine (BatchRunner) with a gate, HTTP calls.
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "estream/engine.h"
#include "server/scheduler.h"

namespace estream::server::testing {

// A deterministic stand-in for Engine::RunBatch (no OpenMP: ThreadSanitizer-friendly). Outputs are
// simple functions of the tokens; the logits row t of a prompt is sin(1 + t * V + v + tokens[t]).
// close() holds every batch until open() or, with `interruptible`, until the scheduler interrupts
// it (its requests then fail with Cancelled, as the engine's); `seen` lists every request's first
// token as run.
struct FakeEngine {
  ModelInfo info;
  std::mutex mu;
  std::condition_variable cv;
  bool gate_open = true;
  bool interruptible = false;
  std::vector<int32_t> seen;
  std::atomic<int> running{0};
  std::atomic<int> batches{0};

  FakeEngine() {
    info.architecture = "fake";
    info.n_vocab = 16;
    info.n_embd = 4;
    info.n_ctx = 64;
    info.n_layer = 1;
  }
  void open() {
    {
      std::lock_guard<std::mutex> l(mu);
      gate_open = true;
    }
    cv.notify_all();
  }
  void close() {
    std::lock_guard<std::mutex> l(mu);
    gate_open = false;
  }
  std::vector<int32_t> seen_tokens() {
    std::lock_guard<std::mutex> l(mu);
    return seen;
  }

  static float Logit(int64_t t, int v, int V, int32_t tok) { return std::sin(1.0f + static_cast<float>(t * V + v + tok)); }

  BatchRunner Runner() {
    return [this](std::span<const Request> reqs, const std::function<bool()>& stop) {
      ++running;
      {
        std::unique_lock<std::mutex> l(mu);
        while (!cv.wait_for(l, std::chrono::milliseconds(1), [&] { return gate_open; })) {
          if (interruptible && stop()) {
            std::vector<Result<Response>> cancelled(reqs.size(), Status::Cancelled("interrupted at layer 0 of 1"));
            --running;
            return cancelled;
          }
        }
        for (const Request& r : reqs) seen.push_back(r.tokens[0]);
      }
      const int V = info.n_vocab;
      std::vector<Result<Response>> out;
      for (const Request& r : reqs) {
        Response resp;
        const int64_t T = static_cast<int64_t>(r.tokens.size());
        resp.n_tokens = T;
        for (int j = 0; j < r.top_k; ++j) resp.top.push_back({static_cast<int32_t>((T + j) % V), -1.0f - j});
        if (r.prompt_logprobs)
          for (int64_t t = 0; t + 1 < T; ++t) resp.prompt_logprobs.push_back(-0.1f * static_cast<float>(r.tokens[t + 1]));
        if (r.embedding != Request::Pooling::kNone) {
          float sum = 0;
          for (int32_t x : r.tokens) sum += static_cast<float>(x);
          resp.embedding = {static_cast<float>(T), sum, static_cast<float>(r.tokens[0]),
                            r.embedding == Request::Pooling::kMean ? sum / static_cast<float>(T) : static_cast<float>(r.tokens.back())};
        }
        for (const auto& c : r.continuations) {
          ContinuationScore s;
          for (int32_t x : c) s.logprobs.push_back(-0.25f * static_cast<float>(x % 7 + 1));
          for (float lp : s.logprobs) s.log_likelihood += lp;
          resp.continuations.push_back(s);
        }
        if (r.logits_sink) {
          std::vector<float> rows(static_cast<size_t>(T * V));
          for (int64_t t = 0; t < T; ++t)
            for (int v = 0; v < V; ++v) rows[t * V + v] = Logit(t, v, V, r.tokens[t]);
          Status s = r.logits_sink(0, T, rows.data());
          if (!s.ok()) {
            out.push_back(s);
            continue;
          }
        }
        out.push_back(std::move(resp));
      }
      ++batches;
      --running;
      return out;
    };
  }
};

inline nlohmann::json Json(const std::string& s) { return nlohmann::json::parse(s, nullptr, false); }

// POST body to path; returns (status, body); status -1 when no response came.
struct HttpResult {
  int status = -1;
  std::string body;
  httplib::Headers headers;
  nlohmann::json json() const { return Json(body); }
};

inline HttpResult Post(int port, const std::string& path, const std::string& body, const std::string& key = "",
                       int read_timeout_ms = 30000, const std::string& content_type = "application/json") {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(read_timeout_ms / 1000, (read_timeout_ms % 1000) * 1000);
  httplib::Headers h;
  if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
  auto r = c.Post(path, h, body, content_type.c_str());
  HttpResult out;
  if (r) {
    out.status = r->status;
    out.body = r->body;
    out.headers = r->headers;
  }
  return out;
}

inline HttpResult Get(int port, const std::string& path, const std::string& key = "") {
  httplib::Client c("127.0.0.1", port);
  httplib::Headers h;
  if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
  auto r = c.Get(path, h);
  HttpResult out;
  if (r) {
    out.status = r->status;
    out.body = r->body;
    out.headers = r->headers;
  }
  return out;
}

}  // namespace estream::server::testing
