// `estream serve`'s HTTP server: cpp-httplib (Debian's libcpp-httplib-dev 0.11) in front of the
// scheduler (server/scheduler.h) and the JSON routes (server/api.h).
//
// Layers, top down:
//   Server (this file)   sockets, auth, limits, routing, waiting for a job, status codes, metrics;
//   api.h                JSON body -> engine Requests -> JSON reply (no sockets);
//   scheduler.h          job queue (shortest predicted job first, with aging), one engine worker
//                        thread running batches through a BatchRunner (Engine::RunBatch);
//   metrics.h            Prometheus text.
// Threads: one listener, a pool of HTTP worker threads (one per open connection being served;
// each parses, tokenizes and waits for its job), and the scheduler's engine worker thread. The
// HTTP threads never touch the engine; the engine worker never touches a socket.
//
// Limits, in the order a request meets them: Bearer auth on every route except /health (401,
// checked before the body is read); a body over max_body_bytes, without Content-Length or with
// a Transfer-Encoding, or compressed (413 / 411 / 411 / 415, before it is read: httplib would
// read a chunked body and unpack a gzip one past the limit); bad JSON / fields (400); a job over
// the scheduler's max_batch_tokens (413 naming the limit); a full queue (429 with Retry-After);
// the client closing its connection while its job waits (the job is cancelled; counted as status
// 499); timeout_seconds (504); a request's headers not all sent within header_timeout_seconds
// (the connection is closed). Replies after which the connection closes (401, 411, 413, 415, a
// malformed Content-Length's 400, httplib's own 400 / 414 for a request line, header or body it
// could not read, any reply to a GET with a body, which is not read, engine routes' and /health's
// replies after Shutdown began, HTTP/1.0 without keep-alive) say "Connection: close": no bytes
// of one request are read as the next. A known route asked with another method: 405 with Allow.
// During load every route but /metrics answers 503 (/health: {"status": "loading model"}); after
// Shutdown starts, engine routes answer 503.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "base/status.h"
#include "estream/engine.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/scheduler.h"

namespace estream {
class Tokenizer;
}

namespace estream::server {

// The memory one HTTP thread's request may take per byte of --max-body: the body and the prompts
// made of it. Its parsed JSON tree (up to ~20 bytes per body byte for thousands of tiny values)
// is counted before it is built (JsonTreeBytes) and held in the reply memory while it exists.
// `estream serve` keeps HTTP threads x this x --max-body for them (plus the reply memory and 16
// MiB) out of its budget.
inline constexpr uint64_t kMemoryPerBodyByte = 4;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (see Server::port())
  std::string api_key;              // empty: no auth
  size_t max_body_bytes = 1 << 20;  // larger bodies: 413
  uint64_t reply_memory_bytes = 32 << 20;  // the parsed bodies and replies of the requests in flight
                                           // (Prepared::reply_bytes): a request whose reply needs
                                           // more gets 413; others wait for room
  int http_threads = 0;             // 0: scheduler.max_queue + 8 (a full queue still leaves
                                    // threads to answer 429, /health and /metrics)
  double timeout_seconds = 0;       // per request, submit to answer; 0: none
  double shutdown_grace_seconds = 10;  // Shutdown: queued work may finish for this long
  double shutdown_drain_seconds = 2;   // Shutdown: a connection still sending a request this long
                                       // after it began, or not reading its reply this long after
                                       // the queued work ended, is closed
  double header_timeout_seconds = 10;  // a request's line and headers must come within this
                                       // long of its first byte, else the connection is closed
  SchedulerOptions scheduler;       // max_batch_tokens is lowered to the backend's pass limit
  std::string rerank_template = kDefaultRerankTemplate;
  uint64_t budget_bytes = 0;        // for /metrics
  uint64_t server_reserve_bytes = 0;
  int compute_threads = 1;          // threads of the server's own row work (echo logprobs' top
                                    // alternatives); `estream serve` passes the engine's -t
};

// The engine as a Server's BatchRunner: Engine::RunBatch, stopped by the scheduler's
// `interrupted` at the engine's next layer. `engine` must outlive the Server.
inline BatchRunner EngineRunner(Engine* engine) {
  return [engine](std::span<const Request> reqs, const std::function<bool()>& interrupted) {
    return engine->RunBatch(reqs, 0, interrupted);
  };
}

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // Shutdown()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and starts listening on a background thread. Until SetBackend, /health and
  // the model routes answer 503. Errors: IOError (cannot bind).
  Status Start();
  int port() const { return port_; }

  // Makes the model routes live. `runner` runs batches (Engine::RunBatch); `info` and `tokenizer`
  // (may be null: ids only) must outlive the Server. `pass_tokens`: the most tokens the runner
  // takes in one batch (Engine::pass_tokens()); max_batch_tokens is capped to it.
  void SetBackend(BatchRunner runner, const ModelInfo& info, const Tokenizer* tokenizer, std::string model_id,
                  int64_t pass_tokens);

  // Graceful stop: engine routes answer 503, the listener closes, queued jobs may run for up to
  // shutdown_grace_seconds (the rest are answered 503), open connections close after their
  // current request. Returns when every server thread has ended. Idempotent.
  void Shutdown();
  // Blocks until the listener ends (after Shutdown or RequestStop, from another thread or a
  // signal).
  void Wait();
  // Makes Wait() run Shutdown (from a signal-handling thread that must not block).
  void RequestStop();
  // Connections Shutdown closed at its drain cut-off (still sending, or not reading their reply).
  int connections_cut_off() const;

  Metrics& metrics() { return metrics_; }
  const ServerOptions& options() const { return options_; }

 private:
  class Http;
  Reply HandleEngine(const char* route, std::optional<ApiError> (*prepare)(const std::string&, const ApiContext&, Prepared*),
                     const std::string& body, bool* client_gone);
  // Takes n bytes of the reply memory (ServerOptions::reply_memory_bytes) for `what`, waiting
  // while the requests in flight leave no room. Otherwise a reply: 413 when n alone exceeds it,
  // 503 when the server stops, 499 (*client_gone) when the client went away, or timed_out()'s
  // reply (engine routes: 504 after --timeout).
  std::optional<Reply> TakeReplyMemory(uint64_t n, const std::string& what, bool* client_gone,
                                       const std::function<std::optional<Reply>()>& timed_out);
  // Gives back n bytes that this thread's request took with TakeReplyMemory before its reply.
  void GiveReplyMemory(uint64_t n);
  std::string RenderMetrics();

  ServerOptions options_;
  Metrics metrics_;
  std::unique_ptr<Http> http_;
  std::thread listener_;
  int port_ = 0;

  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> in_flight_{0};
  // Set once by SetBackend (before ready_ becomes true), then read-only.
  ApiContext ctx_;
  std::unique_ptr<Scheduler> scheduler_;
  std::once_flag shutdown_once_;
};

}  // namespace estream::server
