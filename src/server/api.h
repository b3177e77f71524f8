// The server's JSON API without sockets: each route's request body is parsed and validated into
// engine Requests (Prepared), and the engine's Responses are turned into the route's JSON reply.
// Everything here is a pure function of its inputs (plus the tokenizer, which is immutable and
// thread-safe), so the routes are unit-testable without HTTP.
//
// Conventions (OpenAI / llama-server):
//   errors      {"error": {"message": "...", "type": "invalid_request_error", "param": null,
//               "code": "..."}} with HTTP 400 (bad input), 401, 404, 413, 429, 503, 504;
//   text        prompts given as text are tokenized with the model's vocabulary, BOS/EOS as the
//               vocabulary asks (Tokenizer::Encode(text, add_special = true)); labels, rerank
//               answers and continuations are tokenized without special tokens, as given (a BPE
//               vocabulary wants the leading space: " positive");
//   tokens      every prompt may also be given as token ids;
//   logprobs    natural logarithms.
// Routes (see docs/GUIDE.md, "Serving", for examples):
//   POST /v1/completions  prompt (string | [string] | [ids] | [[ids]]), max_tokens 0 (default) or
//                         1, echo, logprobs 0..20 (top alternatives per position); larger
//                         max_tokens -> 400 (prefill-only server); n, best_of must be 1; stream
//                         false. max_tokens 1 gives the greedy next token (temperature ignored).
//   POST /v1/embeddings   input (string | [string] | [ids] | [[ids]]), encoding_format float |
//                         base64 (little-endian float32), pooling "mean" (default) | "last"
//                         (estream's extra field). Embeddings are the final hidden states after
//                         the final norm, not normalised.
//   POST /v1/classify     {"prompt": text | ids, "labels": [text | ids, ...]} -> the distribution
//                         over the labels: softmax of each label's log-likelihood after the prompt
//                         (shared-prefix candidates: the prompt runs once).
//   POST /v1/rerank       {"query", "documents": [text | {"text"}], "top_n", "return_documents"}:
//                         each document is scored by p(" yes") / (p(" yes") + p(" no")) after the
//                         rerank template (kDefaultRerankTemplate, --rerank-template), results
//                         sorted by relevance_score, best first (llama-server / Jina shape).
//   POST /tokenize        {"content", "add_special" (false), "parse_special" (false),
//                         "with_pieces" (false)} -> {"tokens": [...]}
//   POST /detokenize      {"tokens": [...]} -> {"content": "..."}
//   GET  /v1/models       the one model.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "estream/engine.h"

namespace estream {
class Tokenizer;
}

namespace estream::server {

// Every {query} and {document} is replaced (in one pass: a query or document holding either
// stays as typed); the result is tokenized with add_special = true and followed by the
// continuations " yes" and " no".
inline constexpr const char* kDefaultRerankTemplate =
    "Judge whether the document answers the query. Answer \"yes\" or \"no\".\n"
    "Query: {query}\nDocument: {document}\nRelevant:";
inline constexpr const char* kRerankYes = " yes";
inline constexpr const char* kRerankNo = " no";
inline constexpr int kMaxLogprobs = 20;
// The most prompts (inputs, documents, labels) one request may hold: OpenAI's limit for embeddings.
inline constexpr size_t kMaxInputs = 2048;

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string code;   // empty: null
  std::string param;  // empty: null
};
// The OpenAI error object of `e`.
std::string ErrorBody(const ApiError& e);
// An HTTP status for an engine Status that failed one request.
ApiError ErrorFromStatus(const Status& s);

// The n most likely tokens of one row of V logits with their logprobs (logit - kernels::LogSumExp,
// so they agree bit for bit with the engine's prompt_logprobs), best first, ties: lower id (the
// order of std::partial_sort with that comparison); min(n, V) of them.
std::vector<TokenLogprob> TopLogprobs(const float* row, int64_t V, int n);

// What the routes need to know about the model. Not owned; must outlive the calls.
struct ApiContext {
  const Tokenizer* tokenizer = nullptr;  // null: the model has no vocabulary (ids only)
  const ModelInfo* info = nullptr;
  std::string model_id;                  // "model" in replies and /v1/models
  std::string rerank_template = kDefaultRerankTemplate;
  int threads = 1;                       // OpenMP threads of the logits sinks
  size_t max_piece_json = 0;             // the longest token (TokenString) as a JSON string, with its
                                         // quotes (MaxPieceJson); 0: not known yet (taken as 64)
};

// The longest TokenString of the vocabulary as a JSON string, quotes included (for
// Prepared::reply_bytes); 13 without a vocabulary (a decimal id).
size_t MaxPieceJson(const Tokenizer* tokenizer);

// An upper bound on the memory nlohmann::json takes for the tree of `body`, counted from the
// parser's SAX events without building the tree: a value 16 bytes (32 in an array, whose vector
// may have doubled), an object 48 and a member 96, an array 24, strings past the 15 characters
// kept inline their length. 0 when the body is not valid JSON (parsing it fails fast).
uint64_t JsonTreeBytes(const std::string& body);

// A reply: status and JSON body.
struct Reply {
  int status = 200;
  std::string body;
};

// A parsed engine route: the engine requests to run (one job) and how to turn their responses
// (all OK, in order) into the reply body. `format` may be called from any thread, once.
struct Prepared {
  std::vector<Request> requests;
  int64_t prompt_tokens = 0;  // every token the requests run (continuations included)
  // An upper bound on the memory the reply takes from the moment the engine answers until it is
  // sent: the engine's Responses, the JSON tree the reply is built in (completions, classify,
  // rerank; embeddings are written as text directly) and its text. The server admits requests
  // while the bounds of those in flight fit its reply memory (ServerOptions::reply_memory_bytes).
  uint64_t reply_bytes = 0;
  std::function<std::string(std::vector<Result<Response>>& results)> format;
};

// Parse `body` for an engine route ("completions", "embeddings", "classify", "rerank").
// On error, returns the ApiError (400) and leaves *out unspecified.
std::optional<ApiError> PrepareCompletion(const std::string& body, const ApiContext& ctx, Prepared* out);
std::optional<ApiError> PrepareEmbeddings(const std::string& body, const ApiContext& ctx, Prepared* out);
std::optional<ApiError> PrepareClassify(const std::string& body, const ApiContext& ctx, Prepared* out);
std::optional<ApiError> PrepareRerank(const std::string& body, const ApiContext& ctx, Prepared* out);

// Checks every request against the model (lengths, ids): what Engine::Run would refuse, as 400s.
std::optional<ApiError> ValidateRequests(const std::vector<Request>& requests, const ModelInfo& info);

// Routes answered without the engine, in the same two steps: the body parsed and tokenized (or
// its ids checked), with the memory the reply takes until it is sent (Prepared::reply_bytes:
// /tokenize's text exactly, /detokenize's decoded text and its JSON at most); then `format`
// (called with no results) writes it. No requests.
std::optional<ApiError> PrepareTokenize(const std::string& body, const ApiContext& ctx, Prepared* out);
std::optional<ApiError> PrepareDetokenize(const std::string& body, const ApiContext& ctx, Prepared* out);
Reply Models(const ApiContext& ctx);
// GET /v1/models/{id}: the model object when id is the served model's, else 404 model_not_found.
Reply Model(const ApiContext& ctx, const std::string& id);

// A token as listed in completion logprobs (tokens, top_logprobs keys): its bytes; one whose bytes
// are not valid UTF-8 (part of a multi-byte character) as "bytes:\xNN..." (OpenAI's convention);
// the decimal id without a vocabulary.
std::string TokenString(const Tokenizer* tokenizer, int32_t id);

// Base64 (RFC 4648, with padding) of `n` bytes.
std::string Base64(const void* data, size_t n);

}  // namespace estream::server
