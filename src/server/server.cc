#include "server/server.h"

#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>

#include "base/memory.h"
#include "base/stats.h"

namespace estream::server {
namespace {

using Clock = std::chrono::steady_clock;

// Times after which reads or writes on every connection fail (steady-clock nanoseconds; set by
// Server::Shutdown so that a connection that trickles a request or does not read its reply cannot
// hold the shutdown), and how many connections were closed by them.
struct Cutoffs {
  static constexpr int64_t kNever = INT64_MAX;
  std::atomic<int64_t> read{kNever}, write{kNever};
  std::atomic<int> closed{0};
};

int64_t NowNs() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

// A buffered socket stream for httplib's request parser (which reads headers a byte at a time).
// Owned by the HTTP thread that serves the connection; HasClientGone() is called from the same
// thread while its handler waits for a job. Reads fail after the per-read timeout without a byte,
// after the request's own deadline (SetReadDeadline: its headers must come within a bound, so a
// client trickling them a byte at a time cannot hold a thread for long) and after the shutdown
// cut-off; writes after the write timeout and the shutdown cut-off.
class SocketStream final : public httplib::Stream {
 public:
  SocketStream(int sock, time_t read_sec, time_t read_usec, time_t write_sec, time_t write_usec, const Cutoffs* cut)
      : sock_(sock),
        read_ms_(static_cast<int>(read_sec * 1000 + read_usec / 1000)),
        write_ms_(static_cast<int>(write_sec * 1000 + write_usec / 1000)),
        cut_(cut) {}

  bool is_readable() const override { return begin_ < end_ || Poll(POLLIN, read_ms_); }
  bool is_writable() const override { return Poll(POLLOUT, write_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (begin_ == end_) {
      if (!Poll(POLLIN, read_ms_)) return -1;
      if (size >= sizeof(buf_)) return Recv(ptr, size);
      const ssize_t n = Recv(buf_, sizeof(buf_));
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buf_ + begin_, n);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!Poll(POLLOUT, write_ms_)) return -1;
    for (;;) {
      const ssize_t n = send(sock_, ptr, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { Name(true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { Name(false, ip, port); }
  socket_t socket() const override { return sock_; }

  // Reads fail after `deadline_ns` (NowNs()'s clock; Cutoffs::kNever: no deadline).
  void SetReadDeadline(int64_t deadline_ns) { read_deadline_ns_ = deadline_ns; }
  // True once a read or write failed at the shutdown cut-off.
  bool cut_off() const { return cut_off_; }
  // True once a read found the end of the stream (the client closed, at least its sending side).
  bool saw_eof() const { return saw_eof_; }

  // Waits up to `timeout_s` for the next request's bytes, waking every 100 ms to ask `stop`.
  template <typename Stop>
  bool WaitForRequest(time_t timeout_s, Stop stop) const {
    if (begin_ < end_) return true;
    const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    while (Clock::now() < deadline) {
      if (stop()) return false;
      if (PollOnce(POLLIN, 100)) return true;
    }
    return false;
  }

  // True when the peer has closed (or reset) the connection. Bytes already sent (a pipelined
  // next request) mean it is still there.
  bool HasClientGone() const {
    if (begin_ < end_) return false;
    pollfd p{sock_, static_cast<short>(POLLIN | POLLRDHUP), 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    char c;
    const ssize_t n = recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

 private:
  bool PollOnce(short events, int timeout_ms) const {
    pollfd p{sock_, events, 0};
    for (;;) {
      const int r = ::poll(&p, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      return r > 0 && (p.revents & (events | POLLHUP | POLLERR));
    }
  }
  // Waits up to `timeout_ms` for `events`, in slices of at most 100 ms so that a deadline or a
  // cut-off set meanwhile (by Shutdown, from another thread) ends the wait within 100 ms.
  bool Poll(short events, int timeout_ms) const {
    const int64_t end = NowNs() + int64_t{timeout_ms} * 1000000;
    for (;;) {
      const bool reading = events & POLLIN;
      const int64_t cut = reading ? cut_->read.load() : cut_->write.load();
      const int64_t limit = std::min({end, cut, reading ? read_deadline_ns_ : Cutoffs::kNever});
      const int64_t now = NowNs();
      if (now >= limit) {
        if (now >= cut) cut_off_ = true;
        return false;
      }
      if (PollOnce(events, static_cast<int>(std::min<int64_t>((limit - now + 999999) / 1000000, 100)))) return true;
    }
  }
  ssize_t Recv(char* ptr, size_t size) {
    for (;;) {
      const ssize_t n = recv(sock_, ptr, size, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) saw_eof_ = true;
      return n;
    }
  }
  void Name(bool peer, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int r = peer ? getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &len)
                       : getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &len);
    if (r != 0) return;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      ip = host;
      port = std::atoi(serv);
    }
  }

  int sock_;
  int read_ms_, write_ms_;
  const Cutoffs* cut_;
  int64_t read_deadline_ns_ = Cutoffs::kNever;
  mutable bool cut_off_ = false;
  bool saw_eof_ = false;
  char buf_[4096];
  size_t begin_ = 0, end_ = 0;
};

// The stream of the connection this HTTP thread serves, and whether the connection must close
// after the current response (a request answered before its body was read).
thread_local SocketStream* tls_stream = nullptr;
thread_local bool tls_close_after = false;
// The Content-Length of the body httplib is about to read for this thread's request (set by the
// pre-routing hook; -1 before it runs): an error reply without a body (httplib's own) then means
// that the body could not be read, else that the request line or headers could not be.
thread_local int64_t tls_body_length = -1;
// The current request's body stopped at the end of the stream: the client closed its connection
// mid-body. It is still answered 400 (a client that only shut down its sending side reads it),
// and /metrics counts it as 499 (client closed the request), as for a client gone while waiting.
thread_local bool tls_gone_mid_body = false;

// The memory the replies of the requests in flight may take (ServerOptions::reply_memory_bytes):
// a request takes its Prepared::reply_bytes before it is queued and gives it back once its reply
// is sent (tls_reply_held: what this HTTP thread's current request holds).
struct ReplyPool {
  std::mutex mu;
  uint64_t capacity = 0, used = 0;
  bool TryTake(uint64_t n) {
    std::lock_guard<std::mutex> l(mu);
    if (used + n > capacity) return false;
    used += n;
    return true;
  }
  void Give(uint64_t n) {
    std::lock_guard<std::mutex> l(mu);
    used -= n;
  }
};
thread_local uint64_t tls_reply_held = 0;

// The metrics label of a request path: an engine route's alias without "/v1" counts as its /v1
// route (as its 499s do), anything unknown as "other".
const char* RouteLabel(const std::string& path) {
  static const char* kRoutes[] = {"/v1/completions", "/v1/embeddings", "/v1/classify", "/v1/rerank", "/tokenize",
                                  "/detokenize",     "/health",        "/v1/models",   "/metrics"};
  for (const char* r : kRoutes)
    if (path == r || (std::strncmp(r, "/v1/", 4) == 0 && path == r + 3)) return r;
  if (path.rfind("/v1/models/", 0) == 0 && path.size() > 11) return "/v1/models";  // one model's object
  return "other";
}

// The method a known route takes (for a 405's Allow header), null for an unknown path (a 404 for
// the method named here is a path that only looks like a route: "/models").
const char* AllowedMethod(const std::string& path) {
  const std::string route = RouteLabel(path);
  if (route == "other") return nullptr;
  return route == "/health" || route == "/v1/models" || route == "/metrics" ? "GET" : "POST";
}

// Marks the connection to be closed after this reply, and says so in it: the request looks to
// httplib as if it had asked for "Connection: close", so the reply carries that header and no
// Keep-Alive (the library's Request here is its own non-const object, passed to handlers as const).
void CloseAfter(const httplib::Request& req) {
  tls_close_after = true;
  auto& r = const_cast<httplib::Request&>(req);
  r.headers.erase("Connection");
  r.headers.emplace("Connection", "close");
}

// The body length a request's Content-Length headers give. Errors (a 400 message): a value that is
// not a decimal number, or several headers that disagree (RFC 9112 section 6.3). A number past
// 2^64 - 1 reads as UINT64_MAX (over any limit).
std::optional<uint64_t> ContentLength(const httplib::Request& req, std::string* error) {
  std::optional<uint64_t> len;
  auto values = req.headers.equal_range("Content-Length");  // case-insensitive
  for (auto it = values.first; it != values.second; ++it) {
    const std::string& v = it->second;
    uint64_t n = 0;
    bool ok = !v.empty();
    for (char c : v) {
      if (c < '0' || c > '9') {
        ok = false;
        break;
      }
      const uint64_t d = static_cast<uint64_t>(c - '0');
      n = n > (UINT64_MAX - d) / 10 ? UINT64_MAX : n * 10 + d;
    }
    if (!ok) {
      *error = "the Content-Length header \"" + v.substr(0, 40) + "\" is not a number of bytes";
      return std::nullopt;
    }
    if (len && *len != n) {
      *error = "the request has several Content-Length headers that disagree: send one";
      return std::nullopt;
    }
    len = n;
  }
  return len.value_or(0);
}

// Seconds as a person writes them: 1 -> "1", 1.5 -> "1.5", 0.25 -> "0.25".
std::string FormatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

void SetError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(ErrorBody(e), "application/json");
}

ApiError Err(int status, std::string message, std::string type, std::string code = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

}  // namespace

// httplib's server with our own connection loop: the same keep-alive handling as httplib's, but
// the connection's stream is known to the handler thread (tls_stream), so a handler can notice
// that its client went away (httplib 0.11 has no Request::is_connection_closed).
class Server::Http : public httplib::Server {
 public:
  // httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's
  // library). Under a burst of new connections (16+ clients that each connect per request, as
  // httplib's Client does unless set_keep_alive(true)) the kernel's queues overflow: SYNs are
  // dropped (the client retries after 1 s) and SYN cookies are sent, and a cookie whose ACK finds
  // the accept queue still full fails later with a RST on a connection the client already sent
  // its request on: the client sees a broken connection and no answer (about 1 in 2,000 requests
  // of server_engine_test's load test on a loaded 2-core machine; docs/DESIGN.md section 14).
  // listen() again on the bound socket sets the backlog (capped by net.core.somaxconn).
  bool RaiseBacklog() { return ::listen(svr_sock_, SOMAXCONN) == 0; }

  Cutoffs cutoffs;
  double header_timeout_seconds = 10;
  ReplyPool replies;

 private:
  bool process_and_close_socket(socket_t sock) override {
    // httplib writes a response's headers and body in two send()s; with Nagle's algorithm the
    // body waits for the ACK of the headers, which a keep-alive client delays (~40 ms a request).
    const int one = 1;
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    bool ret = false;
    {
      SocketStream strm(sock, read_timeout_sec_, read_timeout_usec_, write_timeout_sec_, write_timeout_usec_, &cutoffs);
      tls_stream = &strm;
      auto stopped = [this] { return svr_sock_ == INVALID_SOCKET; };
      for (size_t count = keep_alive_max_count_; count > 0; --count) {
        strm.SetReadDeadline(Cutoffs::kNever);
        if (!strm.WaitForRequest(keep_alive_timeout_sec_, stopped)) break;
        // The request line and headers must all come within header_timeout_seconds of its first
        // byte (the pre-routing hook lifts the deadline for the body).
        strm.SetReadDeadline(NowNs() + static_cast<int64_t>(header_timeout_seconds * 1e9));
        tls_close_after = false;
        tls_body_length = -1;
        tls_gone_mid_body = false;
        bool connection_closed = false;
        ret = process_request(strm, count == 1 || stopped(), connection_closed, nullptr);
        if (tls_reply_held > 0) {  // the reply is sent (or failed): its memory is free again
          replies.Give(tls_reply_held);
          tls_reply_held = 0;
        }
        if (!ret || connection_closed || tls_close_after) break;
      }
      if (strm.cut_off()) ++cutoffs.closed;
      tls_stream = nullptr;
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ret;
  }
};

Server::Server(ServerOptions options) : options_(std::move(options)), http_(std::make_unique<Http>()) {}

Server::~Server() { Shutdown(); }

Status Server::Start() {
  Http& h = *http_;
  const int threads = options_.http_threads > 0 ? options_.http_threads : options_.scheduler.max_queue + 8;
  h.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  h.set_payload_max_length(options_.max_body_bytes);
  // httplib's default socket options add SO_REUSEPORT, with which a second server on a port in use
  // binds it too and the kernel splits the connections between the two: SO_REUSEADDR only (a
  // restarted server can still bind while its old connections are in TIME_WAIT).
  h.set_socket_options([](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  h.header_timeout_seconds = options_.header_timeout_seconds;
  h.replies.capacity = options_.reply_memory_bytes;
  h.set_read_timeout(5, 0);
  h.set_write_timeout(10, 0);
  h.set_keep_alive_timeout(5);
  h.set_keep_alive_max_count(10000);

  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // HTTP/1.0 without "Connection: keep-alive" closes after the reply (httplib does so): the
    // reply says Connection: close, not Keep-Alive.
    if (req.version == "HTTP/1.0" && strcasecmp(req.get_header_value("Connection").c_str(), "keep-alive") != 0)
      CloseAfter(req);
    if (!options_.api_key.empty() && req.path != "/health") {
      const std::string auth = req.get_header_value("Authorization");
      const std::string want = "Bearer " + options_.api_key;
      if (!ConstantTimeEquals(auth, want)) {
        CloseAfter(req);  // the body (if any) is not read
        SetError(res, Err(401, "missing or wrong API key: send the header \"Authorization: Bearer KEY\"",
                          "authentication_error", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (tls_stream) tls_stream->SetReadDeadline(Cutoffs::kNever);  // the headers are in
    std::string bad_length;
    const std::optional<uint64_t> len = ContentLength(req, &bad_length);
    if (!len) {
      CloseAfter(req);
      SetError(res, Err(400, bad_length, "invalid_request_error", "bad_content_length"));
      return httplib::Server::HandlerResponse::Handled;
    }
    // A body framed any other way than by Content-Length is refused before it is read: httplib
    // reads a chunked body (its "chunked" in any case) without --max-body's limit.
    if (req.has_header("Transfer-Encoding")) {
      CloseAfter(req);
      SetError(res, Err(411, "send the body with a Content-Length (Transfer-Encoding \"" +
                                 req.get_header_value("Transfer-Encoding").substr(0, 40) + "\" is not accepted)",
                        "invalid_request_error", "length_required"));
      return httplib::Server::HandlerResponse::Handled;
    }
    // The methods whose body httplib reads (its expect_content).
    const bool reads_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                            req.method == "DELETE" || req.method == "PRI";
    if (!reads_body && *len > 0) {
      // httplib does not read the body of a GET (or HEAD, OPTIONS, ...): its bytes would be read
      // as the next request (a request smuggled past a proxy that read them as this one's body).
      // The request is answered, and the connection closed.
      CloseAfter(req);
    }
    if (reads_body) {
      if (!req.has_header("Content-Length")) {
        // Without it, httplib would read the body until the client closes or pauses for 5 s.
        CloseAfter(req);
        SetError(res, Err(411, "the request has no Content-Length header: send the body with one",
                          "invalid_request_error", "length_required"));
        return httplib::Server::HandlerResponse::Handled;
      }
      // httplib unpacks a gzip or deflate body without a limit: a 256 KiB body can unpack to 256 MiB.
      auto encodings = req.headers.equal_range("Content-Encoding");  // case-insensitive
      for (auto it = encodings.first; it != encodings.second; ++it) {
        if (strcasecmp(it->second.c_str(), "identity") == 0) continue;
        CloseAfter(req);
        SetError(res, Err(415, "Content-Encoding \"" + it->second.substr(0, 40) +
                                   "\" is not accepted: send the body uncompressed",
                          "invalid_request_error", "unsupported_content_encoding"));
        return httplib::Server::HandlerResponse::Handled;
      }
      // Every route reads its body as JSON whatever the Content-Type, but cpp-httplib refuses a
      // form-encoded body over 8 KiB (a limit compiled into Debian's library) with a bare 413,
      // and curl's -d sends that type by default. So such a body is relabelled as JSON: the
      // library's Request here is its own non-const object, passed to this hook as const.
      auto types = const_cast<httplib::Request&>(req).headers.equal_range("Content-Type");  // case-insensitive
      for (auto it = types.first; it != types.second; ++it)
        if (it->second.rfind("application/x-www-form-urlencoded", 0) == 0) it->second = "application/json";
      if (*len > options_.max_body_bytes) {
        CloseAfter(req);
        const std::string size = *len == UINT64_MAX ? "over 2^64" : std::to_string(*len);
        SetError(res, Err(413, "the request body is " + size + " bytes; this server accepts at most " +
                                   std::to_string(options_.max_body_bytes) + " (--max-body)",
                          "invalid_request_error", "body_too_large"));
        return httplib::Server::HandlerResponse::Handled;
      }
      tls_body_length = static_cast<int64_t>(*len);
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  h.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.status == 499) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {
      const char* allowed = AllowedMethod(req.path);
      if (allowed && req.method != allowed) {
        res.set_header("Allow", allowed);
        SetError(res, Err(405, req.method + " " + req.path + " is not allowed: send a " + allowed,
                          "invalid_request_error", "method_not_allowed"));
      } else {
        SetError(res, Err(404, "no route " + req.method + " " + req.path, "invalid_request_error", "not_found"));
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    // httplib's own refusals, before any handler: the request line, its headers or its body could
    // not be read, so what follows on the connection cannot be trusted to start a request.
    CloseAfter(req);
    std::string msg;
    if (res.status == 414) {
      msg = "the request line is longer than 8 KiB: send a shorter path";
    } else if (tls_body_length >= 0) {
      tls_gone_mid_body = tls_stream != nullptr && tls_stream->saw_eof();
      msg = "the request body did not all come: Content-Length says " + std::to_string(tls_body_length) +
            " bytes; send them all, without pausing for 5 s";
    } else if (req.path.empty()) {
      msg = "malformed HTTP request line: send \"METHOD /path HTTP/1.1\"";
    } else {
      msg = "malformed HTTP request headers: each line at most 8 KiB, all sent within 10 s";
    }
    SetError(res, Err(res.status, msg, "invalid_request_error", "malformed_request"));
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (res.status != 499) metrics_.CountRequest(RouteLabel(req.path), tls_gone_mid_body ? 499 : res.status);
  });
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    SetError(res, Err(500, what, "server_error"));
  });

  auto json_reply = [](httplib::Response& res, const Reply& r) {
    res.status = r.status;
    res.set_content(r.body, "application/json");
  };
  auto engine_route = [this](const char* route, auto prepare) {
    return [this, route, prepare](const httplib::Request& req, httplib::Response& res) {
      ++in_flight_;
      bool gone = false;
      Reply r = HandleEngine(route, prepare, req.body, &gone);
      --in_flight_;
      res.status = r.status;
      if (stopping_) CloseAfter(req);  // this connection serves no further request
      if (gone) {
        CloseAfter(req);
        metrics_.CountRequest(route, 499);
        return;
      }
      res.body = std::move(r.body);  // set_content would copy it: a reply can be megabytes
      res.set_header("Content-Type", "application/json");
      if (r.status == 429) res.set_header("Retry-After", std::to_string(scheduler_ ? scheduler_->RetryAfterSeconds() : 1));
    };
  };
  for (const char* alias : {"/v1/completions", "/completions"})
    h.Post(alias, engine_route("/v1/completions", &PrepareCompletion));
  for (const char* alias : {"/v1/embeddings", "/embeddings"})
    h.Post(alias, engine_route("/v1/embeddings", &PrepareEmbeddings));
  for (const char* alias : {"/v1/classify", "/classify"}) h.Post(alias, engine_route("/v1/classify", &PrepareClassify));
  for (const char* alias : {"/v1/rerank", "/rerank"}) h.Post(alias, engine_route("/v1/rerank", &PrepareRerank));

  auto not_ready = [this](httplib::Response& res) {
    if (ready_) return false;
    SetError(res, Err(503, "the model is loading", "unavailable", "loading"));
    return true;
  };
  // The routes without the engine hold their body's JSON tree in the reply memory while they parse
  // it, then their reply's memory until it is sent, as HandleEngine does.
  auto local_route = [this](const char* route, const std::string& body, httplib::Response& res,
                            std::optional<ApiError> (*prepare)(const std::string&, const ApiContext&, Prepared*)) {
    auto reply = [&res](int status, std::string text) {
      res.status = status;
      res.body = std::move(text);  // set_content would copy it
      res.set_header("Content-Type", "application/json");
    };
    bool gone = false;
    auto no_timeout = [] { return std::optional<Reply>(); };
    const uint64_t tree = JsonTreeBytes(body);
    if (auto r = TakeReplyMemory(tree, "the request body, parsed,", &gone, no_timeout)) return reply(r->status, r->body);
    Prepared p;
    std::optional<ApiError> e = prepare(body, ctx_, &p);
    GiveReplyMemory(tree);
    if (e) return reply(e->status, ErrorBody(*e));
    if (p.reply_bytes > options_.reply_memory_bytes)
      return reply(413, ErrorBody(Err(413,
                                      std::string(route) + ": the reply to this request needs up to " +
                                          FormatBytes(p.reply_bytes) + " of memory; this server keeps " +
                                          FormatBytes(options_.reply_memory_bytes) +
                                          " for replies (--reply-memory): send less at a time",
                                      "invalid_request_error", "reply_too_large")));
    if (auto r = TakeReplyMemory(p.reply_bytes, "", &gone, no_timeout)) return reply(r->status, r->body);
    std::vector<Result<Response>> no_results;
    reply(200, p.format(no_results));
  };
  h.Post("/tokenize", [not_ready, local_route](const httplib::Request& req, httplib::Response& res) {
    if (!not_ready(res)) local_route("/tokenize", req.body, res, &PrepareTokenize);
  });
  h.Post("/detokenize", [not_ready, local_route](const httplib::Request& req, httplib::Response& res) {
    if (!not_ready(res)) local_route("/detokenize", req.body, res, &PrepareDetokenize);
  });
  h.Get("/v1/models", [this, json_reply, not_ready](const httplib::Request&, httplib::Response& res) {
    if (!not_ready(res)) json_reply(res, Models(ctx_));
  });
  // OpenAI's "retrieve model" (client.models.retrieve(id)).
  h.Get(R"(/v1/models/(.+))", [this, json_reply, not_ready](const httplib::Request& req, httplib::Response& res) {
    if (!not_ready(res)) json_reply(res, Model(ctx_, req.matches[1].str()));
  });
  h.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    if (stopping_) {
      CloseAfter(req);
      res.status = 503;
      res.set_content(R"({"status":"shutting down"})", "application/json");
    } else if (!ready_) {
      res.status = 503;
      res.set_content(R"({"status":"loading model"})", "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics(), "text/plain; version=0.0.4");
  });

  if (options_.port == 0) {
    port_ = h.bind_to_any_port(options_.host);
    if (port_ <= 0) return Status::IOError("cannot bind a port on " + options_.host);
  } else {
    if (!h.bind_to_port(options_.host, options_.port))
      return Status::IOError("cannot bind " + options_.host + ":" + std::to_string(options_.port) +
                             " (in use, or not an address of this machine)");
    port_ = options_.port;
  }
  if (!h.RaiseBacklog()) return Status::IOError(std::string("cannot set the listen backlog: ") + std::strerror(errno));
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  // Shutdown's stop() only acts on a running listener: wait until it runs.
  while (!h.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return Status::Ok();
}

void Server::SetBackend(BatchRunner runner, const ModelInfo& info, const Tokenizer* tokenizer, std::string model_id,
                        int64_t pass_tokens) {
  ctx_.tokenizer = tokenizer;
  ctx_.info = &info;
  ctx_.model_id = std::move(model_id);
  ctx_.rerank_template = options_.rerank_template;
  ctx_.threads = options_.compute_threads;
  ctx_.max_piece_json = MaxPieceJson(tokenizer);
  SchedulerOptions so = options_.scheduler;
  if (pass_tokens > 0) so.max_batch_tokens = std::min(so.max_batch_tokens, pass_tokens);
  options_.scheduler = so;
  scheduler_ = std::make_unique<Scheduler>(std::move(runner), so, &metrics_);
  ready_ = true;
}

std::optional<Reply> Server::TakeReplyMemory(uint64_t n, const std::string& what, bool* client_gone,
                                             const std::function<std::optional<Reply>()>& timed_out) {
  auto error = [](const ApiError& e) { return Reply{e.status, ErrorBody(e)}; };
  const uint64_t capacity = options_.reply_memory_bytes;
  if (n > capacity)
    return error(Err(413,
                     what + " needs up to " + FormatBytes(n) + " of memory; this server keeps " +
                         FormatBytes(capacity) + " for requests in flight (--reply-memory): send fewer or larger values",
                     "invalid_request_error", "body_too_complex"));
  while (!http_->replies.TryTake(n)) {
    if (stopping_) return error(Err(503, "the server is shutting down", "unavailable", "shutting_down"));
    if (tls_stream && tls_stream->HasClientGone()) {
      *client_gone = true;
      return Reply{499, ""};
    }
    if (auto r = timed_out()) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  tls_reply_held += n;
  return std::nullopt;
}

void Server::GiveReplyMemory(uint64_t n) {
  http_->replies.Give(n);
  tls_reply_held -= n;
}

Reply Server::HandleEngine(const char* route,
                           std::optional<ApiError> (*prepare)(const std::string&, const ApiContext&, Prepared*),
                           const std::string& body, bool* client_gone) {
  auto error = [](const ApiError& e) { return Reply{e.status, ErrorBody(e)}; };
  if (!ready_) return error(Err(503, "the model is loading", "unavailable", "loading"));
  if (stopping_) return error(Err(503, "the server is shutting down", "unavailable", "shutting_down"));
  const auto start = Clock::now();
  auto timed_out = [&] {
    return options_.timeout_seconds > 0 &&
           std::chrono::duration<double>(Clock::now() - start).count() > options_.timeout_seconds;
  };
  auto timeout_error = [&] {
    return error(Err(504, "the request did not finish within " + FormatSeconds(options_.timeout_seconds) +
                              " s (--timeout)", "timeout", "timeout"));
  };
  const std::function<std::optional<Reply>()> timeout_if_late = [&]() -> std::optional<Reply> {
    if (timed_out()) return timeout_error();
    return std::nullopt;
  };
  // The body's JSON tree takes reply memory while prepare builds and reads it (JsonTreeBytes).
  const uint64_t tree = JsonTreeBytes(body);
  if (auto r = TakeReplyMemory(tree, "the request body, parsed,", client_gone, timeout_if_late)) return *r;
  Prepared p;
  std::optional<ApiError> prepared = prepare(body, ctx_, &p);
  GiveReplyMemory(tree);
  if (prepared) return error(*prepared);
  if (auto e = ValidateRequests(p.requests, *ctx_.info)) return error(*e);
  const int64_t limit = options_.scheduler.max_batch_tokens;
  if (p.prompt_tokens > limit)
    return error(Err(413,
                     std::string(route) + ": this request needs " + std::to_string(p.prompt_tokens) +
                         " tokens; one batch holds at most " + std::to_string(limit) +
                         " (--max-batch-tokens, within the memory budget): send fewer or shorter prompts",
                     "invalid_request_error", "request_too_large"));
  // The reply's memory: taken before the job is queued (so what the engine answers always has room),
  // given back once the reply is sent. While the replies in flight leave no room, wait for it.
  const uint64_t reply_memory = options_.reply_memory_bytes;
  if (p.reply_bytes > reply_memory)
    return error(Err(413,
                     std::string(route) + ": the reply to this request needs up to " + FormatBytes(p.reply_bytes) +
                         " of memory; this server keeps " + FormatBytes(reply_memory) +
                         " for replies (--reply-memory): send fewer inputs" +
                         (std::string(route) == "/v1/embeddings" ? " (or \"encoding_format\": \"base64\")" : ""),
                     "invalid_request_error", "reply_too_large"));
  if (auto r = TakeReplyMemory(p.reply_bytes, "", client_gone, timeout_if_late)) return *r;
  auto job = std::make_shared<Job>();
  job->requests = std::move(p.requests);
  job->tokens = p.prompt_tokens;
  switch (scheduler_->Submit(job)) {
    case Scheduler::Admit::kOk: break;
    case Scheduler::Admit::kTooBig:
      return error(Err(413, "the request needs more tokens than one batch holds", "invalid_request_error", "request_too_large"));
    case Scheduler::Admit::kQueueFull:
      return error(Err(429, "the queue is full (" + std::to_string(options_.scheduler.max_queue) +
                                " requests, --max-queue): retry after the time in Retry-After",
                       "rate_limit_error", "queue_full"));
    case Scheduler::Admit::kStopping:
      return error(Err(503, "the server is shutting down", "unavailable", "shutting_down"));
  }
  while (!job->WaitFor(std::chrono::milliseconds(25))) {
    if (tls_stream && tls_stream->HasClientGone()) {
      scheduler_->Cancel(job);
      *client_gone = true;
      return Reply{499, ""};
    }
    if (timed_out()) {
      scheduler_->Cancel(job);
      return timeout_error();
    }
  }
  if (job->dropped) return error(Err(503, "the server is shutting down", "unavailable", "shutting_down"));
  for (const Result<Response>& r : job->results)
    if (!r.ok()) return error(ErrorFromStatus(r.status()));
  metrics_.AddPromptTokens(job->tokens);
  return Reply{200, p.format(job->results)};
}

std::string Server::RenderMetrics() {
  MetricsSnapshot s;
  s.queue_jobs = ready_ && scheduler_ ? static_cast<int64_t>(scheduler_->queued()) : 0;
  s.in_flight = in_flight_.load();
  s.budget_bytes = options_.budget_bytes;
  s.server_reserve_bytes = options_.server_reserve_bytes;
  s.rss_bytes = CurrentRssBytes();
  s.peak_rss_bytes = PeakRssBytes();
  s.ready = ready_;
  return metrics_.Render(s);
}

void Server::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    stopping_ = true;
    http_->stop();  // no new connections; open ones close after their current request
    // A request still being sent this long after the stop began is not waited for (it would only
    // get a 503 from an engine route), nor a reply its client does not read this long after the
    // queued work ended: a client trickling bytes cannot hold the shutdown.
    const auto drain = static_cast<int64_t>(options_.shutdown_drain_seconds * 1e9);
    http_->cutoffs.read = NowNs() + drain;
    if (scheduler_) scheduler_->Stop(options_.shutdown_grace_seconds);
    http_->cutoffs.write = NowNs() + drain;
    if (listener_.joinable()) listener_.join();
  });
}

int Server::connections_cut_off() const { return http_->cutoffs.closed.load(); }

void Server::RequestStop() { stopping_ = true; }

void Server::Wait() {
  while (!stopping_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Shutdown();
}

}  // namespace estream::server
