// `estream serve`'s routes on a real engine (the shared tiny OLMoE model, with its BPE vocabulary)
// through a real HTTP client: every result equals the library's for the same input (bit for bit:
// JSON carries floats exactly), concurrent clients get the answers of sequential ones, and a
// bounded load test (2,000 mixed requests from 16 clients) runs without an error while the RSS
// stays flat after warm-up.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "base/memory.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "server/api.h"
#include "server/server.h"
#include "tests/cli_test_util.h"
#include "tests/server_test_util.h"
#include "tokenizer/tokenizer.h"

namespace estream::server {
namespace {

using json = nlohmann::json;
using testing::Post;

const std::string kModel = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/olmoe-tiny-f32.gguf";

class ServerEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto g = GgufFile::Open(kModel, {.mmap = false});
    ASSERT_TRUE(g.ok()) << g.status().message();
    auto t = Tokenizer::FromGguf(**g);
    ASSERT_TRUE(t.ok()) << t.status().message();
    tok_ = std::move(t).value().release();
    EngineOptions eo;
    eo.n_threads = 1;
    auto e = Engine::Load(kModel, eo);
    ASSERT_TRUE(e.ok()) << e.status().message();
    engine_ = std::move(e).value().release();
    ServerOptions o;
    o.compute_threads = 2;  // the echo-logprobs sink over two threads, as `estream serve -t 2`
    o.port = 0;
    o.scheduler.max_batch_tokens = 512;
    o.scheduler.max_queue = 64;
    server_ = new Server(o);
    ASSERT_TRUE(server_->Start().ok());
    server_->SetBackend(EngineRunner(engine_), engine_->info(), tok_, "tiny", engine_->pass_tokens());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete engine_;
    delete tok_;
  }
  static Response Lib(const Request& r) {
    auto out = engine_->RunBatch(std::span<const Request>(&r, 1));
    EXPECT_TRUE(out[0].ok()) << out[0].status().message();
    return std::move(out[0]).value();
  }
  static int port() { return server_->port(); }

  static Tokenizer* tok_;
  static Engine* engine_;
  static Server* server_;
};
Tokenizer* ServerEngine::tok_ = nullptr;
Engine* ServerEngine::engine_ = nullptr;
Server* ServerEngine::server_ = nullptr;

// The top alternatives of a row equal std::partial_sort's (best first, ties: lower id) on rows
// with many ties, rising and falling runs (insertions in every position), and V not a multiple
// of the 8-logit skip.
TEST(TopLogprobs, EqualPartialSortWithTies) {
  std::mt19937 rng(31);
  for (int64_t V : {1, 5, 8, 9, 17, 100, 1001, 50257}) {
    for (int shape = 0; shape < 3; ++shape) {
      std::vector<float> row(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v) {
        const float r = static_cast<float>(rng() % 64) / 8.0f - 4.0f;  // 64 levels: ties
        row[v] = shape == 0 ? r : shape == 1 ? r + 0.001f * static_cast<float>(v) : r - 0.001f * static_cast<float>(v);
      }
      const double lse = kernels::LogSumExp(row.data(), V);
      for (int n : {1, 2, 5, 20, static_cast<int>(V) + 3}) {
        std::vector<int32_t> ids(static_cast<size_t>(V));
        std::iota(ids.begin(), ids.end(), 0);
        const size_t k = static_cast<size_t>(std::min<int64_t>(n, V));
        std::partial_sort(ids.begin(), ids.begin() + static_cast<int64_t>(k), ids.end(), [&](int32_t a, int32_t b) {
          return row[a] > row[b] || (row[a] == row[b] && a < b);
        });
        const std::vector<TokenLogprob> top = server::TopLogprobs(row.data(), V, n);
        ASSERT_EQ(top.size(), k) << "V=" << V << " n=" << n;
        for (size_t i = 0; i < k; ++i) {
          ASSERT_EQ(top[i].token, ids[i]) << "V=" << V << " n=" << n << " shape=" << shape << " i=" << i;
          EXPECT_EQ(top[i].logprob, static_cast<float>(row[ids[i]] - lse));
        }
      }
    }
  }
}

TEST_F(ServerEngine, CompletionEchoLogprobsEqualTheLibrary) {
  const std::string text = "The quick brown fox jumps over the lazy dog";
  auto r = Post(port(), "/v1/completions",
                json({{"prompt", text}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 3}}).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json lp = r.json()["choices"][0]["logprobs"];
  Request q;
  q.tokens = tok_->Encode(text, true, false);
  q.top_k = 3;
  q.prompt_logprobs = true;
  q.logits = Request::Logits::kAll;
  const Response want = Lib(q);
  const size_t T = q.tokens.size();
  ASSERT_EQ(lp["tokens"].size(), T + 1);
  for (size_t t = 1; t < T; ++t) {
    EXPECT_EQ(lp["token_logprobs"][t].get<float>(), want.prompt_logprobs[t - 1]) << t;
    EXPECT_EQ(lp["tokens"][t], TokenString(tok_, q.tokens[t]));
    // Top-3 at position t: the logits row t - 1.
    const int V = engine_->info().n_vocab;
    const float* row = want.logits.data() + (t - 1) * V;
    std::vector<int> ids(V);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + 3, ids.end(),
                      [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    EXPECT_TRUE(lp["top_logprobs"][t].contains(TokenString(tok_, ids[0]))) << t;
    // The most likely token's logprob and the actual token's agree where they are the same token.
    if (ids[0] == q.tokens[t]) {
      EXPECT_EQ(lp["top_logprobs"][t][TokenString(tok_, ids[0])].get<float>(), want.prompt_logprobs[t - 1]);
    }
  }
  EXPECT_EQ(lp["tokens"][T], TokenString(tok_, want.top[0].token));
  EXPECT_EQ(lp["token_logprobs"][T].get<float>(), want.top[0].logprob);
  EXPECT_EQ(r.json()["choices"][0]["text"], text + tok_->Decode(std::vector<int32_t>{want.top[0].token}));

  // Token ids in, max_tokens 0, no echo: an empty completion with nothing to score.
  auto r0 = Post(port(), "/v1/completions", json({{"prompt", q.tokens}, {"max_tokens", 0}}).dump());
  ASSERT_EQ(r0.status, 200) << r0.body;
  EXPECT_EQ(r0.json()["choices"][0]["text"], "");
}

TEST_F(ServerEngine, EmbeddingsEqualTheLibrary) {
  for (const char* pooling : {"mean", "last"}) {
    auto r = Post(port(), "/v1/embeddings",
                  json({{"input", {"hello world", "a second, longer input text"}}, {"pooling", pooling}}).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    for (int i = 0; i < 2; ++i) {
      Request q;
      q.tokens = tok_->Encode(i == 0 ? "hello world" : "a second, longer input text", true, false);
      q.top_k = 0;
      q.embedding = std::string(pooling) == "mean" ? Request::Pooling::kMean : Request::Pooling::kLast;
      const Response want = Lib(q);
      const json got = r.json()["data"][i]["embedding"];
      ASSERT_EQ(got.size(), want.embedding.size());
      for (size_t k = 0; k < want.embedding.size(); ++k) ASSERT_EQ(got[k].get<float>(), want.embedding[k]) << k;
    }
  }
}

TEST_F(ServerEngine, ClassifyAndRerankEqualTheLibrary) {
  auto r = Post(port(), "/v1/classify",
                json({{"prompt", "The movie was wonderful. Sentiment:"}, {"labels", {" positive", " negative", " meh"}}}).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  Request q;
  q.tokens = tok_->Encode("The movie was wonderful. Sentiment:", true, false);
  q.top_k = 0;
  for (const char* l : {" positive", " negative", " meh"}) q.continuations.push_back(tok_->Encode(l, false, false));
  const Response want = Lib(q);
  double mx = -INFINITY, s = 0;
  for (const auto& c : want.continuations) mx = std::max(mx, c.log_likelihood);
  for (const auto& c : want.continuations) s += std::exp(c.log_likelihood - mx);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.json()["labels"][i]["logprob"].get<double>(), want.continuations[i].log_likelihood);
    EXPECT_EQ(r.json()["labels"][i]["probability"].get<double>(), std::exp(want.continuations[i].log_likelihood - mx) / s);
  }

  const std::vector<std::string> docs = {"Paris is the capital of France.", "Bananas are yellow.", "France is in Europe."};
  auto rr = Post(port(), "/v1/rerank",
                 json({{"query", "capital of France"}, {"documents", docs}, {"top_n", 2}, {"return_documents", true}}).dump());
  ASSERT_EQ(rr.status, 200) << rr.body;
  std::vector<std::pair<double, int>> scores;
  for (int i = 0; i < 3; ++i) {
    std::string text = kDefaultRerankTemplate;
    text.replace(text.find("{document}"), 10, docs[i]);
    text.replace(text.find("{query}"), 7, "capital of France");
    Request d;
    d.tokens = tok_->Encode(text, true, false);
    d.top_k = 0;
    d.continuations = {tok_->Encode(kRerankYes, false, false), tok_->Encode(kRerankNo, false, false)};
    const Response w = Lib(d);
    scores.push_back({1.0 / (1.0 + std::exp(-(w.continuations[0].log_likelihood - w.continuations[1].log_likelihood))), i});
  }
  std::stable_sort(scores.begin(), scores.end(), [](auto a, auto b) { return a.first > b.first; });
  const json res = rr.json()["results"];
  ASSERT_EQ(res.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(res[k]["index"], scores[k].second);
    EXPECT_EQ(res[k]["relevance_score"].get<double>(), scores[k].first);
    EXPECT_EQ(res[k]["document"]["text"], docs[scores[k].second]);
  }
}

// text_offset counts characters (code points) of "text", as OpenAI's and vLLM's do, not bytes:
// with a non-ASCII prompt each token's text starts at its offset.
TEST_F(ServerEngine, EchoTextOffsetsCountCharacters) {
  const std::string prompt = "café naïve ok — 東京 ✓";
  auto r = Post(port(), "/v1/completions", json({{"prompt", prompt}, {"echo", true}, {"logprobs", 0}}).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json ch = r.json()["choices"][0];
  const std::string text = ch["text"];
  // The text as code points (it is valid UTF-8: the whole prompt).
  auto code_points = [](const std::string& s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      out.push_back(s.substr(i, n));
      i += n;
    }
    return out;
  };
  const std::vector<std::string> chars = code_points(text);
  const std::vector<int32_t> ids = tok_->Encode(prompt, true, false);
  const json offsets = ch["logprobs"]["text_offset"];
  ASSERT_EQ(offsets.size(), ids.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    const size_t at = offsets[t];
    ASSERT_LE(at, chars.size()) << t;
    // Where a token's text is whole characters, it is the text from its offset on.
    const std::string piece = tok_->Decode(std::vector<int32_t>{ids[t]});
    if (!Tokenizer::IsValidUtf8(piece)) continue;
    std::string from;
    for (size_t k = at; k < chars.size() && from.size() < piece.size(); ++k) from += chars[k];
    EXPECT_EQ(from, piece) << "token " << t << " at offset " << at;
  }
  const size_t last = offsets.back();
  EXPECT_LE(last, chars.size());  // = at a final token with no text (EOS)
  EXPECT_NE(text.size(), chars.size());  // the prompt is not ASCII: bytes would not do
}

// With a template that puts {document} before {query}, a document holding "{query}" stays as
// typed (the placeholders are replaced in one pass over the template).
TEST_F(ServerEngine, RerankTemplateIsFilledInOnePass) {
  ApiContext ctx;
  ctx.tokenizer = tok_;
  ctx.info = &engine_->info();
  ctx.rerank_template = "Document: {document}\nQuery: {query}\nRelevant:";
  Prepared p;
  auto e = PrepareRerank(R"({"query": "capital", "documents": ["about {query} and {document}"]})", ctx, &p);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(p.requests.size(), 1u);
  EXPECT_EQ(p.requests[0].tokens,
            tok_->Encode("Document: about {query} and {document}\nQuery: capital\nRelevant:", true, false));
}

TEST_F(ServerEngine, TokenizeAndDetokenize) {
  auto r = Post(port(), "/tokenize", R"({"content": "Hello, world!", "add_special": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<int32_t> want = tok_->Encode("Hello, world!", true, false);
  EXPECT_EQ(r.json()["tokens"].get<std::vector<int32_t>>(), want);
  auto d = Post(port(), "/detokenize", json({{"tokens", want}}).dump());
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.json()["content"], tok_->Decode(want));
  auto p = Post(port(), "/tokenize", R"({"content": "Hi", "with_pieces": true})");
  EXPECT_EQ(p.json()["tokens"][0]["piece"], tok_->TokenPiece(tok_->Encode("Hi", false, false)[0]));
}

// /tokenize and /detokenize replies hold reply memory until they are sent, as the engine routes'
// do: /tokenize's exactly its text, /detokenize's at least its text. A reply that needs more than
// all of --reply-memory is a 413 (with_pieces on 8 KiB of text: ~200 KB of JSON), not a reply
// built outside the budget (one such request on 250 KB of text took 110 MB; eight, 1 GB).
TEST_F(ServerEngine, TokenizeRepliesAreBoundedByTheReplyMemory) {
  ApiContext ctx;
  ctx.tokenizer = tok_;
  ctx.info = &engine_->info();
  std::string text;
  for (int i = 0; i < 8192; ++i) text += static_cast<char>("qzxjkvbwy{}|~^"[(i * 7919) % 14]);
  text += " h\xc3\xa9llo <|endoftext|>";
  std::vector<Result<Response>> none;
  for (const char* extra : {"", R"(, "with_pieces": true)", R"(, "with_pieces": true, "parse_special": true)",
                            R"(, "add_special": true)"}) {
    Prepared p;
    auto e = PrepareTokenize(R"({"content": )" + json(text).dump() + extra + "}", ctx, &p);
    ASSERT_FALSE(e) << e->message;
    EXPECT_EQ(p.format(none).size(), p.reply_bytes) << extra;
  }
  for (const std::string& ids : {std::string("[]"), std::string("[1, 2, 195, 169, 511, 0, 10]"),
                                 json(tok_->Encode(text, true, true)).dump()}) {
    Prepared p;
    auto e = PrepareDetokenize(R"({"tokens": )" + ids + "}", ctx, &p);
    ASSERT_FALSE(e) << e->message;
    EXPECT_LE(p.format(none).size(), p.reply_bytes) << ids;
  }

  ServerOptions o;
  o.port = 0;
  o.reply_memory_bytes = 64 * 1024;
  Server small(o);
  ASSERT_TRUE(small.Start().ok());
  small.SetBackend(EngineRunner(engine_), engine_->info(), tok_, "tiny", engine_->pass_tokens());
  const std::string content = json(text.substr(0, 8192)).dump();
  auto pieces = Post(small.port(), "/tokenize", R"({"content": )" + content + R"(, "with_pieces": true})");
  EXPECT_EQ(pieces.status, 413) << pieces.body.substr(0, 300);
  EXPECT_EQ(pieces.json()["error"]["code"], "reply_too_large") << pieces.body.substr(0, 300);
  EXPECT_NE(pieces.json()["error"]["message"].get<std::string>().find("--reply-memory"), std::string::npos);
  auto ids = Post(small.port(), "/tokenize", R"({"content": )" + content + "}");
  ASSERT_EQ(ids.status, 200) << ids.body.substr(0, 300);
  EXPECT_EQ(ids.json()["tokens"].get<std::vector<int32_t>>(), tok_->Encode(text.substr(0, 8192), false, false));
  const std::vector<int32_t> some = tok_->Encode(text.substr(0, 1024), false, false);  // a tree under 64 KiB
  auto back = Post(small.port(), "/detokenize", json({{"tokens", some}}).dump());
  ASSERT_EQ(back.status, 200) << back.body.substr(0, 300);
  EXPECT_EQ(back.json()["content"], text.substr(0, 1024));
}

// Mixed requests; the reply without its per-call fields (id, created).
std::string Stable(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (!j.is_object()) return body;
  j.erase("id");
  j.erase("created");
  return j.dump();
}

std::pair<std::string, std::string> MixedRequest(int i) {
  const std::string words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"};
  std::string text;
  for (int k = 0; k <= i % 23; ++k) text += words[(i * 7 + k) % 8] + " ";
  switch (i % 4) {
    case 0: return {"/v1/completions", json({{"prompt", text}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}}).dump()};
    case 1: return {"/v1/embeddings", json({{"input", text}, {"pooling", i % 8 == 1 ? "mean" : "last"}}).dump()};
    case 2: return {"/v1/classify", json({{"prompt", text}, {"labels", {" yes", " no"}}}).dump()};
    default: return {"/v1/completions", json({{"prompt", text}, {"max_tokens", 1}, {"logprobs", 2}}).dump()};
  }
}

TEST_F(ServerEngine, ConcurrentAnswersEqualSequentialOnes) {
  const int n = 96;
  std::vector<std::string> want(n);
  for (int i = 0; i < n; ++i) {
    auto [path, body] = MixedRequest(i);
    auto r = Post(port(), path, body);
    ASSERT_EQ(r.status, 200) << r.body;
    want[i] = Stable(r.body);
  }
  const uint64_t batches_before = server_->metrics().batches();
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t)
    threads.emplace_back([&, t] {
      httplib::Client c("127.0.0.1", port());
      c.set_read_timeout(120, 0);  // not httplib's 5 s: a loaded CI machine is slow, not wrong
      for (int i = t; i < n; i += 16) {
        auto [path, body] = MixedRequest(i);
        auto r = c.Post(path, body, "application/json");
        if (!r || r->status != 200 || Stable(r->body) != want[i]) ++bad;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LT(server_->metrics().batches() - batches_before, static_cast<uint64_t>(n));  // batching happened
}

// The bounded load test: 2,000 mixed requests from 16 clients, no error, RSS flat after warm-up.
TEST_F(ServerEngine, LoadTestNoErrorAndFlatRss) {
  const int clients = 16, total = 2000, warmup = 1000;
  std::atomic<int> next{0}, errors{0}, done{0};
  std::atomic<uint64_t> rss_after_warmup{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t)
    threads.emplace_back([&] {
      httplib::Client c("127.0.0.1", port());
      c.set_read_timeout(60, 0);
      for (int i; (i = next++) < total;) {
        auto [path, body] = MixedRequest(i);
        // A new connection per request (httplib's default), as the load test of issue 20 that
        // used to see ~1 in 2,000 connections reset before the answer (the listen backlog,
        // docs/DESIGN.md section 14): no retry, every request must be answered.
        auto r = c.Post(path, body, "application/json");
        if (!r || r->status != 200) {
          if (++errors <= 3)
            ADD_FAILURE() << path << " " << body << " -> "
                          << (r ? std::to_string(r->status) + " " + r->body : "no response: " + httplib::to_string(r.error()));
        }
        if (++done == warmup) rss_after_warmup = CurrentRssBytes();
      }
    });
  for (auto& t : threads) t.join();
  const uint64_t rss_end = CurrentRssBytes();
  EXPECT_EQ(errors.load(), 0);
  ASSERT_GT(rss_after_warmup.load(), 0u);
  EXPECT_LE(static_cast<double>(rss_end), 1.05 * static_cast<double>(rss_after_warmup.load()))
      << "RSS after warm-up " << rss_after_warmup.load() << ", at the end " << rss_end;
  // httplib's logger, which counts a request, runs after the answer is written: the last
  // answers can reach the clients before their counts do.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server_->metrics().requests("/v1/completions", 200) < 1000u && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GE(server_->metrics().requests("/v1/completions", 200), 1000u);
}

// `estream serve`'s duration flags (--aging, --batch-linger, --timeout, --shutdown-grace): a
// negative, non-numeric or infinite value is refused before anything starts, naming the flag;
// likewise --batch-linger-share outside [0, 1].
TEST(ServeCli, BadDurationFlagsGetAClearError) {
  const std::string err = ::testing::TempDir() + "serve_cli_stderr.txt";
  for (const char* flag : {"--aging", "--batch-linger", "--timeout", "--shutdown-grace"})
    for (const char* value : {"-1", "abc", "inf"}) {
      const cli_test::CliResult r =
          cli_test::RunCli(std::string("serve -m /nonexistent.gguf --port 0 ") + flag + "=" + value, err);
      EXPECT_NE(r.exit_code, 0) << flag << "=" << value;
      EXPECT_NE(r.err.find(std::string(flag) + ": expected a number of seconds >= 0"), std::string::npos)
          << flag << "=" << value << ": " << r.err;
    }
  for (const char* value : {"-0.1", "1.5", "abc", "nan", "inf"}) {
    const cli_test::CliResult r =
        cli_test::RunCli(std::string("serve -m /nonexistent.gguf --port 0 --batch-linger-share=") + value, err);
    EXPECT_NE(r.exit_code, 0) << value;
    EXPECT_NE(r.err.find("--batch-linger-share: expected a share between 0 and 1"), std::string::npos)
        << value << ": " << r.err;
  }
}

}  // namespace
}  // namespace estream::server
