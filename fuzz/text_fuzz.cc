// libFuzzer target for the text that users hand estream: the server's request bodies (every
// engine route, /tokenize, /detokenize), `estream score` input lines, the three task files of
// `estream eval`, the shard outputs that `estream score --merge` joins, and the tokenizer under
// all of them.
//
// Input layout: byte 0 picks the parser (byte 0 mod 6) and its options (byte 0 / 6), byte 1 the
// vocabulary, the rest is the parser's input.
// Vocabularies: the byte-level BPE that `estream synth` puts into its models (built in; with the
// gpt-2, qwen2 and llama-bpe pre-tokenizers), and every vocab-only GGUF in the directory named by
// ESTREAM_FUZZ_VOCAB_DIR (scripts/ci_fuzz.sh points it at ../shared/testdata/tokenizer when that
// exists: the real Qwen3, GPT-2, DeepSeek and Llama SentencePiece vocabularies).
//
// Besides ASan/UBSan findings, the target aborts when a contract stated in the headers is broken:
//   tokenizer   ids outside the vocabulary; Decode(Encode(s)) != s for well-formed s (gpt2);
//   server      an error that is not 400 with a message, or a reply body that is not JSON; a
//               request that passes ValidateRequests and fails to format against a fake engine
//               that answers as Engine::Run documents (shapes only: the values are arbitrary);
//   score       an error line or a result line (from the fake engine) that is not one JSON
//               object on one line;
//   eval        an error message that does not name the file; a task with no candidate;
//   merge       (the input split at form feeds into two shard outputs and the input file) an
//               error that is not one line, or a merged file whose line count is not the
//               reported one; ParseShardSpec on the same bytes.
// The fake engine's outputs are only shaped like the engine's, so a crash in formatting points
// at the route's own handling of its options (echo, logprobs, top_n, labels, ...).
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch/eval.h"
#include "batch/merge.h"
#include "batch/shard.h"
#include "batch/score.h"
#include "gguf/gguf.h"
#include "model/bpe_builder.h"
#include "server/api.h"
#include "tokenizer/tokenizer.h"

namespace estream {
// api.cc's TopLogprobs calls the engine's LogSumExp (include/estream/engine.h); the fuzz build
// does not compile the engine and the kernels (they add minutes and hold no parser), so a plain
// one stands in for it here.
double LogSumExp(const float* row, int64_t n) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, row[i]);
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(row[i] - m);
  return m + std::log(s);
}
}  // namespace estream

namespace {

using estream::Request;
using estream::Response;
using estream::Tokenizer;
using json = nlohmann::json;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "text_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

std::vector<std::unique_ptr<Tokenizer>> LoadVocabularies() {
  std::vector<std::unique_ptr<Tokenizer>> out;
  auto bpe = estream::synth::BuildByteBpe({.vocab_size = 1024});
  if (!bpe.ok()) Fail("BuildByteBpe", bpe.status().ToString());
  for (const char* pre : {"gpt-2", "qwen2", "llama-bpe"}) {
    estream::TokenizerVocab v;
    v.model = "gpt2";
    v.pre = pre;
    v.tokens = bpe->tokens;
    v.token_types = bpe->token_types;
    v.merges = bpe->merges;
    v.bos_id = bpe->bos_id;
    v.eos_id = bpe->eos_id;
    auto t = Tokenizer::FromVocab(std::move(v), std::string("estream-bpe/") + pre);
    if (!t.ok()) Fail("FromVocab", t.status().ToString());
    out.push_back(std::move(*t));
  }
  const char* dir = std::getenv("ESTREAM_FUZZ_VOCAB_DIR");
  if (dir == nullptr || *dir == '\0') return out;
  std::vector<std::string> files;
  if (DIR* d = ::opendir(dir)) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0)
        files.push_back(std::string(dir) + "/" + name);
    }
    ::closedir(d);
  }
  std::sort(files.begin(), files.end());
  for (const std::string& path : files) {
    auto f = estream::GgufFile::Open(path);
    if (!f.ok()) Fail("opening a vocabulary", f.status().ToString());
    auto t = Tokenizer::FromGguf(**f);
    if (!t.ok()) Fail("loading a vocabulary", t.status().ToString());
    out.push_back(std::move(*t));
  }
  std::fprintf(stderr, "text_fuzz: %zu vocabularies (%zu from %s)\n", out.size(), files.size(), dir);
  return out;
}

const std::vector<std::unique_ptr<Tokenizer>>& Vocabularies() {
  static const auto* v = new std::vector<std::unique_ptr<Tokenizer>>(LoadVocabularies());
  return *v;
}

void CheckJson(const std::string& text, const char* what) {
  if (!json::accept(text)) Fail(what, "not JSON: " + text.substr(0, 200));
}

// ---- tokenizer ----
void FuzzTokenizer(const Tokenizer& tok, uint8_t flags, std::string_view text) {
  const bool add_special = flags & 1, parse_special = flags & 2;
  const std::vector<int32_t> ids = tok.Encode(text, add_special, parse_special);
  for (int32_t id : ids)
    if (!tok.IsValidId(id)) Fail("Encode returned an id outside the vocabulary", std::to_string(id));
  if (tok.model() == "gpt2" && !add_special && !parse_special && Tokenizer::IsValidUtf8(text)) {
    const std::string back = tok.Decode(ids);
    if (back != text) Fail("Decode(Encode(s)) != s", tok.pre() + ": '" + std::string(text) + "' -> '" + back + "'");
  }
  // The input's bytes as ids too (in and out of the vocabulary), for Decode and TokenPiece.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 4 <= text.size() && raw.size() < 64; i += 4) {
    int32_t id;
    std::memcpy(&id, text.data() + i, 4);
    raw.push_back(flags & 4 ? id % (tok.n_vocab() + 8) : id);
  }
  (void)tok.Decode(raw, flags & 8);
  for (int32_t id : raw) (void)tok.TokenPiece(id);
}

// ---- server routes ----
// A Response shaped as Engine::Run documents it for `r` (values arbitrary but finite).
Response FakeRun(const Request& r, const estream::ModelInfo& info, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / 16777216.0f * 8.0f - 4.0f;
  };
  Response out;
  const int64_t T = static_cast<int64_t>(r.tokens.size()), V = info.n_vocab;
  out.n_tokens = T;
  for (int k = 0; k < r.top_k && k < V; ++k) out.top.push_back({k, -1.0f - static_cast<float>(k)});
  if (r.logits_sink) {
    std::vector<float> row(static_cast<size_t>(V));
    for (int64_t t = 0; t < T; ++t) {
      for (float& x : row) x = next();
      const estream::Status st = r.logits_sink(t, 1, row.data());
      if (!st.ok()) Fail("a route's logits sink failed", st.ToString());
    }
  } else if (r.logits == Request::Logits::kLast) {
    out.logits.resize(static_cast<size_t>(V));
    for (float& x : out.logits) x = next();
  } else if (r.logits == Request::Logits::kAll) {
    out.logits.resize(static_cast<size_t>(T * V));
    for (float& x : out.logits) x = next();
  }
  if (r.prompt_logprobs) {
    for (int64_t t = 0; t + 1 < T; ++t) {
      out.prompt_logprobs.push_back(-std::fabs(next()));
      out.log_likelihood += out.prompt_logprobs.back();
    }
    out.perplexity = T > 1 ? std::exp(-out.log_likelihood / static_cast<double>(T - 1)) : NAN;
  }
  if (r.embedding != Request::Pooling::kNone) {
    out.embedding.resize(static_cast<size_t>(info.n_embd));
    for (float& x : out.embedding) x = next();
  }
  for (const auto& c : r.continuations) {
    estream::ContinuationScore cs;
    for (size_t j = 0; j < c.size(); ++j) {
      cs.logprobs.push_back(-std::fabs(next()));
      cs.log_likelihood += cs.logprobs.back();
    }
    cs.is_greedy = (seed & 1) != 0;
    out.continuations.push_back(std::move(cs));
  }
  return out;
}

void FuzzRoute(int route, const estream::server::ApiContext& ctx, uint8_t seed, const std::string& body) {
  using namespace estream::server;
  if (route >= 4) {
    Prepared p;
    const std::optional<ApiError> e = (route == 4 ? PrepareTokenize : PrepareDetokenize)(body, ctx, &p);
    if (e) {
      if (e->status != 400 || e->message.empty())
        Fail("a bad request's error", std::to_string(e->status) + " " + e->message);
      CheckJson(ErrorBody(*e), "an error body");
      return;
    }
    std::vector<estream::Result<Response>> none;
    const std::string reply = p.format(none);
    CheckJson(reply, "a /tokenize or /detokenize reply");
    // The server admits the reply by this bound (its reply memory): it must hold.
    if (reply.size() > p.reply_bytes)
      Fail("reply_bytes", std::to_string(reply.size()) + " > " + std::to_string(p.reply_bytes));
    return;
  }
  static constexpr std::optional<ApiError> (*kPrepare[])(const std::string&, const ApiContext&, Prepared*) = {
      PrepareCompletion, PrepareEmbeddings, PrepareClassify, PrepareRerank};
  Prepared p;
  std::optional<ApiError> e = kPrepare[route](body, ctx, &p);
  if (!e) e = ValidateRequests(p.requests, *ctx.info);
  if (e) {
    if (e->status != 400 || e->message.empty())
      Fail("a bad request's error", std::to_string(e->status) + " " + e->message);
    CheckJson(ErrorBody(*e), "an error body");
    return;
  }
  int64_t tokens = 0;
  for (const Request& r : p.requests) {
    tokens += static_cast<int64_t>(r.tokens.size());
    for (const auto& c : r.continuations) tokens += static_cast<int64_t>(c.size());
  }
  if (tokens != p.prompt_tokens)
    Fail("prompt_tokens", std::to_string(p.prompt_tokens) + " != " + std::to_string(tokens));
  if (p.prompt_tokens > 4096) return;  // the server answers 413 (--max-batch-tokens) before running
  std::vector<estream::Result<Response>> results;
  for (size_t i = 0; i < p.requests.size(); ++i)
    results.push_back(FakeRun(p.requests[i], *ctx.info, seed + static_cast<uint32_t>(i)));
  CheckJson(p.format(results), "a route's reply");
}

// ---- estream score ----
void FuzzScoreLine(const Tokenizer& tok, const std::string& line) {
  const json j = json::parse(line, nullptr, false);
  const estream::batch::ScoreLine l = estream::batch::ParseScoreLine(j, 1, &tok, tok.n_vocab());
  std::string out;
  if (!l.error.empty()) {
    out = estream::batch::ScoreErrorJson(l, l.error);
  } else {
    estream::ModelInfo info;
    info.n_vocab = tok.n_vocab();
    info.n_embd = 16;
    out = estream::batch::ScoreResultJson(l, FakeRun(l.request, info, static_cast<uint32_t>(line.size())), &tok);
  }
  CheckJson(out, "a score output line");
  if (out.find('\n') != std::string::npos) Fail("a score output line holds a newline", out);
}

// ---- estream eval ----
void FuzzEvalTasks(const Tokenizer& tok, uint8_t mode, std::string_view data) {
  static constexpr estream::batch::EvalKind kKinds[] = {estream::batch::EvalKind::kHellaswag,
                                                        estream::batch::EvalKind::kWinogrande,
                                                        estream::batch::EvalKind::kMultipleChoice};
  estream::batch::LoadTasksOptions o;
  o.name = "tasks.txt";
  o.n_tasks = (mode >> 2) & 3;
  o.warn = [](const std::string& w) {
    if (w.empty()) Fail("an empty warning", "");
  };
  auto tasks = estream::batch::LoadTasks(kKinds[(mode & 3) % 3], data, tok, o);
  if (!tasks.ok()) {
    if (tasks.status().message().rfind("tasks.txt", 0) != 0)
      Fail("an eval error that does not name the file", tasks.status().ToString());
    return;
  }
  for (const estream::batch::EvalTask& t : *tasks)
    if (t.seqs.empty() || t.seqs.size() != t.labels.size())
      Fail("a task without candidates or labels", std::to_string(t.index));
}

// ---- estream score --merge ----
void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) Fail("cannot write", path);
}

void FuzzMerge(uint8_t mode, std::string_view data) {
  (void)estream::batch::ParseShardSpec(data.substr(0, 24), mode & 2 ? "id" : "line");
  static const std::string dir = [] {
    std::string tmpl = (::access("/dev/shm", W_OK) == 0 ? std::string("/dev/shm") : std::string("/tmp")) +
                       "/text_fuzz_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) Fail("mkdtemp", tmpl);
    return tmpl;
  }();
  std::string_view part[3];
  size_t n = 0, begin = 0;
  for (size_t i = 0; i <= data.size() && n < 3; ++i)
    if (i == data.size() || (data[i] == '\f' && n < 2)) {
      part[n++] = data.substr(begin, i - begin);
      begin = i + 1;
    }
  estream::batch::MergeOptions o;
  o.shard_outputs = {dir + "/a.jsonl", dir + "/b.jsonl"};
  o.output = dir + "/all.jsonl";
  o.max_listed = 3;
  WriteFile(o.shard_outputs[0], part[0]);
  WriteFile(o.shard_outputs[1], part[1]);
  if (mode & 1) {
    o.input = dir + "/in.jsonl";
    WriteFile(o.input, part[2]);
  }
  ::unlink(o.output.c_str());
  auto r = estream::batch::MergeShardOutputs(o);
  if (!r.ok()) {
    if (r.status().message().empty() || r.status().message().find('\n') != std::string::npos)
      Fail("a merge error that is not one line", r.status().ToString());
    if (::access(o.output.c_str(), F_OK) == 0) Fail("a failed merge wrote its output", o.output);
    return;
  }
  std::ifstream merged(o.output);
  int64_t lines = 0;
  for (std::string line; std::getline(merged, line);) ++lines;
  if (lines != r->lines) Fail("merged line count", std::to_string(lines) + " != " + std::to_string(r->lines));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const auto& vocabs = Vocabularies();
  const Tokenizer& tok = *vocabs[data[1] % vocabs.size()];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const uint8_t op = data[0], param = static_cast<uint8_t>(data[0] / 6);
  switch (op % 6) {
    case 0:
      FuzzTokenizer(tok, param, rest);
      break;
    case 1: {
      estream::ModelInfo info;
      info.architecture = "qwen3moe";
      info.n_layer = 2;
      info.n_embd = 16;
      info.n_vocab = tok.n_vocab();
      info.n_ctx = 192;
      estream::server::ApiContext ctx;
      ctx.tokenizer = param % 8 == 7 ? nullptr : &tok;  // sometimes a model without a vocabulary
      ctx.info = &info;
      ctx.model_id = "fuzz";
      FuzzRoute(param % 6, ctx, static_cast<uint8_t>(param / 6), std::string(rest));
      break;
    }
    case 2:
      FuzzScoreLine(tok, std::string(rest));
      break;
    case 5:
      FuzzMerge(param, rest);
      break;
    default:
      FuzzEvalTasks(tok, param, rest);
      break;
  }
  return 0;
}
