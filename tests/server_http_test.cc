// The HTTP server through a real HTTP client, on a fake engine (tests/server_test_util.h):
// routes' shapes, auth (401), limits (413), bad input (400), a full queue (429), timeouts (504),
// cancellation when the client goes away, concurrency, graceful shutdown. No OpenMP, so the
// binary also runs under ThreadSanitizer (label tsan).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "server/server.h"
#include "tests/server_test_util.h"

namespace estream::server {
namespace {

using testing::FakeEngine;
using testing::Get;
using testing::Post;
using json = nlohmann::json;

struct Fixture {
  FakeEngine fake;
  std::unique_ptr<Server> server;

  explicit Fixture(ServerOptions o = {}, bool attach = true) {
    o.port = 0;
    server = std::make_unique<Server>(o);
    Status s = server->Start();
    EXPECT_TRUE(s.ok()) << s.message();
    if (attach) Attach();
  }
  void Attach() { server->SetBackend(fake.Runner(), fake.info, nullptr, "fake-model", 1 << 20); }
  int port() const { return server->port(); }
};

ServerOptions Opts(int64_t max_batch_tokens = 256, int max_queue = 16) {
  ServerOptions o;
  o.scheduler.max_batch_tokens = max_batch_tokens;
  o.scheduler.max_queue = max_queue;
  o.shutdown_grace_seconds = 5;
  return o;
}

void ExpectOpenAiError(const testing::HttpResult& r, int status) {
  EXPECT_EQ(r.status, status) << r.body;
  const json j = r.json();
  ASSERT_TRUE(j.is_object()) << r.body;
  ASSERT_TRUE(j.contains("error")) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("code"));
}

TEST(ServerHttp, HealthIs503WhileLoadingThen200) {
  Fixture f(Opts(), /*attach=*/false);
  auto h = Get(f.port(), "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.json()["status"], "loading model");
  ExpectOpenAiError(Post(f.port(), "/v1/embeddings", R"({"input": [1, 2]})"), 503);
  f.Attach();
  EXPECT_EQ(Get(f.port(), "/health").status, 200);
  auto m = Get(f.port(), "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.json()["data"][0]["id"], "fake-model");
}

// OpenAI's retrieve-model route: the served model's object; any other id is a 404 that says
// which model this server has.
TEST(ServerHttp, OneModelByIdOr404) {
  Fixture f(Opts());
  auto m = Get(f.port(), "/v1/models/fake-model");
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_EQ(m.json()["id"], "fake-model");
  EXPECT_EQ(m.json()["object"], "model");
  auto other = Get(f.port(), "/v1/models/gpt-4");
  ExpectOpenAiError(other, 404);
  EXPECT_EQ(other.json()["error"]["code"], "model_not_found");
  EXPECT_NE(other.json()["error"]["message"].get<std::string>().find("fake-model"), std::string::npos);
  auto post = Post(f.port(), "/v1/models/fake-model", "{}");
  ExpectOpenAiError(post, 405);
  EXPECT_EQ(post.headers.find("Allow")->second, "GET");
}

TEST(ServerHttp, CompletionEchoLogprobsShape) {
  Fixture f(Opts());
  auto r = Post(f.port(), "/v1/completions", R"({"prompt": [3, 5, 7, 2], "max_tokens": 1, "echo": true, "logprobs": 2})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json();
  EXPECT_EQ(j["object"], "text_completion");
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);  // 4 prompt tokens + the generated one
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -0.5f);  // fake: -0.1 * token
  EXPECT_FLOAT_EQ(lp["token_logprobs"][3].get<float>(), -0.2f);
  EXPECT_FLOAT_EQ(lp["token_logprobs"][4].get<float>(), -1.0f);  // generated: top[0]
  EXPECT_EQ(lp["tokens"][4], "4");                                // fake top[0] = T % V; no vocabulary: ids
  // Top alternatives at prompt position 1 come from the logits row 0 (which predicts token 1).
  std::vector<std::pair<float, int>> row;
  for (int v = 0; v < 16; ++v) row.push_back({FakeEngine::Logit(0, v, 16, 3), v});
  std::sort(row.begin(), row.end(), [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  ASSERT_EQ(lp["top_logprobs"][1].size(), 2u);
  EXPECT_TRUE(lp["top_logprobs"][1].contains(std::to_string(row[0].second)));
  EXPECT_TRUE(lp["top_logprobs"][1].contains(std::to_string(row[1].second)));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(j["usage"]["completion_tokens"], 1);
  // A list of token lists: one choice each.
  auto r2 = Post(f.port(), "/v1/completions", R"({"prompt": [[1, 2], [3, 4, 5]], "max_tokens": 0, "echo": true, "logprobs": 0})");
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r2.json()["choices"].size(), 2u);
  EXPECT_EQ(r2.json()["choices"][1]["logprobs"]["tokens"].size(), 3u);
}

TEST(ServerHttp, EmbeddingsClassifyRerankShapes) {
  Fixture f(Opts());
  auto e = Post(f.port(), "/v1/embeddings", R"({"input": [[1, 2, 3], [4]], "pooling": "last"})");
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.json()["data"][0]["embedding"], json({3.0, 6.0, 1.0, 3.0}));
  EXPECT_EQ(e.json()["data"][1]["index"], 1);
  EXPECT_EQ(e.json()["usage"]["prompt_tokens"], 4);
  auto b = Post(f.port(), "/v1/embeddings", R"({"input": [1, 2, 3], "encoding_format": "base64"})");
  ASSERT_EQ(b.status, 200) << b.body;
  const float want[4] = {3, 6, 1, 2};
  EXPECT_EQ(b.json()["data"][0]["embedding"], Base64(want, sizeof(want)));
  auto c = Post(f.port(), "/v1/classify", R"({"prompt": [1, 2], "labels": [[3], [4, 5]]})");
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = c.json();
  double sum = 0;
  for (const json& l : cj["labels"]) sum += l["probability"].get<double>();
  EXPECT_NEAR(sum, 1.0, 1e-12);
  EXPECT_EQ(cj["label"], json({3}));  // fake: -1.0 vs -1.5 - 1.75
  // Rerank needs text: no vocabulary -> 400.
  ExpectOpenAiError(Post(f.port(), "/v1/rerank", R"({"query": "q", "documents": ["a"]})"), 400);
}

TEST(ServerHttp, BadInputIs400AndTheServerKeepsServing) {
  Fixture f(Opts(/*max_batch_tokens=*/32));
  const int p = f.port();
  ExpectOpenAiError(Post(p, "/v1/completions", "{not json"), 400);
  // A JSON error says where it is, an empty body that it is empty.
  auto bad_json = Post(p, "/v1/completions", R"({"prompt": [1, 2,]})");
  ExpectOpenAiError(bad_json, 400);
  EXPECT_NE(bad_json.json()["error"]["message"].get<std::string>().find("at byte 18 of 19"), std::string::npos)
      << bad_json.body;
  auto bad_utf8 = Post(p, "/v1/completions", "{\"prompt\": \"a\xff\"}");
  ExpectOpenAiError(bad_utf8, 400);
  EXPECT_NE(bad_utf8.json()["error"]["message"].get<std::string>().find("at byte 14 of"), std::string::npos)
      << bad_utf8.body;
  auto empty = Post(p, "/v1/completions", "");
  ExpectOpenAiError(empty, 400);
  EXPECT_NE(empty.json()["error"]["message"].get<std::string>().find("empty"), std::string::npos) << empty.body;
  ExpectOpenAiError(Post(p, "/v1/completions", "[1, 2]"), 400);
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"max_tokens": 0})"), 400);
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"prompt": "text needs a vocabulary"})"), 400);
  auto big = Post(p, "/v1/completions", R"({"prompt": [1, 2], "max_tokens": 16})");
  ExpectOpenAiError(big, 400);
  EXPECT_EQ(big.json()["error"]["code"], "prefill_only");
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"prompt": [1, 2], "echo": "yes"})"), 400);
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"prompt": [1, 2], "logprobs": 21})"), 400);
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"prompt": [1, 2], "n": 2})"), 400);
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"prompt": [1, 2], "stream": true})"), 400);
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"prompt": [1, 99]})"), 400);    // id outside the vocabulary
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"prompt": [1, -1]})"), 400);
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"prompt": [[]]})"), 400);
  for (const char* mixed : {R"({"prompt": [[1], "a"]})", R"({"prompt": ["a", [1]]})"}) {
    const auto r = Post(p, "/v1/completions", mixed);
    ExpectOpenAiError(r, 400);
    EXPECT_NE(r.body.find("mixes strings and token lists"), std::string::npos) << r.body;
  }
  ExpectOpenAiError(Post(p, "/v1/completions", R"({"prompt": [1.5]})"), 400);
  ExpectOpenAiError(Post(p, "/v1/embeddings", R"({"input": [1], "encoding_format": "hex"})"), 400);
  ExpectOpenAiError(Post(p, "/v1/embeddings", R"({"input": [1], "pooling": "max"})"), 400);
  ExpectOpenAiError(Post(p, "/v1/classify", R"({"prompt": [1], "labels": [[2]], "lables": 1})"), 400);  // unknown field
  ExpectOpenAiError(Post(p, "/v1/classify", R"({"prompt": [1], "labels": []})"), 400);
  ExpectOpenAiError(Post(p, "/detokenize", R"({"tokens": "x"})"), 400);
  ExpectOpenAiError(Post(p, "/nowhere", "{}"), 404);
  // Longer than the context (64): 400; fits the context but not one batch (32): 413.
  std::vector<int> ids(65, 1);
  ExpectOpenAiError(Post(p, "/v1/embeddings", json({{"input", ids}}).dump()), 400);
  ids.resize(40);
  auto too_big = Post(p, "/v1/embeddings", json({{"input", ids}}).dump());
  ExpectOpenAiError(too_big, 413);
  EXPECT_NE(too_big.json()["error"]["message"].get<std::string>().find("32"), std::string::npos);
  EXPECT_EQ(Post(p, "/v1/embeddings", R"({"input": [1, 2]})").status, 200);
  // The count is taken after each response is written: allow the last one a moment.
  for (int k = 0; k < 200 && f.server->metrics().requests("/v1/completions", 400) < 18; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(f.server->metrics().requests("/v1/completions", 400), 18u);
}

// Sends `bytes` on a fresh connection, closes the sending side and returns what comes back until
// the server closes the connection (or 5 s pass).
std::string RawExchange(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string out;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t w = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (w <= 0) break;  // the server may close on a bad request before reading all of it
      done += static_cast<size_t>(w);
    }
    ::shutdown(fd, SHUT_WR);
    char buf[4096];
    for (ssize_t r; (r = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

// A body that stops at the end of the stream (the client closed mid-body) is still answered 400
// (a client that only shut down its sending side reads it), and /metrics counts it as 499, as a
// client gone while waiting, not as a bad request.
TEST(ServerHttp, ABodyCutShortByTheClientClosingCountsAs499) {
  Fixture f(Opts());
  const std::string post = "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  const std::string reply = RawExchange(f.port(), post + "Content-Length: 100\r\n\r\n{\"input\": [1");
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply.substr(0, 200);
  for (int k = 0; k < 400 && f.server->metrics().requests("/v1/embeddings", 499) == 0; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(f.server->metrics().requests("/v1/embeddings", 499), 1u);
  EXPECT_EQ(f.server->metrics().requests("/v1/embeddings", 400), 0u);
}

// Malformed HTTP from raw sockets: each is answered with a 4xx or the connection is closed, and
// the server goes on answering well-formed requests.
TEST(ServerHttp, MalformedHttpIsRefusedAndTheServerKeepsServing) {
  Fixture f(Opts());
  const int p = f.port();
  const std::string post = "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  // served: the request can still be read as a valid one (httplib skips a header line without a
  // colon), so a 200 is a fair answer too.
  struct Case {
    const char* what;
    std::string bytes;
    bool served = false;
  };
  const std::vector<Case> cases = {
      {"not HTTP", "GARBAGE\r\n\r\n"},
      {"NUL bytes", std::string(4096, '\0')},
      {"unknown HTTP version", "GET /health HTTP/9.9\r\n\r\n"},
      {"NUL in the path", std::string("GET /hea\0lth HTTP/1.1\r\nHost: x\r\n\r\n", 34)},
      {"header without a colon", "GET /health HTTP/1.1\r\nHost x\r\nno-colon-here\r\n\r\n", true},
      {"a 64 KiB header line", "GET /health HTTP/1.1\r\nX-Big: " + std::string(65536, 'a') + "\r\n\r\n"},
      {"negative Content-Length", post + "Content-Length: -5\r\n\r\n{}"},
      {"Content-Length past 2^64", post + "Content-Length: 99999999999999999999999\r\n\r\n{}"},
      {"Content-Length over the body limit", post + "Content-Length: 99999999999\r\n\r\n{}"},
      {"two Content-Lengths", post + "Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}"},
      {"bad chunk size", post + "Transfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n0\r\n\r\n"},
      {"chunk longer than said", post + "Transfer-Encoding: chunked\r\n\r\n2\r\n{\"input\": [1]}\r\n0\r\n\r\n"},
      {"body cut short", post + "Content-Length: 100\r\n\r\n{\"input\": [1"},
      {"invalid UTF-8 in the body", post + "Content-Length: 16\r\n\r\n{\"input\": \"\xff\xfe\"}"},
  };
  for (const Case& c : cases) {
    const std::string reply = RawExchange(p, c.bytes);
    const bool refused = reply.empty() || reply.rfind("HTTP/1.1 4", 0) == 0;
    EXPECT_TRUE(refused || (c.served && reply.rfind("HTTP/1.1 200", 0) == 0)) << c.what << ": " << reply.substr(0, 200);
    // The server still answers, after each one.
    EXPECT_EQ(Get(p, "/health").status, 200) << c.what;
  }
  // A well-formed request over the same raw path works (the helper itself is not the problem).
  const std::string body = R"({"input": [1, 2]})";
  const std::string ok = RawExchange(p, post + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok.substr(0, 200);
  EXPECT_EQ(Post(p, "/v1/embeddings", body).status, 200);
}

TEST(ServerHttp, ApiKeyIsRequiredExceptForHealth) {
  ServerOptions o = Opts();
  o.api_key = "sekrit";
  Fixture f(o);
  ExpectOpenAiError(Post(f.port(), "/v1/embeddings", R"({"input": [1]})"), 401);
  ExpectOpenAiError(Post(f.port(), "/v1/embeddings", R"({"input": [1]})", "wrong"), 401);
  ExpectOpenAiError(Get(f.port(), "/v1/models"), 401);
  EXPECT_EQ(Post(f.port(), "/v1/embeddings", R"({"input": [1]})", "sekrit").status, 200);
  EXPECT_EQ(Get(f.port(), "/health").status, 200);
  EXPECT_EQ(Get(f.port(), "/metrics", "sekrit").status, 200);
}

TEST(ServerHttp, BodyOverTheLimitIs413) {
  ServerOptions o = Opts();
  o.max_body_bytes = 1000;
  Fixture f(o);
  std::string body = R"({"input": [1], "user": ")" + std::string(2000, 'x') + "\"}";
  ExpectOpenAiError(Post(f.port(), "/v1/embeddings", body), 413);
  EXPECT_EQ(Post(f.port(), "/v1/embeddings", R"({"input": [1]})").status, 200);
}

// curl -d sends a JSON body as application/x-www-form-urlencoded; cpp-httplib alone would refuse
// such a body over 8 KiB with a bare 413. Every route reads it as JSON up to --max-body.
TEST(ServerHttp, FormEncodedJsonBodyIsReadAsJsonUpToTheLimit) {
  ServerOptions o = Opts();
  o.max_body_bytes = 64 * 1024;
  Fixture f(o);
  const std::string body = R"({"input": [1], "user": ")" + std::string(20000, 'x') + "\"}";
  const std::string form = "application/x-www-form-urlencoded";
  auto r = Post(f.port(), "/v1/embeddings", body, "", 30000, form);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["object"], "list");
  ExpectOpenAiError(Post(f.port(), "/v1/embeddings", R"({"input": )", "", 30000, form), 400);
  const std::string over = R"({"input": [1], "user": ")" + std::string(70000, 'x') + "\"}";
  ExpectOpenAiError(Post(f.port(), "/v1/embeddings", over, "", 30000, form), 413);
}

TEST(ServerHttp, FullQueueIs429WithRetryAfter) {
  Fixture f(Opts(256, /*max_queue=*/2));
  f.fake.close();
  std::vector<std::thread> clients;
  std::vector<int> status(3, 0);
  clients.emplace_back([&] { status[0] = Post(f.port(), "/v1/embeddings", R"({"input": [1]})").status; });
  while (f.fake.running.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // held by the engine
  for (int i = 1; i < 3; ++i)
    clients.emplace_back([&, i] { status[i] = Post(f.port(), "/v1/embeddings", json({{"input", {i + 1}}}).dump()).status; });
  // Wait until both are queued.
  for (int k = 0; k < 2000; ++k) {
    const std::string m = Get(f.port(), "/metrics").body;
    if (m.find("estream_queue_jobs 2\n") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto r = Post(f.port(), "/v1/embeddings", R"({"input": [9]})");
  ExpectOpenAiError(r, 429);
  EXPECT_TRUE(r.headers.count("Retry-After"));
  EXPECT_GE(std::stoi(r.headers.find("Retry-After")->second), 1);
  f.fake.open();
  for (auto& t : clients) t.join();
  EXPECT_EQ(status, (std::vector<int>{200, 200, 200}));
}

TEST(ServerHttp, TimeoutIs504) {
  ServerOptions o = Opts();
  o.timeout_seconds = 0.2;
  Fixture f(o);
  f.fake.close();
  auto r = Post(f.port(), "/v1/embeddings", R"({"input": [1]})");
  ExpectOpenAiError(r, 504);
  EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("within 0.2 s (--timeout)"), std::string::npos) << r.body;
  f.fake.open();
  EXPECT_EQ(Post(f.port(), "/v1/embeddings", R"({"input": [2]})").status, 200);
}

TEST(ServerHttp, AClientThatDisconnectsCancelsItsQueuedJob) {
  Fixture f(Opts());
  f.fake.close();
  std::thread holder([&] { EXPECT_EQ(Post(f.port(), "/v1/embeddings", R"({"input": [1]})").status, 200); });
  while (f.fake.running.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // This client gives up after 300 ms: its job (first token 7) is queued behind the held batch.
  auto r = Post(f.port(), "/v1/embeddings", R"({"input": [7, 7]})", "", /*read_timeout_ms=*/300);
  EXPECT_EQ(r.status, -1);
  for (int k = 0; k < 400 && f.server->metrics().requests("/v1/embeddings", 499) == 0; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(f.server->metrics().requests("/v1/embeddings", 499), 1u);
  f.fake.open();
  holder.join();
  EXPECT_EQ(Post(f.port(), "/v1/embeddings", R"({"input": [3]})").status, 200);
  const auto seen = f.fake.seen_tokens();
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 7), 0) << "the cancelled job ran";
}

TEST(ServerHttp, ConcurrentClientsGetTheirOwnAnswers) {
  Fixture f(Opts(64, 64));
  auto body = [](int t, int i) {
    std::vector<int> ids;
    for (int k = 0; k <= (t + i) % 9; ++k) ids.push_back((t * 5 + i + k) % 16);
    return json({{"input", ids}, {"pooling", "mean"}}).dump();
  };
  // Sequential answers first, then the same requests from 8 threads at once.
  std::map<std::pair<int, int>, std::string> want;
  for (int t = 0; t < 8; ++t)
    for (int i = 0; i < 20; ++i) want[{t, i}] = testing::Json(Post(f.port(), "/v1/embeddings", body(t, i)).body)["data"].dump();
  const int batches_before = f.fake.batches.load();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      httplib::Client c("127.0.0.1", f.port());
      c.set_keep_alive(true);  // one connection per client (httplib's default is one per request)
      for (int i = 0; i < 20; ++i) {
        auto r = c.Post("/v1/embeddings", body(t, i), "application/json");
        if (!r || r->status != 200 || testing::Json(r->body)["data"].dump() != want[{t, i}]) ++bad;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LT(f.fake.batches.load() - batches_before, 160);  // some requests shared a batch
}

// Bursts of new connections (httplib's Client opens one per request unless set_keep_alive) are
// all answered. With httplib 0.11's listen backlog of 5 the kernel's queues overflowed: a SYN
// cookie whose ACK met a full accept queue was later answered with a RST after the client had
// sent its request, which the client saw as a read error (docs/DESIGN.md section 14): 22 of
// 20,000 such requests from 64 clients failed before the server raised the backlog.
TEST(ServerHttp, BurstsOfNewConnectionsAreAllAnswered) {
  Fixture f(Opts());
  const int clients = 64, per_client = 40;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < per_client; ++i) {
        httplib::Client c("127.0.0.1", f.port());
        c.set_read_timeout(60, 0);
        auto r = c.Get("/health");
        if (!r || r->status != 200) {
          if (++bad <= 3) ADD_FAILURE() << (r ? std::to_string(r->status) : "no response: " + httplib::to_string(r.error()));
        }
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(ServerHttp, ShutdownFinishesQueuedWorkAndStopsListening) {
  Fixture f(Opts());
  f.fake.close();
  std::vector<std::thread> clients;
  std::vector<int> status(4, 0);
  std::vector<std::string> connection(4);
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", f.port());
      c.set_keep_alive(true);  // else the request itself asks for "Connection: close"
      const auto r = c.Post("/v1/embeddings", json({{"input", {i + 1}}}).dump(), "application/json");
      if (!r) return;
      status[i] = r->status;
      // Answered after the stop began: the connection serves no further request, and says so.
      connection[i] = r->get_header_value("Connection");
    });
  while (f.fake.running.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    f.fake.open();
  });
  const auto t0 = std::chrono::steady_clock::now();
  f.server->Shutdown();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  opener.join();
  for (auto& t : clients) t.join();
  EXPECT_LT(s, 5.0);
  EXPECT_EQ(status, (std::vector<int>{200, 200, 200, 200}));  // within the grace: all finished
  EXPECT_EQ(connection, (std::vector<std::string>(4, "close")));
  EXPECT_EQ(Get(f.port(), "/health").status, -1);             // not listening any more
}

// A batch still running when the shutdown grace has passed is interrupted (the engine stops at
// its next layer): its client gets a 503 shutting_down, and the shutdown ends soon after the grace.
TEST(ServerHttp, ShutdownInterruptsABatchRunningPastTheGrace) {
  ServerOptions o = Opts();
  o.shutdown_grace_seconds = 0.1;
  Fixture f(o);
  f.fake.interruptible = true;
  f.fake.close();
  testing::HttpResult r;
  std::thread client([&] { r = Post(f.port(), "/v1/embeddings", R"({"input": [1, 2]})"); });
  while (f.fake.running.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t0 = std::chrono::steady_clock::now();
  f.server->Shutdown();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  client.join();
  EXPECT_LT(s, 5.0);
  ExpectOpenAiError(r, 503);
  EXPECT_EQ(r.json()["error"]["code"], "shutting_down") << r.body;
}

// A second server on a port in use fails to bind it (httplib's default SO_REUSEPORT let it bind
// too, and the kernel split the connections between the two).
TEST(ServerHttp, ASecondServerOnAPortInUseFailsToBind) {
  Fixture f(Opts());
  ServerOptions o = Opts();
  o.port = f.port();
  Server second(o);
  const Status s = second.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot bind 127.0.0.1:" + std::to_string(f.port()) + " (in use"), std::string::npos)
      << s.message();
  EXPECT_EQ(Get(f.port(), "/health").status, 200);
}

// The replies of the requests in flight fit the reply memory: a request whose reply alone needs
// more gets 413 naming the limit, one with too many inputs 400; requests that fit one at a time
// but not together wait for room instead of failing.
TEST(ServerHttp, RepliesFitTheReplyMemory) {
  ServerOptions o = Opts(/*max_batch_tokens=*/4096);
  o.reply_memory_bytes = 200 * 1024;  // also holds each body's parsed tree (88 bytes an input here)
  Fixture f(o);
  const int p = f.port();
  std::vector<std::vector<int>> many(1000, std::vector<int>{1});  // 1000 embeddings: ~470 KB of reply
  auto big = Post(p, "/v1/embeddings", json({{"input", many}}).dump());
  ExpectOpenAiError(big, 413);
  EXPECT_EQ(big.json()["error"]["code"], "reply_too_large");
  EXPECT_NE(big.json()["error"]["message"].get<std::string>().find("--reply-memory"), std::string::npos) << big.body;
  many.resize(2049, std::vector<int>{1});
  auto too_many = Post(p, "/v1/embeddings", json({{"input", many}}).dump());
  ExpectOpenAiError(too_many, 400);
  EXPECT_EQ(too_many.json()["error"]["code"], "too_many_inputs");
  // 300 embeddings take more than half of the reply memory: two such requests run one after the other.
  many.resize(300);
  const std::string body = json({{"input", many}}).dump();
  f.fake.close();
  std::vector<int> status(2, 0);
  std::thread first([&] { status[0] = Post(p, "/v1/embeddings", body).status; });
  while (f.fake.running.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread second([&] { status[1] = Post(p, "/v1/embeddings", body).status; });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Get(p, "/metrics").body.find("estream_queue_jobs 1\n"), std::string::npos);  // not queued: waiting
  f.fake.open();
  first.join();
  second.join();
  EXPECT_EQ(status, (std::vector<int>{200, 200}));
  EXPECT_EQ(Post(p, "/v1/embeddings", body).json()["data"].size(), 300u);  // the memory was given back
}

// A body's parsed JSON tree is counted before it is built (JsonTreeBytes) and held in the reply
// memory: thousands of empty objects in a field no route reads (~20 bytes of tree per body byte)
// get 413 on every route that parses a body, while a body of token ids runs.
TEST(ServerHttp, ParsedBodiesFitTheReplyMemory) {
  EXPECT_EQ(JsonTreeBytes("not json"), 0u);
  EXPECT_GE(JsonTreeBytes(R"({"a": [1, 2, 3]})"), 48u + 96 + 24 + 3 * 32);
  ServerOptions o = Opts(/*max_batch_tokens=*/4096);
  o.reply_memory_bytes = 256 * 1024;
  Fixture f(o);
  const int p = f.port();
  const json empties = json::array_t(8000, json::object());  // 24 KB of text, ~0.8 MB as a tree
  for (const char* route : {"/v1/completions", "/v1/embeddings", "/tokenize"}) {
    json body = {{"user", empties}};
    body[std::string(route) == "/v1/embeddings" ? "input" : std::string(route) == "/tokenize" ? "content" : "prompt"] =
        "hi";
    auto r = Post(p, route, body.dump());
    ExpectOpenAiError(r, 413);
    EXPECT_EQ(r.json()["error"]["code"], "body_too_complex") << route << " " << r.body;
    EXPECT_NE(r.json()["error"]["message"].get<std::string>().find("--reply-memory"), std::string::npos) << r.body;
  }
  const std::vector<std::vector<int>> ids(40, std::vector<int>(60, 1));  // 2400 ids: ~77 KiB as a tree, fits
  EXPECT_EQ(Post(p, "/v1/embeddings", json({{"input", ids}}).dump()).status, 200);
  EXPECT_NE(Post(p, "/tokenize", json({{"content", "hello"}}).dump()).status, 413);
}

// Opens a connection to 127.0.0.1:port; -1 on failure.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A client that sends a request's headers one byte every 200 ms, never finishing them, until the
// server closes the connection (or `give_up_s` pass); returns the seconds it was connected.
double Trickle(int port, double give_up_s) {
  const int fd = Connect(port);
  EXPECT_GE(fd, 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const std::string head = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(1000, 'a');
  for (size_t i = 0; i < head.size() && elapsed() < give_up_s; ++i) {
    if (::send(fd, &head[i], 1, MSG_NOSIGNAL) != 1) break;
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, 200) > 0) break;  // the server closed it (or answered)
  }
  ::close(fd);
  return elapsed();
}

// A request's headers must all come within header_timeout_seconds: a client trickling them a
// byte at a time is disconnected, and /health is answered meanwhile.
TEST(ServerHttp, AClientTricklingHeadersIsDisconnected) {
  ServerOptions o = Opts();
  o.header_timeout_seconds = 1;
  o.http_threads = 3;
  Fixture f(o);
  double took[2] = {0, 0};
  std::thread a([&] { took[0] = Trickle(f.port(), 20); });
  std::thread b([&] { took[1] = Trickle(f.port(), 20); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Get(f.port(), "/health").status, 200);
  a.join();
  b.join();
  for (double t : took) {
    EXPECT_GT(t, 0.8);
    EXPECT_LT(t, 4.0);
  }
}

// Shutdown does not wait on a client that trickles a request: it is closed shutdown_drain_seconds
// after the stop began, and counted.
TEST(ServerHttp, ShutdownDoesNotWaitForATricklingClient) {
  ServerOptions o = Opts();
  o.header_timeout_seconds = 60;
  o.shutdown_drain_seconds = 1;
  Fixture f(o);
  double connected = 0;
  std::thread slow([&] { connected = Trickle(f.port(), 30); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = std::chrono::steady_clock::now();
  f.server->Shutdown();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  slow.join();
  EXPECT_LT(s, 3.0);
  EXPECT_LT(connected, 4.0);
  EXPECT_EQ(f.server->connections_cut_off(), 1);
}

// Replies after which the server closes the connection say so, and advertise no keep-alive.
TEST(ServerHttp, RepliesBeforeAClosedConnectionSayConnectionClose) {
  ServerOptions o = Opts();
  o.api_key = "sekrit";
  o.max_body_bytes = 100;
  Fixture f(o);
  const std::string post = "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n";
  const std::string auth = "Authorization: Bearer sekrit\r\n";
  struct Case {
    const char* what;
    std::string bytes, status;
  };
  const std::vector<Case> cases = {
      {"401", post + "Content-Length: 2\r\n\r\n{}", "HTTP/1.1 401"},
      {"411", post + auth + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "HTTP/1.1 411"},
      {"413", post + auth + "Content-Length: 1000\r\n\r\n{}", "HTTP/1.1 413"},
      {"400 (Content-Length)", post + auth + "Content-Length: x\r\n\r\n{}", "HTTP/1.1 400"},
  };
  for (const Case& c : cases) {
    const std::string reply = RawExchange(f.port(), c.bytes);
    const std::string head = reply.substr(0, reply.find("\r\n\r\n"));
    EXPECT_EQ(head.rfind(c.status, 0), 0u) << c.what << ": " << head;
    EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << c.what << ": " << head;
    EXPECT_EQ(head.find("Keep-Alive"), std::string::npos) << c.what << ": " << head;
  }
  // An answered request keeps the connection open.
  const std::string ok = RawExchange(f.port(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(ok.find("Keep-Alive"), std::string::npos) << ok;
  // HTTP/1.0 closes after the reply unless it asks for keep-alive, and the reply says which.
  const std::string v10 = RawExchange(f.port(), "GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(v10.rfind("HTTP/1.1 200", 0), 0u) << v10;
  EXPECT_NE(v10.find("\r\nConnection: close"), std::string::npos) << v10;
  EXPECT_EQ(v10.find("Keep-Alive"), std::string::npos) << v10;
  const std::string v10_kept = RawExchange(f.port(), "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  EXPECT_EQ(v10_kept.find("Connection: close"), std::string::npos) << v10_kept;
}

// A malformed or conflicting Content-Length is a 400 naming the header; the same value twice is
// one length.
TEST(ServerHttp, AMalformedOrConflictingContentLengthIs400) {
  Fixture f(Opts());
  const std::string post = "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  for (const std::string& bad : {post + "Content-Length: -5\r\n\r\n{}", post + "Content-Length: 1e3\r\n\r\n{}",
                                 post + "Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}"}) {
    const std::string reply = RawExchange(f.port(), bad);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
    EXPECT_NE(reply.find("Content-Length"), std::string::npos) << reply;
    EXPECT_EQ(reply.find("18446744073709551611"), std::string::npos) << reply;
  }
  const std::string huge = RawExchange(f.port(), post + "Content-Length: 99999999999999999999999\r\n\r\n{}");
  EXPECT_EQ(huge.rfind("HTTP/1.1 413", 0), 0u) << huge;
  const std::string body = R"({"input": [1, 2]})";
  const std::string n = std::to_string(body.size());
  const std::string twice = RawExchange(f.port(), post + "Content-Length: " + n + "\r\nContent-Length: " + n + "\r\n\r\n" + body);
  EXPECT_EQ(twice.rfind("HTTP/1.1 200", 0), 0u) << twice;
}

// The alias routes (/embeddings, ...) count in /metrics as their /v1 routes, as their 499s do.
TEST(ServerHttp, AliasRoutesCountAsTheirV1Routes) {
  Fixture f(Opts());
  ASSERT_EQ(Post(f.port(), "/embeddings", R"({"input": [1]})").status, 200);
  ASSERT_EQ(Post(f.port(), "/completions", R"({"prompt": [1]})").status, 200);
  for (int k = 0; k < 200 && f.server->metrics().requests("/v1/completions", 200) == 0; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(f.server->metrics().requests("/v1/embeddings", 200), 1u);
  EXPECT_EQ(f.server->metrics().requests("/v1/completions", 200), 1u);
  EXPECT_EQ(f.server->metrics().requests("other", 200), 0u);
}

// Token ids past 2^63 are reported as sent, not wrapped to negative numbers.
TEST(ServerHttp, HugeTokenIdsAreReportedAsSent) {
  Fixture f(Opts());
  for (const char* id : {"18446744073709551615", "9223372036854775808", "-9223372036854775808", "4294967296"}) {
    for (const auto& [path, body] : {std::pair<std::string, std::string>{"/v1/completions", std::string(R"({"prompt": [1, )") + id + "]}"},
                                     {"/detokenize", std::string(R"({"tokens": [)") + id + "]}"}}) {
      auto r = Post(f.port(), path, body);
      ExpectOpenAiError(r, 400);
      EXPECT_NE(r.json()["error"]["message"].get<std::string>().find(std::string("token id ") + id + " "), std::string::npos)
          << path << ": " << r.body;
    }
  }
}

// The head of a raw reply (up to the blank line) and its body.
std::pair<std::string, std::string> SplitReply(const std::string& reply) {
  const size_t end = reply.find("\r\n\r\n");
  if (end == std::string::npos) return {reply, ""};
  return {reply.substr(0, end), reply.substr(end + 4)};
}

size_t CountReplies(const std::string& raw) {
  size_t n = 0;
  for (size_t at = raw.find("HTTP/1.1 "); at != std::string::npos; at = raw.find("HTTP/1.1 ", at + 1)) ++n;
  return n;
}

// A body is read only when framed by a Content-Length: httplib reads a chunked body (its
// "chunked" in any case) without the --max-body limit, unpacks a gzip body without a limit, and
// reads a body without a length until the client closes. Each is refused unread (411 / 415),
// with an OpenAI error and Connection: close.
TEST(ServerHttp, BodiesNotFramedByContentLengthOrCompressedAreRefusedUnread) {
  ServerOptions o = Opts();
  o.max_body_bytes = 1000;
  Fixture f(o);
  const std::string post = "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  const std::string big = R"({"input": [1], "user": ")" + std::string(4000, 'x') + "\"}";
  char size[16];
  std::snprintf(size, sizeof(size), "%zx", big.size());
  const std::string chunk = std::string(size) + "\r\n" + big + "\r\n0\r\n\r\n";
  // {"input": [1], "user": "x...x"} (4,000 x), gzipped: 69 bytes, under the 1,000 the body may hold.
  const std::string gzipped(
      "\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xed\xc7\xab\x09\x00\x20\x00\x45\xd1\x55\xe4\x65\x8b\xd5\x55\xc4"
      "\x68\xb0\x88\xf8\x01\x41\xdc\x5d\xb7\xb0\xdc\xd3\xce\x56\x2e\x75\x0e\x79\x13\x5c\xb4\x46\xb3\xa7\xf6\xa2"
      "\x05\x00\x00\x00\x00\x00\xbe\xd3\xb9\x08\x96\x50\xfd\xba\x0f\x00\x00",
      69);
  struct Case {
    const char* what;
    std::string bytes, status, says;
  };
  const std::vector<Case> cases = {
      {"Chunked", post + "Transfer-Encoding: Chunked\r\n\r\n" + chunk, "HTTP/1.1 411", "Transfer-Encoding"},
      {"CHUNKED", post + "Transfer-Encoding: CHUNKED\r\n\r\n" + chunk, "HTTP/1.1 411", "Transfer-Encoding"},
      {"gzip, chunked", post + "Transfer-Encoding: gzip, chunked\r\n\r\n" + chunk, "HTTP/1.1 411", "Transfer-Encoding"},
      {"no Content-Length", post + "\r\n" + big, "HTTP/1.1 411", "Content-Length"},
      {"gzip", post + "Content-Encoding: gzip\r\nContent-Length: 69\r\n\r\n" + gzipped, "HTTP/1.1 415", "uncompressed"},
      {"deflate", post + "Content-Encoding: deflate\r\nContent-Length: 2\r\n\r\n{}", "HTTP/1.1 415", "uncompressed"},
  };
  for (const Case& c : cases) {
    const auto [head, body] = SplitReply(RawExchange(f.port(), c.bytes));
    EXPECT_EQ(head.rfind(c.status, 0), 0u) << c.what << ": " << head;
    EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << c.what << ": " << head;
    const json j = testing::Json(body);
    ASSERT_TRUE(j.contains("error")) << c.what << ": " << body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(c.says), std::string::npos) << c.what << ": " << body;
    EXPECT_EQ(Get(f.port(), "/health").status, 200) << c.what;
  }
  EXPECT_EQ(f.fake.batches.load(), 0);  // none of them ran
  // "identity" is no encoding at all.
  const std::string small = R"({"input": [1]})";
  const std::string identity =
      RawExchange(f.port(), post + "Content-Encoding: identity\r\nContent-Length: " + std::to_string(small.size()) + "\r\n\r\n" + small);
  EXPECT_EQ(identity.rfind("HTTP/1.1 200", 0), 0u) << identity;
}

// No bytes of a request are read as the start of another: not the body of a GET (which httplib
// does not read; a proxy in front would have sent them as that body, and the request hidden in
// them would be answered to whoever uses the connection next), nor what follows a malformed
// request line or an over-long header line. The request is answered or refused, and the
// connection closed; httplib's refusals are OpenAI errors naming the problem.
TEST(ServerHttp, NoBytesOfARequestAreReadAsTheNextRequest) {
  Fixture f(Opts());
  const std::string hidden = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  struct Case {
    const char* what;
    std::string bytes, status, says;
  };
  const std::vector<Case> cases = {
      {"a GET with a body", "GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(hidden.size()) + "\r\n\r\n" + hidden,
       "HTTP/1.1 200", ""},
      {"a malformed request line", "GARBAGE\r\n" + hidden, "HTTP/1.1 400", "request line"},
      {"a header line over 8 KiB", "GET /health HTTP/1.1\r\nX-Big: " + std::string(9000, 'a') + "\r\n" + hidden,
       "HTTP/1.1 400", "headers"},
      {"a request line over 8 KiB", "GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n" + hidden, "HTTP/1.1 414",
       "request line"},
  };
  for (const Case& c : cases) {
    const std::string reply = RawExchange(f.port(), c.bytes);
    EXPECT_EQ(CountReplies(reply), 1u) << c.what << ": " << reply.substr(0, 600);
    const auto [head, body] = SplitReply(reply);
    EXPECT_EQ(head.rfind(c.status, 0), 0u) << c.what << ": " << head;
    EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << c.what << ": " << head;
    if (!c.says.empty()) {
      const json j = testing::Json(body);
      ASSERT_TRUE(j.contains("error")) << c.what << ": " << body;
      EXPECT_NE(j["error"]["message"].get<std::string>().find(c.says), std::string::npos) << c.what << ": " << body;
    }
  }
  // A body cut short says what was missing.
  const auto [head, body] = SplitReply(RawExchange(
      f.port(), "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"input\": [1"));
  EXPECT_EQ(head.rfind("HTTP/1.1 400", 0), 0u) << head;
  EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << head;
  EXPECT_NE(testing::Json(body)["error"]["message"].get<std::string>().find("Content-Length says 100 bytes"), std::string::npos)
      << body;
}

// A known route asked with another method is a 405 naming the method to use (Allow), as vLLM
// answers; a path that is no route stays a 404.
TEST(ServerHttp, AKnownRouteWithTheWrongMethodIs405) {
  Fixture f(Opts());
  auto get = Get(f.port(), "/v1/completions");
  ExpectOpenAiError(get, 405);
  EXPECT_EQ(get.headers.find("Allow")->second, "POST");
  auto post = Post(f.port(), "/health", "{}");
  ExpectOpenAiError(post, 405);
  EXPECT_EQ(post.headers.find("Allow")->second, "GET");
  ExpectOpenAiError(Get(f.port(), "/models"), 404);  // only /v1/models
  ExpectOpenAiError(Get(f.port(), "/v1/chat/completions"), 404);
  EXPECT_EQ(Get(f.port(), "/health").status, 200);
}

}  // namespace
}  // namespace estream::server
