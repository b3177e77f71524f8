#include "server/api.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <numeric>
#include <set>
#include <string_view>

#include "base/json_text.h"
#include "batch/candidates.h"
#include "tokenizer/tokenizer.h"

namespace estream::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string Dump(const ojson& j) { return DumpJson(j); }

ApiError Bad(std::string message, std::string param = "", std::string code = "") {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

class TreeCounter final : public nlohmann::json_sax<json> {
 public:
  uint64_t bytes = 0;
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t& s) override { return Value() && Add(Heap(s)); }
  bool binary(binary_t& b) override { return Value() && Add(b.size()); }
  bool start_object(std::size_t) override { return Open(false, 48); }
  bool key(string_t& k) override { return Add(96 + Heap(k)); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(true, 24); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    bytes = 0;
    error_at = position;
    return false;
  }
  size_t error_at = 0;  // after a parse error: the byte (1-based) where the body stopped being JSON

 private:
  static uint64_t Heap(const string_t& s) { return s.size() > 15 ? s.size() + 1 : 0; }
  bool Add(uint64_t n) {
    bytes += n;
    return true;
  }
  bool Value() { return Add(!in_array_.empty() && in_array_.back() ? 32 : 16); }
  bool Open(bool array, uint64_t n) {
    Value();
    in_array_.push_back(array);
    return Add(n);
  }
  bool Close() {
    in_array_.pop_back();
    return true;
  }
  std::vector<bool> in_array_;  // per open container: an array?
};

// Parses a JSON object body. Errors name what is wrong, and where.
std::optional<ApiError> ParseObject(const std::string& body, json* out) {
  *out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    if (body.find_first_not_of(" \t\r\n") == std::string::npos)
      return Bad("the request body is empty: send a JSON object");
    TreeCounter where;
    json::sax_parse(body, &where);
    return Bad("the request body is not valid JSON (UTF-8): the error is at byte " + std::to_string(where.error_at) +
               " of " + std::to_string(body.size()));
  }
  if (!out->is_object()) return Bad("the request body must be a JSON object");
  return std::nullopt;
}

// Fields a route does not know -> 400 (for estream's own routes, where a typo would silently
// change the meaning).
std::optional<ApiError> RejectUnknown(const json& j, const std::set<std::string>& known) {
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key()))
      return Bad("unknown field \"" + it.key() + "\"", it.key(), "unknown_field");
  return std::nullopt;
}

bool IsIdArray(const json& a) {
  if (!a.is_array() || a.empty()) return false;
  for (const json& x : a)
    if (!x.is_number_integer()) return false;
  return true;
}

std::optional<ApiError> Ids(const json& a, const std::string& field, std::vector<int32_t>* out) {
  if (!a.is_array()) return Bad("\"" + field + "\" must be an array of token ids", field);
  for (const json& x : a) {
    if (!x.is_number_integer()) return Bad("\"" + field + "\" must hold integer token ids", field);
    // An id past 2^63 - 1 is an unsigned number to nlohmann: read as int64_t it would wrap.
    const bool in_range = x.is_number_unsigned() ? x.get<uint64_t>() <= INT32_MAX
                                                 : x.get<int64_t>() >= INT32_MIN && x.get<int64_t>() <= INT32_MAX;
    if (!in_range) return Bad("token id " + x.dump() + " in \"" + field + "\" is out of range", field, "invalid_token");
    out->push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return std::nullopt;
}

std::optional<ApiError> Text(const ApiContext& ctx, const std::string& text, bool add_special, const std::string& field,
                             std::vector<int32_t>* out) {
  if (!ctx.tokenizer) return Bad("the model has no vocabulary: give \"" + field + "\" as token ids", field);
  *out = ctx.tokenizer->Encode(text, add_special, /*parse_special=*/false);
  if (out->empty()) return Bad("\"" + field + "\" is empty after tokenization", field);
  return std::nullopt;
}

ApiError TooMany(const std::string& field, size_t n) {
  return Bad("\"" + field + "\" holds " + std::to_string(n) + " items; one request takes at most " +
                 std::to_string(kMaxInputs) + ": split it",
             field, "too_many_inputs");
}

// The length of `s` as a JSON string, quotes included (as Dump writes it).
size_t JsonLength(const std::string& s) { return Dump(ojson(s)).size(); }

// The longest token as a JSON string (ApiContext::max_piece_json), 64 while unknown.
uint64_t PieceBound(const ApiContext& ctx) { return ctx.max_piece_json > 0 ? ctx.max_piece_json : 64; }

// OpenAI's prompt forms: "text", ["text", ...], [ids], [[ids], ...]. One token list per prompt.
std::optional<ApiError> PromptList(const json& p, const ApiContext& ctx, const std::string& field,
                                   std::vector<std::vector<int32_t>>* out) {
  if (p.is_string()) {
    out->emplace_back();
    return Text(ctx, p.get<std::string>(), true, field, &out->back());
  }
  if (!p.is_array() || p.empty())
    return Bad("\"" + field + "\" must be a string, an array of strings, an array of token ids or an array of arrays of token ids", field);
  if (IsIdArray(p)) {
    out->emplace_back();
    return Ids(p, field, &out->back());
  }
  if (p.size() > kMaxInputs) return TooMany(field, p.size());
  // One form per request, as OpenAI's schema has it: all strings or all token lists.
  for (const json& x : p)
    if (x.is_string() != p.front().is_string())
      return Bad("\"" + field + "\" mixes strings and token lists: give an array of strings or an array of arrays "
                 "of token ids", field);
  for (const json& x : p) {
    out->emplace_back();
    if (x.is_string()) {
      if (auto e = Text(ctx, x.get<std::string>(), true, field, &out->back())) return e;
    } else if (x.is_array()) {
      if (x.empty()) return Bad("\"" + field + "\" holds an empty token list", field);
      if (auto e = Ids(x, field, &out->back())) return e;
    } else {
      return Bad("\"" + field + "\" must be a string, an array of strings, an array of token ids or an array of arrays of token ids", field);
    }
  }
  return std::nullopt;
}

// One label / continuation: text (no special tokens) or ids.
std::optional<ApiError> Continuation(const json& x, const ApiContext& ctx, const std::string& field,
                                     std::vector<int32_t>* out) {
  if (x.is_string()) return Text(ctx, x.get<std::string>(), false, field, out);
  if (x.is_array() && !x.empty()) return Ids(x, field, out);
  return Bad("each of \"" + field + "\" must be a non-empty string or an array of token ids", field);
}

std::string NextId(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  return std::string(prefix) + std::to_string(++counter);
}

// The text of one token as OpenAI lists it in logprobs.tokens: its bytes; special tokens as text.
std::string Piece(const ApiContext& ctx, int32_t id) { return TokenString(ctx.tokenizer, id); }

std::string Decode(const ApiContext& ctx, std::span<const int32_t> ids) {
  if (!ctx.tokenizer) return "";
  return ctx.tokenizer->Decode(ids);
}

// Characters (Unicode code points) of UTF-8 text: the bytes that do not continue a character. A
// token holding part of a character counts 1 if it holds its first byte, else 0, so the counts of
// a text's tokens add up to the text's.
size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

ojson TopJson(const ApiContext& ctx, const std::vector<TokenLogprob>& top) {
  ojson o = ojson::object();
  for (const TokenLogprob& t : top) {
    const std::string p = Piece(ctx, t.token);
    if (!o.contains(p)) o[p] = t.logprob;
  }
  return o;
}

}  // namespace

// One pass over the row keeping the n best so far in order: ids come in ascending order, so a
// value equal to the n-th best never enters, and an insertion goes after every equal value
// already kept. Once n are kept, runs of 8 logits none of which beats the n-th best are skipped
// with one test (the common case: with n <= 20 an insertion is rare), so the pass costs about a
// comparison per logit.
std::vector<TokenLogprob> TopLogprobs(const float* row, int64_t V, int n) {
  const double l = LogSumExp(row, V);  // Engine::Run's: top agrees bit for bit with prompt_logprobs
  n = static_cast<int>(std::min<int64_t>(n, V));
  if (n <= 0) return {};
  std::vector<int32_t> best;  // ids, best first
  best.reserve(n + 1);
  float thr = 0;  // row[best.back()] once n are kept
  for (int64_t v = 0; v < V; ++v) {
    if (static_cast<int>(best.size()) == n) {
      if (v + 8 <= V) {
        bool any = false;
        for (int k = 0; k < 8; ++k) any |= row[v + k] > thr;
        if (!any) {
          v += 7;
          continue;
        }
      }
      if (!(row[v] > thr)) continue;
    }
    const float x = row[v];
    size_t at = best.size();
    while (at > 0 && x > row[best[at - 1]]) --at;
    best.insert(best.begin() + at, static_cast<int32_t>(v));
    if (static_cast<int>(best.size()) > n) best.pop_back();
    thr = row[best.back()];
  }
  std::vector<TokenLogprob> top;
  for (int32_t id : best) top.push_back({id, static_cast<float>(row[id] - l)});
  return top;
}

std::string ErrorBody(const ApiError& e) {
  ojson err;
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? ojson() : ojson(e.param);
  err["code"] = e.code.empty() ? ojson() : ojson(e.code);
  return Dump(ojson{{"error", err}});
}

ApiError ErrorFromStatus(const Status& s) {
  ApiError e;
  e.message = s.message();
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      e.status = 400;
      break;
    case StatusCode::kResourceExhausted:
      e.status = 503;
      e.type = "server_error";
      break;
    case StatusCode::kCancelled:  // the running batch stopped when the shutdown grace ran out
      e.status = 503;
      e.type = "unavailable";
      e.code = "shutting_down";
      e.message = "the server is shutting down: " + s.message();
      break;
    default:
      e.status = 500;
      e.type = "server_error";
  }
  return e;
}

std::optional<ApiError> ValidateRequests(const std::vector<Request>& requests, const ModelInfo& info) {
  auto check_ids = [&](const std::vector<int32_t>& ids, const char* what) -> std::optional<ApiError> {
    for (int32_t t : ids)
      if (t < 0 || t >= info.n_vocab)
        return Bad(std::string(what) + " holds token id " + std::to_string(t) + ", outside the vocabulary [0, " +
                   std::to_string(info.n_vocab) + ")", "", "invalid_token");
    return std::nullopt;
  };
  for (const Request& r : requests) {
    const int64_t T = static_cast<int64_t>(r.tokens.size());
    if (T == 0) return Bad("a prompt is empty");
    if (T > info.n_ctx)
      return Bad("a prompt has " + std::to_string(T) + " tokens; the model's context length is " + std::to_string(info.n_ctx),
                 "", "context_length_exceeded");
    if (auto e = check_ids(r.tokens, "a prompt")) return e;
    for (const auto& c : r.continuations) {
      if (c.empty()) return Bad("a continuation is empty");
      if (T + static_cast<int64_t>(c.size()) > info.n_ctx)
        return Bad("prompt + continuation is " + std::to_string(T + c.size()) + " tokens; the context length is " +
                   std::to_string(info.n_ctx), "", "context_length_exceeded");
      if (auto e = check_ids(c, "a continuation")) return e;
    }
  }
  return std::nullopt;
}

std::string TokenString(const Tokenizer* tokenizer, int32_t id) {
  if (!tokenizer) return std::to_string(id);
  std::string p = tokenizer->TokenPiece(id);
  if (Tokenizer::IsValidUtf8(p)) return p;
  std::string out = "bytes:";
  for (unsigned char c : p) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02x", c);
    out += buf;
  }
  return out;
}

uint64_t JsonTreeBytes(const std::string& body) {
  TreeCounter counter;
  json::sax_parse(body, &counter);
  return counter.bytes;
}

size_t MaxPieceJson(const Tokenizer* tokenizer) {
  if (!tokenizer) return 13;
  size_t n = 2;
  for (int32_t id = 0; id < tokenizer->n_vocab(); ++id) n = std::max(n, JsonLength(TokenString(tokenizer, id)));
  return n;
}

std::string Base64(const void* data, size_t n) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    const uint32_t v = (p[i] << 16) | (p[i + 1] << 8) | p[i + 2];
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < n) {
    const uint32_t v = (p[i] << 16) | (i + 1 < n ? p[i + 1] << 8 : 0);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < n ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// ---- /v1/completions ----------------------------------------------------------------------------

std::optional<ApiError> PrepareCompletion(const std::string& body, const ApiContext& ctx, Prepared* out) {
  json j;
  if (auto e = ParseObject(body, &j)) return e;
  if (!j.contains("prompt")) return Bad("\"prompt\" is required", "prompt");
  int64_t max_tokens = 0;
  if (j.contains("max_tokens") && !j["max_tokens"].is_null()) {
    if (!j["max_tokens"].is_number_integer()) return Bad("\"max_tokens\" must be an integer", "max_tokens");
    max_tokens = j["max_tokens"].get<int64_t>();
    if (max_tokens < 0) return Bad("\"max_tokens\" must be 0 or 1", "max_tokens");
    if (max_tokens > 1)
      return Bad("this server is prefill-only: \"max_tokens\" must be 0 (score the prompt) or 1 (the greedy next "
                 "token); it generates no longer text", "max_tokens", "prefill_only");
  }
  bool echo = false;
  if (j.contains("echo") && !j["echo"].is_null()) {
    if (!j["echo"].is_boolean()) return Bad("\"echo\" must be true or false", "echo");
    echo = j["echo"].get<bool>();
  }
  int logprobs = -1;  // -1: no logprobs object
  if (j.contains("logprobs") && !j["logprobs"].is_null()) {
    if (!j["logprobs"].is_number_integer()) return Bad("\"logprobs\" must be an integer", "logprobs");
    const int64_t n = j["logprobs"].get<int64_t>();
    if (n < 0 || n > kMaxLogprobs) return Bad("\"logprobs\" must be between 0 and " + std::to_string(kMaxLogprobs), "logprobs");
    logprobs = static_cast<int>(n);
  }
  for (const char* one : {"n", "best_of"}) {
    if (j.contains(one) && !j[one].is_null() && !(j[one].is_number_integer() && j[one].get<int64_t>() == 1))
      return Bad(std::string("\"") + one + "\" must be 1: this server returns one choice per prompt", one);
  }
  if (j.contains("stream") && !j["stream"].is_null() && !(j["stream"].is_boolean() && !j["stream"].get<bool>()))
    return Bad("\"stream\" is not supported (prefill-only: the answer comes in one piece)", "stream");
  if (j.contains("suffix") && !j["suffix"].is_null()) return Bad("\"suffix\" is not supported", "suffix");
  if (j.contains("logit_bias") && !j["logit_bias"].is_null() && !(j["logit_bias"].is_object() && j["logit_bias"].empty()))
    return Bad("\"logit_bias\" is not supported", "logit_bias");

  std::vector<std::vector<int32_t>> prompts;
  if (auto e = PromptList(j["prompt"], ctx, "prompt", &prompts)) return e;

  const int V = ctx.info->n_vocab;
  // Top alternatives at each prompt position: computed from the logits rows in a sink, into
  // storage shared with the formatter (the sink runs on the engine thread; it outlives the handler
  // if the client goes away).
  auto tops = std::make_shared<std::vector<std::vector<std::vector<TokenLogprob>>>>(prompts.size());
  const bool want_tops = echo && logprobs > 0;
  out->requests.clear();
  out->prompt_tokens = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.tokens = std::move(prompts[i]);
    r.top_k = max_tokens == 1 ? std::max(1, logprobs) : 0;
    r.prompt_logprobs = echo && logprobs >= 0;
    if (want_tops) {
      (*tops)[i].resize(r.tokens.size());
      const int n = logprobs;
      // Rows are independent (each writes its own slot), so they are split over OpenMP threads:
      // one row is a log-sum-exp and a top-n selection over the vocabulary.
      const int threads = std::max(1, ctx.threads);
      r.logits_sink = [tops, i, n, V, threads](int64_t first, int64_t n_rows, const float* lg) -> Status {
        auto& rows = (*tops)[i];
        const int64_t end = std::min<int64_t>(n_rows, static_cast<int64_t>(rows.size()) - 1 - first);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (int64_t k = 0; k < end; ++k) rows[first + k + 1] = TopLogprobs(lg + k * V, V, n);  // row t predicts t + 1
        return Status::Ok();
      };
    }
    out->prompt_tokens += static_cast<int64_t>(r.tokens.size());
    out->requests.push_back(std::move(r));
  }
  // The reply's bound (Prepared::reply_bytes). Per position listed in logprobs: the token, its
  // logprob, its offset and `logprobs` alternatives as text, the same as a JSON tree (16-byte
  // values in vectors that may have doubled, object entries of 48 bytes plus their key), and the
  // engine's figures (prompt_logprobs, the alternatives kept by the sink). The text counts twice:
  // the string it is dumped into grows by doubling.
  const uint64_t P = PieceBound(ctx), K = static_cast<uint64_t>(std::max(0, logprobs));
  out->reply_bytes = 1024;
  for (const Request& r : out->requests) {
    const uint64_t T = r.tokens.size();
    const uint64_t text = 256 + (echo ? JsonLength(Decode(ctx, r.tokens)) : 2) + (max_tokens == 1 ? P : 0);
    const uint64_t positions = logprobs < 0 ? 0 : (echo ? T : 0) + (max_tokens == 1 ? 1 : 0);
    const uint64_t per_position_text = P + 50 + K * (P + 28);
    const uint64_t per_position_tree = 256 + P + K * (128 + P);
    out->reply_bytes += 2 * (text + positions * per_position_text) + positions * per_position_tree + 1024 +
                        T * (4 + 32 + 8 * K);
  }
  // The prompts as the formatter needs them (requests are moved into the batch).
  auto prompt_ids = std::make_shared<std::vector<std::vector<int32_t>>>();
  for (const Request& r : out->requests) prompt_ids->push_back(r.tokens);
  const ApiContext c = ctx;
  out->format = [c, prompt_ids, tops, echo, logprobs, max_tokens](std::vector<Result<Response>>& results) {
    ojson choices = ojson::array();
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < results.size(); ++i) {
      const Response& r = *results[i];
      const std::vector<int32_t>& p = (*prompt_ids)[i];
      prompt_tokens += static_cast<int64_t>(p.size());
      std::vector<int32_t> ids;
      if (echo) ids = p;
      if (max_tokens == 1) {
        ids.push_back(r.top[0].token);
        ++completion_tokens;
      }
      ojson ch;
      ch["text"] = Decode(c, ids);
      ch["index"] = i;
      if (logprobs >= 0) {
        ojson tokens = ojson::array(), lps = ojson::array(), top = ojson::array(), offsets = ojson::array();
        size_t offset = 0;  // in characters of "text", as OpenAI's (not bytes)
        for (size_t t = 0; t < ids.size(); ++t) {
          tokens.push_back(Piece(c, ids[t]));
          offsets.push_back(offset);
          offset += CodePoints(Decode(c, std::span<const int32_t>(&ids[t], 1)));
          const bool generated = !echo || t == p.size();
          if (generated) {
            lps.push_back(r.top[0].logprob);
            top.push_back(TopJson(c, std::vector<TokenLogprob>(r.top.begin(), r.top.begin() + logprobs)));
          } else if (t == 0) {
            lps.push_back(nullptr);
            top.push_back(nullptr);
          } else {
            lps.push_back(r.prompt_logprobs[t - 1]);
            top.push_back(logprobs > 0 ? TopJson(c, (*tops)[i][t]) : ojson::object());
          }
        }
        ch["logprobs"] = {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", top}, {"text_offset", offsets}};
      } else {
        ch["logprobs"] = nullptr;
      }
      ch["finish_reason"] = "length";
      choices.push_back(std::move(ch));
    }
    ojson o;
    o["id"] = NextId("cmpl-");
    o["object"] = "text_completion";
    o["created"] = static_cast<int64_t>(std::time(nullptr));
    o["model"] = c.model_id;
    o["choices"] = std::move(choices);
    o["usage"] = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion_tokens},
                  {"total_tokens", prompt_tokens + completion_tokens}};
    return Dump(o);
  };
  return std::nullopt;
}

// ---- /v1/embeddings -----------------------------------------------------------------------------

std::optional<ApiError> PrepareEmbeddings(const std::string& body, const ApiContext& ctx, Prepared* out) {
  json j;
  if (auto e = ParseObject(body, &j)) return e;
  if (!j.contains("input")) return Bad("\"input\" is required", "input");
  bool base64 = false;
  if (j.contains("encoding_format") && !j["encoding_format"].is_null()) {
    const json& f = j["encoding_format"];
    if (f == "base64") base64 = true;
    else if (f != "float") return Bad("\"encoding_format\" must be \"float\" or \"base64\"", "encoding_format");
  }
  Request::Pooling pooling = Request::Pooling::kMean;
  if (j.contains("pooling") && !j["pooling"].is_null()) {
    const json& p = j["pooling"];
    if (p == "last") pooling = Request::Pooling::kLast;
    else if (p != "mean") return Bad("\"pooling\" must be \"mean\" or \"last\"", "pooling");
  }
  if (j.contains("dimensions") && !j["dimensions"].is_null() &&
      !(j["dimensions"].is_number_integer() && j["dimensions"].get<int64_t>() == ctx.info->n_embd))
    return Bad("\"dimensions\" must be the model's width, " + std::to_string(ctx.info->n_embd), "dimensions");
  std::vector<std::vector<int32_t>> inputs;
  if (auto e = PromptList(j["input"], ctx, "input", &inputs)) return e;
  out->requests.clear();
  out->prompt_tokens = 0;
  for (auto& in : inputs) {
    Request r;
    r.tokens = std::move(in);
    r.top_k = 0;
    r.embedding = pooling;
    out->prompt_tokens += static_cast<int64_t>(r.tokens.size());
    out->requests.push_back(std::move(r));
  }
  // The reply is written as text (no JSON tree: an embedding of n floats is 16 n bytes as a tree),
  // into a string reserved at its bound: per input, n_embd numbers of at most 25 characters (or
  // the base64 of n_embd floats), and the engine's embedding.
  const uint64_t n_embd = static_cast<uint64_t>(std::max<int64_t>(0, ctx.info->n_embd));
  const uint64_t per_input = 96 + (base64 ? (4 * n_embd + 2) / 3 * 4 + 2 : 25 * n_embd + 2);
  const std::string model = ctx.model_id;
  const uint64_t text_bound = 256 + JsonLength(model) + out->requests.size() * per_input;
  out->reply_bytes = text_bound + out->requests.size() * (n_embd * 4 + 256);
  const int64_t total = out->prompt_tokens;
  out->format = [model, base64, total, text_bound](std::vector<Result<Response>>& results) {
    std::string o;
    o.reserve(text_bound);
    o += R"({"object":"list","data":[)";
    char num[64];
    for (size_t i = 0; i < results.size(); ++i) {
      const std::vector<float>& e = results[i]->embedding;
      if (i > 0) o += ',';
      o += R"({"object":"embedding","index":)";
      o += std::to_string(i);
      o += R"(,"embedding":)";
      if (base64) {
        o += '"';
        o += Base64(e.data(), e.size() * sizeof(float));  // little-endian host
        o += '"';
      } else {
        o += '[';
        for (size_t k = 0; k < e.size(); ++k) {
          if (k > 0) o += ',';
          // As nlohmann writes a float stored as a double: the shortest text that reads back as
          // the same double (so as the same float), with ".0" on whole numbers; null if not finite.
          const double x = e[k];
          if (!std::isfinite(x)) {
            o += "null";
            continue;
          }
          const auto r = std::to_chars(num, num + sizeof(num), x);
          const std::string_view t(num, static_cast<size_t>(r.ptr - num));
          o += t;
          if (t.find_first_of(".e") == std::string_view::npos) o += ".0";
        }
        o += ']';
      }
      o += '}';
    }
    o += R"(],"model":)";
    o += Dump(ojson(model));
    o += R"(,"usage":{"prompt_tokens":)";
    o += std::to_string(total);
    o += R"(,"total_tokens":)";
    o += std::to_string(total);
    o += "}}";
    return o;
  };
  return std::nullopt;
}

// ---- /v1/classify -------------------------------------------------------------------------------

std::optional<ApiError> PrepareClassify(const std::string& body, const ApiContext& ctx, Prepared* out) {
  json j;
  if (auto e = ParseObject(body, &j)) return e;
  if (auto e = RejectUnknown(j, {"model", "prompt", "labels", "user"})) return e;
  if (!j.contains("prompt")) return Bad("\"prompt\" is required", "prompt");
  if (!j.contains("labels")) return Bad("\"labels\" is required", "labels");
  Request r;
  r.top_k = 0;
  const json& p = j["prompt"];
  if (p.is_string()) {
    if (auto e = Text(ctx, p.get<std::string>(), true, "prompt", &r.tokens)) return e;
  } else if (IsIdArray(p)) {
    if (auto e = Ids(p, "prompt", &r.tokens)) return e;
  } else {
    return Bad("\"prompt\" must be a string or an array of token ids", "prompt");
  }
  const json& labels = j["labels"];
  if (!labels.is_array() || labels.empty()) return Bad("\"labels\" must be a non-empty array", "labels");
  if (labels.size() > kMaxInputs) return TooMany("labels", labels.size());
  std::vector<ojson> names;
  for (const json& l : labels) {
    std::vector<int32_t> ids;
    if (auto e = Continuation(l, ctx, "labels", &ids)) return e;
    r.continuations.push_back(std::move(ids));
    names.push_back(ojson::parse(l.dump()));
    // The label twice (text and tree), its figures; the engine's continuation logprobs.
    out->reply_bytes += 2 * 2 * (l.dump().size() + 16 * l.size()) + 1024 + 4 * r.continuations.back().size();
  }
  out->reply_bytes += 2048;
  out->prompt_tokens = static_cast<int64_t>(r.tokens.size());
  for (const auto& c : r.continuations) out->prompt_tokens += static_cast<int64_t>(c.size());
  out->requests.clear();
  out->requests.push_back(std::move(r));
  const std::string model = ctx.model_id;
  const int64_t total = out->prompt_tokens;
  out->format = [model, names, total](std::vector<Result<Response>>& results) {
    const Response& r = *results[0];
    const std::vector<double> p = batch::CandidateProbabilities(r.continuations);
    ojson ls = ojson::array();
    for (size_t i = 0; i < r.continuations.size(); ++i) {
      const ContinuationScore& c = r.continuations[i];
      ls.push_back({{"index", i},
                    {"label", names[i]},
                    {"probability", p[i]},
                    {"logprob", c.log_likelihood},
                    {"n_tokens", c.logprobs.size()},
                    {"is_greedy", c.is_greedy}});
    }
    ojson o;
    o["object"] = "classification";
    o["model"] = model;
    o["label"] = names[batch::BestCandidate(r.continuations)];
    o["labels"] = std::move(ls);
    o["usage"] = {{"prompt_tokens", total}, {"total_tokens", total}};
    return Dump(o);
  };
  return std::nullopt;
}

// ---- /v1/rerank ---------------------------------------------------------------------------------

std::optional<ApiError> PrepareRerank(const std::string& body, const ApiContext& ctx, Prepared* out) {
  json j;
  if (auto e = ParseObject(body, &j)) return e;
  if (auto e = RejectUnknown(j, {"model", "query", "documents", "top_n", "return_documents", "user"})) return e;
  if (!j.contains("query") || !j["query"].is_string()) return Bad("\"query\" must be a string", "query");
  if (!j.contains("documents") || !j["documents"].is_array() || j["documents"].empty())
    return Bad("\"documents\" must be a non-empty array of strings", "documents");
  if (j["documents"].size() > kMaxInputs) return TooMany("documents", j["documents"].size());
  if (!ctx.tokenizer) return Bad("the model has no vocabulary: /v1/rerank needs text", "query");
  int64_t top_n = static_cast<int64_t>(j["documents"].size());
  if (j.contains("top_n") && !j["top_n"].is_null()) {
    const json& n = j["top_n"];
    // Read as int64_t, a number past 2^63 - 1 (unsigned to nlohmann) would wrap.
    if (!n.is_number_integer() || (n.is_number_unsigned() ? n.get<uint64_t>() == 0 : n.get<int64_t>() < 1))
      return Bad("\"top_n\" must be a positive integer", "top_n");
    if (!n.is_number_unsigned() || n.get<uint64_t>() < static_cast<uint64_t>(top_n)) top_n = n.get<int64_t>();
  }
  bool return_documents = false;
  if (j.contains("return_documents") && !j["return_documents"].is_null()) {
    if (!j["return_documents"].is_boolean()) return Bad("\"return_documents\" must be true or false", "return_documents");
    return_documents = j["return_documents"].get<bool>();
  }
  const std::string query = j["query"].get<std::string>();
  std::vector<std::string> docs;
  for (const json& d : j["documents"]) {
    if (d.is_string()) docs.push_back(d.get<std::string>());
    else if (d.is_object() && d.contains("text") && d["text"].is_string()) docs.push_back(d["text"].get<std::string>());
    else return Bad("each document must be a string or {\"text\": string}", "documents");
  }
  std::vector<int32_t> yes, no;
  if (auto e = Text(ctx, kRerankYes, false, "documents", &yes)) return e;
  if (auto e = Text(ctx, kRerankNo, false, "documents", &no)) return e;
  out->requests.clear();
  out->prompt_tokens = 0;
  for (const std::string& doc : docs) {
    // One pass over the template: a query or document that contains "{query}" or "{document}"
    // stays as typed, whatever the placeholders' order.
    std::string text;
    const std::string& t = ctx.rerank_template;
    for (size_t at = 0; at < t.size();) {
      if (t.compare(at, 7, "{query}") == 0) {
        text += query;
        at += 7;
      } else if (t.compare(at, 10, "{document}") == 0) {
        text += doc;
        at += 10;
      } else {
        text += t[at++];
      }
    }
    Request r;
    r.top_k = 0;
    if (auto e = Text(ctx, text, true, "documents", &r.tokens)) return e;
    r.continuations = {yes, no};
    out->prompt_tokens += static_cast<int64_t>(r.tokens.size() + yes.size() + no.size());
    out->requests.push_back(std::move(r));
    // A result as text and tree (the document twice if returned); the engine's scores.
    out->reply_bytes += 2 * (512 + (return_documents ? JsonLength(doc) : 0)) + 256;
  }
  out->reply_bytes += 2048;
  const std::string model = ctx.model_id;
  const int64_t total = out->prompt_tokens;
  out->format = [model, docs, top_n, return_documents, total](std::vector<Result<Response>>& results) {
    std::vector<std::pair<double, size_t>> scored;
    for (size_t i = 0; i < results.size(); ++i) {
      const Response& r = *results[i];
      const double d = r.continuations[0].log_likelihood - r.continuations[1].log_likelihood;
      scored.push_back({1.0 / (1.0 + std::exp(-d)), i});  // p(yes) / (p(yes) + p(no))
    }
    std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    ojson res = ojson::array();
    for (int64_t k = 0; k < top_n; ++k) {
      ojson e;
      e["index"] = scored[k].second;
      e["relevance_score"] = scored[k].first;
      if (return_documents) e["document"] = {{"text", docs[scored[k].second]}};
      res.push_back(std::move(e));
    }
    ojson o;
    o["model"] = model;
    o["object"] = "list";
    o["usage"] = {{"prompt_tokens", total}, {"total_tokens", total}};
    o["results"] = std::move(res);
    return Dump(o);
  };
  return std::nullopt;
}

// ---- engine-free routes -------------------------------------------------------------------------

std::optional<ApiError> PrepareTokenize(const std::string& body, const ApiContext& ctx, Prepared* out) {
  json j;
  if (auto e = ParseObject(body, &j)) return e;
  if (auto e = RejectUnknown(j, {"content", "add_special", "parse_special", "with_pieces", "model"})) return e;
  if (!j.contains("content") || !j["content"].is_string()) return Bad("\"content\" must be a string", "content");
  auto flag = [&](const char* name, bool* v) -> std::optional<ApiError> {
    if (!j.contains(name) || j[name].is_null()) return std::nullopt;
    if (!j[name].is_boolean()) return Bad(std::string("\"") + name + "\" must be true or false", name);
    *v = j[name].get<bool>();
    return std::nullopt;
  };
  bool add_special = false, parse_special = false, with_pieces = false;
  for (auto [name, v] : {std::pair{"add_special", &add_special}, {"parse_special", &parse_special}, {"with_pieces", &with_pieces}})
    if (auto e = flag(name, v)) return e;
  if (!ctx.tokenizer) return Bad("the model has no vocabulary");
  auto ids = std::make_shared<std::vector<int32_t>>(
      ctx.tokenizer->Encode(j["content"].get_ref<const std::string&>(), add_special, parse_special));
  // The reply is written as text, its exact length known first: {"tokens":[...]}, each token its
  // id or {"id":ID,"piece":PIECE}.
  const Tokenizer* tokenizer = ctx.tokenizer;
  uint64_t bytes = 13 + (ids->empty() ? 0 : ids->size() - 1);  // {"tokens":[ ]} and the commas
  for (int32_t id : *ids)
    bytes += std::to_string(id).size() + (with_pieces ? 16 + JsonLength(TokenString(tokenizer, id)) : 0);
  out->reply_bytes = bytes;
  out->format = [ids, with_pieces, tokenizer, bytes](std::vector<Result<Response>>&) {
    std::string text;
    text.reserve(bytes);
    text += "{\"tokens\":[";
    for (size_t i = 0; i < ids->size(); ++i) {
      if (i > 0) text += ',';
      const std::string id = std::to_string((*ids)[i]);
      if (!with_pieces) {
        text += id;
        continue;
      }
      text += "{\"id\":" + id + ",\"piece\":" + Dump(ojson(TokenString(tokenizer, (*ids)[i]))) + "}";
    }
    text += "]}";
    return text;
  };
  return std::nullopt;
}

std::optional<ApiError> PrepareDetokenize(const std::string& body, const ApiContext& ctx, Prepared* out) {
  json j;
  if (auto e = ParseObject(body, &j)) return e;
  if (auto e = RejectUnknown(j, {"tokens", "model"})) return e;
  if (!j.contains("tokens")) return Bad("\"tokens\" is required", "tokens");
  auto ids = std::make_shared<std::vector<int32_t>>();
  if (auto e = Ids(j["tokens"], "tokens", ids.get())) return e;
  if (!ctx.tokenizer) return Bad("the model has no vocabulary");
  // The decoded text is at most the tokens' pieces (or their stored text, for special tokens)
  // and its JSON up to 6 bytes a byte (\u00XX); both are held until the reply is sent.
  uint64_t decoded = 0;
  for (int32_t id : *ids) {
    if (!ctx.tokenizer->IsValidId(id))
      return Bad("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                     std::to_string(ctx.tokenizer->n_vocab()) + ")",
                 "tokens", "invalid_token");
    decoded += std::max<uint64_t>({ctx.tokenizer->TokenPiece(id).size(), ctx.tokenizer->TokenText(id).size(), 3});
  }
  out->reply_bytes = 7 * decoded + 16;
  const Tokenizer* tokenizer = ctx.tokenizer;
  out->format = [ids, tokenizer](std::vector<Result<Response>>&) {
    return Dump(ojson{{"content", tokenizer->Decode(*ids)}});
  };
  return std::nullopt;
}

namespace {
// The model object of /v1/models (OpenAI's shape, with llama-server's "meta").
ojson ModelObject(const ApiContext& ctx) {
  static const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const ModelInfo& i = *ctx.info;
  ojson meta = {{"architecture", i.architecture}, {"n_layer", i.n_layer},   {"n_embd", i.n_embd},
                {"n_expert", i.n_expert},         {"n_expert_used", i.n_expert_used}, {"n_vocab", i.n_vocab},
                {"n_ctx", i.n_ctx},               {"weight_bytes", i.weight_bytes}};
  return {{"id", ctx.model_id}, {"object", "model"}, {"created", created}, {"owned_by", "estream"}, {"meta", meta}};
}
}  // namespace

Reply Models(const ApiContext& ctx) {
  return {200, Dump(ojson{{"object", "list"}, {"data", ojson::array({ModelObject(ctx)})}})};
}

Reply Model(const ApiContext& ctx, const std::string& id) {
  if (id == ctx.model_id) return {200, Dump(ModelObject(ctx))};
  ApiError e = Bad("The model '" + id.substr(0, 200) + "' does not exist: this server serves '" + ctx.model_id +
                       "' (GET /v1/models lists it)",
                   "model", "model_not_found");
  e.status = 404;
  return {404, ErrorBody(e)};
}

}  // namespace estream::server
