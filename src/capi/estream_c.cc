// The C API (include/estream/estream.h) over the C++ API (include/estream/engine.h,
// include/estream/tokenizer.h). Every entry point catches C++ exceptions (none may cross the C
// boundary): std::bad_alloc becomes RESOURCE_EXHAUSTED, anything else INTERNAL.
#include "estream/estream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "capi/frontend.h"
#include "estream/engine.h"
#include "estream/tokenizer.h"

struct estream_model {
  std::unique_ptr<estream::Engine> engine;
  std::unique_ptr<estream::TextTokenizer> tokenizer;  // null: the file has no vocabulary
  std::string tokenizer_error;                        // why not
  mutable std::mutex mu;
  estream::frontend::CallStats last;  // GUARDED_BY(mu)
  // Raised by estream_model_cancel; a run stops when it differs from the value it began with.
  std::atomic<uint64_t> cancels{0};
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "estream_model_cancel must be async-signal-safe");
};

struct estream_batch {
  std::vector<estream::Result<estream::Response>> results;
  std::vector<std::vector<estream_token_logprob>> top;  // results[i].top as C structs
  std::vector<std::string> errors;                      // "" when OK
  std::vector<char> scored;                             // requests[i].prompt_logprobs was set
  estream::frontend::CallStats total;
};

namespace {

using estream::Engine;
using estream::EngineOptions;
using estream::Request;
using estream::Response;
using estream::Result;
using estream::Status;
using estream::StatusCode;
using estream::frontend::CallStats;

thread_local std::string g_last_error;

int Fail(int code, std::string message) {
  g_last_error = std::move(message);
  return code;
}
// The C code of a StatusCode: the same number, but Cancelled (after BufferTooSmall in the C enum).
int CStatus(StatusCode code) { return code == StatusCode::kCancelled ? ESTREAM_CANCELLED : static_cast<int>(code); }

int Fail(const Status& st) { return Fail(CStatus(st.code()), st.message()); }

// Runs `body` (returning an int status), turning exceptions into status codes.
template <typename F>
int Guard(const char* fn, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(ESTREAM_RESOURCE_EXHAUSTED, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return Fail(ESTREAM_INTERNAL, std::string(fn) + ": internal error: " + e.what());
  } catch (...) {
    return Fail(ESTREAM_INTERNAL, std::string(fn) + ": internal error");
  }
}

// Larger than any version of a struct of this API will be: a struct_size above it is an
// uninitialised field (stack garbage), which as the stride of a request array would send
// estream_run_batch reading far outside the caller's memory.
constexpr size_t kMaxStructSize = 4096;

// A caller's struct of version `struct_size` bytes, over defaults (fields it lacks keep them).
template <typename T>
int CopyIn(const T* in, T* out, const char* what) {
  if (in->struct_size < sizeof(size_t) || in->struct_size > kMaxStructSize)
    return Fail(ESTREAM_INVALID_ARGUMENT, std::string(what) + ".struct_size is " + std::to_string(in->struct_size) +
                                              " (uninitialised?); set it to sizeof(" + what + ") (or call " + what +
                                              "_init)");
  std::memcpy(static_cast<void*>(out), in, std::min(in->struct_size, sizeof(T)));
  out->struct_size = sizeof(T);
  return ESTREAM_OK;
}

template <typename T>
int CopyOut(const T& full, T* out, const char* what) {
  if (out == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, std::string(what) + " is NULL");
  if (out->struct_size < sizeof(size_t) || out->struct_size > kMaxStructSize)
    return Fail(ESTREAM_INVALID_ARGUMENT, std::string(what) + "->struct_size is " + std::to_string(out->struct_size) +
                                              " (uninitialised?); set it to sizeof(" + what + ")");
  const size_t n = std::min(out->struct_size, sizeof(T));
  std::memcpy(static_cast<void*>(out), &full, n);
  out->struct_size = n;
  return ESTREAM_OK;
}

const char* StaticSchedule(const std::string& s) {
  if (s == "early") return "early";
  if (s == "after-routing") return "after-routing";
  if (s == "on-demand") return "on-demand";
  return "";
}

estream_stats ToC(const CallStats& s) {
  estream_stats c;
  std::memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  c.wall_seconds = s.wall_seconds;
  c.seconds = s.seconds;
  c.requests = s.requests;
  c.passes = s.passes;
  c.tokens = s.tokens;
  c.embed_seconds = s.timing.embed;
  c.attention_seconds = s.timing.attention;
  c.router_seconds = s.timing.router;
  c.experts_seconds = s.timing.experts;
  c.dense_ffn_seconds = s.timing.dense_ffn;
  c.head_seconds = s.timing.head;
  c.expert_seconds = s.expert_seconds;
  c.nonexpert_seconds = s.nonexpert_seconds;
  c.bubble_seconds = s.bubble_seconds;
  c.bubble_rate = s.bubble_rate;
  c.bytes_read = s.bytes_read;
  c.read_gbps = s.read_gbps;
  c.peak_rss_bytes = s.peak_rss_bytes;
  c.streamed = s.streamed ? 1 : 0;
  c.group_size = s.group_size;
  c.banks = s.banks;
  c.queue_depth = s.queue_depth;
  c.schedule = StaticSchedule(s.schedule);
  c.arena_bytes = s.arena_bytes;
  c.budget_bytes = s.budget_bytes;
  c.groups_read = s.groups_read;
  c.groups_skipped = s.groups_skipped;
  c.groups_cancelled = s.groups_cancelled;
  return c;
}

std::vector<int32_t> Ids(const estream_tokens& t) {
  if (t.ids == nullptr || t.n == 0) return {};
  return std::vector<int32_t>(t.ids, t.ids + t.n);
}

// Runs `requests` on the model, timing the call and recording it as the model's last stats. An
// estream_model_cancel from now on stops it at the engine's next layer (unfinished requests:
// Cancelled); one that came before does not.
std::vector<Result<Response>> RunAndRecord(estream_model* m, const std::vector<Request>& requests, CallStats* total) {
  const uint64_t cancels = m->cancels.load(std::memory_order_relaxed);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Result<Response>> results = m->engine->RunBatch(
      requests, 0, [m, cancels] { return m->cancels.load(std::memory_order_relaxed) != cancels; });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CallStats s = estream::frontend::Summarize(results, wall);
  {
    std::lock_guard<std::mutex> lock(m->mu);
    m->last = s;
  }
  if (total != nullptr) *total = std::move(s);
  return results;
}

const estream_batch* Item(const estream_batch* b, size_t i) {
  return b != nullptr && i < b->results.size() ? b : nullptr;
}
const Response* OkResponse(const estream_batch* b, size_t i) {
  if (Item(b, i) == nullptr || !b->results[i].ok()) return nullptr;
  return &b->results[i].value();
}

}  // namespace

extern "C" {

const char* estream_last_error(void) { return g_last_error.c_str(); }

const char* estream_status_name(int status) {
  switch (status) {
    case ESTREAM_OK: return "OK";
    case ESTREAM_INVALID_ARGUMENT: return "InvalidArgument";
    case ESTREAM_CORRUPTION: return "Corruption";
    case ESTREAM_IO_ERROR: return "IOError";
    case ESTREAM_NOT_SUPPORTED: return "NotSupported";
    case ESTREAM_OUT_OF_RANGE: return "OutOfRange";
    case ESTREAM_RESOURCE_EXHAUSTED: return "ResourceExhausted";
    case ESTREAM_INTERNAL: return "Internal";
    case ESTREAM_BUFFER_TOO_SMALL: return "BufferTooSmall";
    case ESTREAM_CANCELLED: return "Cancelled";
    default: return "Unknown";
  }
}

const char* estream_version(void) { return "0.1.0"; }

void estream_load_options_init(estream_load_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->schedule = ESTREAM_SCHEDULE_EARLY;
}

int estream_parse_size(const char* text, uint64_t* bytes) {
  return Guard("estream_parse_size", [&] {
    if (text == nullptr || bytes == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_parse_size: NULL argument");
    Result<uint64_t> r = estream::frontend::ParseSize(text);
    if (!r.ok()) return Fail(r.status());
    *bytes = *r;
    return static_cast<int>(ESTREAM_OK);
  });
}

int estream_model_load(const char* path, const estream_load_options* options, estream_model** model) {
  return Guard("estream_model_load", [&] {
    if (model == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_model_load: model (the output) is NULL");
    *model = nullptr;
    if (path == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_model_load: path is NULL");
    estream_load_options o;
    estream_load_options_init(&o);
    if (options != nullptr) {
      const int rc = CopyIn(options, &o, "estream_load_options");
      if (rc != ESTREAM_OK) return rc;
    }
    EngineOptions eo;
    if (o.budget_tokens < 0 || o.batch_tokens < 0)
      return Fail(ESTREAM_INVALID_ARGUMENT, "budget_tokens and batch_tokens must be >= 0 (0 = default)");
    eo.n_threads = o.n_threads;
    eo.budget_bytes = o.budget_bytes;
    eo.budget_tokens = o.budget_tokens;
    eo.batch_tokens = o.batch_tokens;
    switch (o.schedule) {
      case ESTREAM_SCHEDULE_EARLY: eo.schedule = EngineOptions::Schedule::kEarly; break;
      case ESTREAM_SCHEDULE_AFTER_ROUTING: eo.schedule = EngineOptions::Schedule::kAfterRouting; break;
      case ESTREAM_SCHEDULE_ON_DEMAND: eo.schedule = EngineOptions::Schedule::kOnDemand; break;
      default:
        return Fail(ESTREAM_INVALID_ARGUMENT, "schedule = " + std::to_string(o.schedule) +
                                                  " is not an estream_schedule (0 early, 1 after-routing, 2 on-demand)");
    }
    auto m = std::make_unique<estream_model>();
    Result<std::unique_ptr<Engine>> engine = Engine::Load(path, eo);
    if (!engine.ok()) return Fail(engine.status());
    m->engine = std::move(engine).value();
    auto tok = estream::TextTokenizer::Load(path);
    if (tok.ok()) m->tokenizer = std::move(tok).value();
    else m->tokenizer_error = tok.status().message();
    *model = m.release();
    return static_cast<int>(ESTREAM_OK);
  });
}

void estream_model_free(estream_model* model) { delete model; }

int estream_model_get_info(const estream_model* model, estream_model_info* info) {
  return Guard("estream_model_get_info", [&] {
    if (model == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_model_get_info: model is NULL");
    const estream::ModelInfo& mi = model->engine->info();
    estream_model_info c;
    std::memset(&c, 0, sizeof(c));
    c.struct_size = sizeof(c);
    c.architecture = mi.architecture.c_str();
    c.name = mi.name.c_str();
    c.n_layer = mi.n_layer;
    c.n_embd = mi.n_embd;
    c.n_vocab = mi.n_vocab;
    c.n_ctx = mi.n_ctx;
    c.n_expert = mi.n_expert;
    c.n_expert_used = mi.n_expert_used;
    c.n_threads = model->engine->n_threads();
    c.pass_tokens = model->engine->pass_tokens();
    c.weight_bytes = mi.weight_bytes;
    c.has_tokenizer = model->tokenizer != nullptr;
    c.bos_id = model->tokenizer ? model->tokenizer->bos_id() : -1;
    c.eos_id = model->tokenizer ? model->tokenizer->eos_id() : -1;
    return CopyOut(c, info, "estream_model_info");
  });
}

int estream_tokenize(const estream_model* model, const char* text, size_t text_len, int flags, int32_t* tokens,
                     size_t capacity, size_t* n_tokens) {
  return Guard("estream_tokenize", [&] {
    if (n_tokens != nullptr) *n_tokens = 0;
    if (model == nullptr || n_tokens == nullptr)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_tokenize: model or n_tokens is NULL");
    if (text == nullptr && text_len != 0) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_tokenize: text is NULL");
    if (tokens == nullptr && capacity != 0)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_tokenize: tokens is NULL but capacity is " +
                                                std::to_string(capacity) + " (NULL with capacity 0 asks for the size)");
    if ((flags & ~(ESTREAM_ADD_SPECIAL | ESTREAM_PARSE_SPECIAL)) != 0)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_tokenize: flags = " + std::to_string(flags) +
                                                " has bits other than ESTREAM_ADD_SPECIAL (1) and ESTREAM_PARSE_SPECIAL (2)");
    if (model->tokenizer == nullptr) return Fail(ESTREAM_NOT_SUPPORTED, model->tokenizer_error);
    if (text_len == static_cast<size_t>(-1)) text_len = std::strlen(text);
    const std::vector<int32_t> ids = model->tokenizer->Encode(std::string_view(text == nullptr ? "" : text, text_len),
                                                              (flags & ESTREAM_ADD_SPECIAL) != 0,
                                                              (flags & ESTREAM_PARSE_SPECIAL) != 0);
    *n_tokens = ids.size();
    if (ids.size() > capacity)
      return Fail(ESTREAM_BUFFER_TOO_SMALL, "estream_tokenize: the text has " + std::to_string(ids.size()) +
                                                " tokens, the buffer holds " + std::to_string(capacity));
    if (!ids.empty()) std::memcpy(tokens, ids.data(), ids.size() * sizeof(int32_t));
    return static_cast<int>(ESTREAM_OK);
  });
}

int estream_detokenize(const estream_model* model, const int32_t* tokens, size_t n, int render_special, char* text,
                       size_t capacity, size_t* text_len) {
  return Guard("estream_detokenize", [&] {
    if (text_len != nullptr) *text_len = 0;
    if (model == nullptr || text_len == nullptr)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_detokenize: model or text_len is NULL");
    if (tokens == nullptr && n != 0) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_detokenize: tokens is NULL");
    if (text == nullptr && capacity != 0)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_detokenize: text is NULL but capacity is " +
                                                std::to_string(capacity) + " (NULL with capacity 0 asks for the size)");
    if (model->tokenizer == nullptr) return Fail(ESTREAM_NOT_SUPPORTED, model->tokenizer_error);
    // Ids the vocabulary has no text for are refused, as estream_run_batch refuses them (Decode
    // would render them as U+FFFD: text that no token gave).
    const int32_t n_vocab = model->tokenizer->n_vocab();
    for (size_t i = 0; i < n; ++i)
      if (tokens[i] < 0 || tokens[i] >= n_vocab)
        return Fail(ESTREAM_INVALID_ARGUMENT, "estream_detokenize: token id " + std::to_string(tokens[i]) +
                                                  " at position " + std::to_string(i) + " is out of range [0, " +
                                                  std::to_string(n_vocab) + ")");
    const std::string s = model->tokenizer->Decode(std::span<const int32_t>(tokens, n), render_special != 0);
    *text_len = s.size();
    if (text == nullptr || capacity < s.size() + 1)
      return Fail(ESTREAM_BUFFER_TOO_SMALL, "estream_detokenize: the text has " + std::to_string(s.size()) +
                                                " bytes (+1 for the NUL), the buffer holds " + std::to_string(capacity));
    std::memcpy(text, s.data(), s.size());
    text[s.size()] = '\0';
    return static_cast<int>(ESTREAM_OK);
  });
}

void estream_request_init(estream_request* request) {
  if (request == nullptr) return;
  std::memset(request, 0, sizeof(*request));
  request->struct_size = sizeof(*request);
}

int estream_run_batch(estream_model* model, const estream_request* requests, size_t n, estream_batch** batch) {
  return Guard("estream_run_batch", [&] {
    if (batch == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_run_batch: batch (the output) is NULL");
    *batch = nullptr;
    if (model == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_run_batch: model is NULL");
    if (requests == nullptr && n != 0) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_run_batch: requests is NULL");
    if (n == 0) {  // nothing to run: an empty batch; the model's last stats stay those of its last run
      *batch = new estream_batch();
      return static_cast<int>(ESTREAM_OK);
    }
    // An array of a caller's struct version: its stride is its struct_size.
    const size_t stride = requests[0].struct_size;
    std::vector<Request> reqs(n);
    std::vector<char> scored(n);
    for (size_t i = 0; i < n; ++i) {
      const auto* ri = reinterpret_cast<const estream_request*>(reinterpret_cast<const char*>(requests) + i * stride);
      if (ri->struct_size != stride)
        return Fail(ESTREAM_INVALID_ARGUMENT, "estream_run_batch: requests[" + std::to_string(i) +
                                                  "].struct_size differs from requests[0]'s");
      estream_request r;
      estream_request_init(&r);
      const int rc = CopyIn(ri, &r, "estream_request");
      if (rc != ESTREAM_OK) return rc;
      if (r.prompt.ids == nullptr && r.prompt.n != 0)
        return Fail(ESTREAM_INVALID_ARGUMENT, "estream_run_batch: requests[" + std::to_string(i) + "].prompt.ids is NULL");
      if (r.continuations == nullptr && r.n_continuations != 0)
        return Fail(ESTREAM_INVALID_ARGUMENT,
                    "estream_run_batch: requests[" + std::to_string(i) + "].continuations is NULL");
      Request& q = reqs[i];
      scored[i] = r.prompt_logprobs != 0;
      q.tokens = Ids(r.prompt);
      q.top_k = r.top_k;
      q.prompt_logprobs = r.prompt_logprobs != 0;
      switch (r.pooling) {
        case ESTREAM_POOLING_NONE: q.embedding = Request::Pooling::kNone; break;
        case ESTREAM_POOLING_LAST: q.embedding = Request::Pooling::kLast; break;
        case ESTREAM_POOLING_MEAN: q.embedding = Request::Pooling::kMean; break;
        default:
          return Fail(ESTREAM_INVALID_ARGUMENT, "estream_run_batch: requests[" + std::to_string(i) + "].pooling = " +
                                                    std::to_string(r.pooling) + " is not an estream_pooling");
      }
      for (size_t j = 0; j < r.n_continuations; ++j) {
        if (r.continuations[j].ids == nullptr && r.continuations[j].n != 0)
          return Fail(ESTREAM_INVALID_ARGUMENT, "estream_run_batch: requests[" + std::to_string(i) + "].continuations[" +
                                                    std::to_string(j) + "].ids is NULL");
        q.continuations.push_back(Ids(r.continuations[j]));
      }
    }
    auto b = std::make_unique<estream_batch>();
    b->results = RunAndRecord(model, reqs, &b->total);
    b->scored = std::move(scored);
    b->top.resize(n);
    b->errors.resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (!b->results[i].ok()) {
        b->errors[i] = b->results[i].status().message();
        continue;
      }
      for (const estream::TokenLogprob& t : b->results[i]->top) b->top[i].push_back({t.token, t.logprob});
    }
    *batch = b.release();
    return static_cast<int>(ESTREAM_OK);
  });
}

void estream_model_cancel(estream_model* model) {
  if (model != nullptr) model->cancels.fetch_add(1, std::memory_order_relaxed);
}

void estream_batch_free(estream_batch* batch) { delete batch; }

size_t estream_batch_size(const estream_batch* batch) { return batch == nullptr ? 0 : batch->results.size(); }

int estream_batch_status(const estream_batch* batch, size_t i) {
  if (batch == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_batch_status: batch is NULL");
  if (Item(batch, i) == nullptr)
    return Fail(ESTREAM_INVALID_ARGUMENT, "estream_batch_status: no request " + std::to_string(i) + " (the batch has " +
                                              std::to_string(batch->results.size()) + ")");
  return CStatus(batch->results[i].status().code());
}

const char* estream_batch_error(const estream_batch* batch, size_t i) {
  if (Item(batch, i) == nullptr) return "no such request";
  return batch->errors[i].c_str();
}

int64_t estream_batch_n_tokens(const estream_batch* batch, size_t i) {
  const Response* r = OkResponse(batch, i);
  return r == nullptr ? 0 : r->n_tokens;
}

size_t estream_batch_top(const estream_batch* batch, size_t i, const estream_token_logprob** top) {
  if (top != nullptr) *top = nullptr;
  if (OkResponse(batch, i) == nullptr || batch->top[i].empty()) return 0;
  if (top != nullptr) *top = batch->top[i].data();
  return batch->top[i].size();
}

const float* estream_batch_prompt_logprobs(const estream_batch* batch, size_t i, size_t* n) {
  if (n != nullptr) *n = 0;
  const Response* r = OkResponse(batch, i);
  if (r == nullptr || r->prompt_logprobs.empty()) return nullptr;
  if (n != nullptr) *n = r->prompt_logprobs.size();
  return r->prompt_logprobs.data();
}

// NaN, not 0 (a probability of 1), when there is no such figure: a failed request, an index out
// of range, or prompt_logprobs not requested (the engine leaves its fields at 0 then).
double estream_batch_log_likelihood(const estream_batch* batch, size_t i) {
  const Response* r = OkResponse(batch, i);
  return r == nullptr || !batch->scored[i] ? std::nan("") : r->log_likelihood;
}

double estream_batch_perplexity(const estream_batch* batch, size_t i) {
  const Response* r = OkResponse(batch, i);
  return r == nullptr || !batch->scored[i] ? std::nan("") : r->perplexity;
}

const float* estream_batch_embedding(const estream_batch* batch, size_t i, size_t* n) {
  if (n != nullptr) *n = 0;
  const Response* r = OkResponse(batch, i);
  if (r == nullptr || r->embedding.empty()) return nullptr;
  if (n != nullptr) *n = r->embedding.size();
  return r->embedding.data();
}

size_t estream_batch_n_continuations(const estream_batch* batch, size_t i) {
  const Response* r = OkResponse(batch, i);
  return r == nullptr ? 0 : r->continuations.size();
}

const float* estream_batch_continuation(const estream_batch* batch, size_t i, size_t j, size_t* n,
                                        double* log_likelihood, int* is_greedy) {
  if (n != nullptr) *n = 0;
  if (log_likelihood != nullptr) *log_likelihood = std::nan("");  // no such continuation
  if (is_greedy != nullptr) *is_greedy = 0;
  const Response* r = OkResponse(batch, i);
  if (r == nullptr || j >= r->continuations.size()) return nullptr;
  const estream::ContinuationScore& c = r->continuations[j];
  if (n != nullptr) *n = c.logprobs.size();
  if (log_likelihood != nullptr) *log_likelihood = c.log_likelihood;
  if (is_greedy != nullptr) *is_greedy = c.is_greedy ? 1 : 0;
  return c.logprobs.data();
}

int estream_batch_stats(const estream_batch* batch, size_t i, estream_stats* stats) {
  return Guard("estream_batch_stats", [&] {
    const Response* r = OkResponse(batch, i);
    if (r == nullptr)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_batch_stats: request " + std::to_string(i) +
                                                (Item(batch, i) == nullptr ? " does not exist" : " failed"));
    return CopyOut(ToC(estream::frontend::StatsOf(*r)), stats, "estream_stats");
  });
}

int estream_batch_total_stats(const estream_batch* batch, estream_stats* stats) {
  return Guard("estream_batch_total_stats", [&] {
    if (batch == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_batch_total_stats: batch is NULL");
    return CopyOut(ToC(batch->total), stats, "estream_stats");
  });
}

int estream_model_last_stats(const estream_model* model, estream_stats* stats) {
  return Guard("estream_model_last_stats", [&] {
    if (model == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_model_last_stats: model is NULL");
    CallStats s;
    {
      std::lock_guard<std::mutex> lock(model->mu);
      s = model->last;
    }
    return CopyOut(ToC(s), stats, "estream_stats");
  });
}

int estream_embed(estream_model* model, const estream_tokens* prompts, size_t n, int pooling, float* out,
                  size_t out_len) {
  return Guard("estream_embed", [&] {
    if (model == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_embed: model is NULL");
    if (prompts == nullptr && n != 0) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_embed: prompts is NULL");
    if (pooling != ESTREAM_POOLING_LAST && pooling != ESTREAM_POOLING_MEAN)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_embed: pooling must be ESTREAM_POOLING_LAST or ESTREAM_POOLING_MEAN");
    if (out == nullptr && out_len != 0)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_embed: out is NULL but out_len is " + std::to_string(out_len));
    if (n == 0) return static_cast<int>(ESTREAM_OK);  // nothing to embed, as estream_run_batch with n = 0
    const size_t n_embd = static_cast<size_t>(model->engine->info().n_embd);
    if (out == nullptr || out_len / n_embd < n)  // (n * n_embd may not fit a size_t)
      return Fail(ESTREAM_BUFFER_TOO_SMALL, "estream_embed: " + std::to_string(n) + " embeddings need " +
                                                std::to_string(n * n_embd) + " floats, the buffer holds " +
                                                std::to_string(out == nullptr ? 0 : out_len));
    std::vector<Request> reqs(n);
    for (size_t i = 0; i < n; ++i) {
      if (prompts[i].ids == nullptr && prompts[i].n != 0)
        return Fail(ESTREAM_INVALID_ARGUMENT, "estream_embed: prompts[" + std::to_string(i) + "].ids is NULL");
      reqs[i].tokens = Ids(prompts[i]);
      reqs[i].top_k = 0;
      reqs[i].embedding = pooling == ESTREAM_POOLING_LAST ? Request::Pooling::kLast : Request::Pooling::kMean;
    }
    std::vector<Result<Response>> results = RunAndRecord(model, reqs, nullptr);
    const Status st = estream::frontend::FirstError(results, "prompt");
    if (!st.ok()) return Fail(st);
    for (size_t i = 0; i < n; ++i) std::memcpy(out + i * n_embd, results[i]->embedding.data(), n_embd * sizeof(float));
    return static_cast<int>(ESTREAM_OK);
  });
}

int estream_score_candidates(estream_model* model, estream_tokens context, const estream_tokens* candidates, size_t n,
                             double* log_likelihoods, int* is_greedy) {
  return Guard("estream_score_candidates", [&] {
    if (model == nullptr) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_score_candidates: model is NULL");
    if (n == 0) return Fail(ESTREAM_INVALID_ARGUMENT, "estream_score_candidates: no candidates (n = 0)");
    if (candidates == nullptr || log_likelihoods == nullptr)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_score_candidates: candidates or log_likelihoods is NULL");
    if (context.ids == nullptr && context.n != 0)
      return Fail(ESTREAM_INVALID_ARGUMENT, "estream_score_candidates: context.ids is NULL");
    Request req;
    req.tokens = Ids(context);
    req.top_k = 0;
    for (size_t j = 0; j < n; ++j) {
      if (candidates[j].ids == nullptr && candidates[j].n != 0)
        return Fail(ESTREAM_INVALID_ARGUMENT, "estream_score_candidates: candidates[" + std::to_string(j) + "].ids is NULL");
      req.continuations.push_back(Ids(candidates[j]));
    }
    std::vector<Result<Response>> results = RunAndRecord(model, std::vector<Request>{std::move(req)}, nullptr);
    if (!results[0].ok()) return Fail(results[0].status());
    for (size_t j = 0; j < n; ++j) {
      log_likelihoods[j] = results[0]->continuations[j].log_likelihood;
      if (is_greedy != nullptr) is_greedy[j] = results[0]->continuations[j].is_greedy ? 1 : 0;
    }
    return static_cast<int>(ESTREAM_OK);
  });
}

}  // extern "C"
