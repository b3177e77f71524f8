/* estream's C API: load a mixture-of-experts model (GGUF) once, then score, rank, classify and
 * embed text with prefill-only requests, from any language with a C FFI.
 *
 *   estream_model* m = NULL;
 *   estream_load_options o;
 *   estream_load_options_init(&o);
 *   o.n_threads = 2;
 *   if (estream_parse_size("4G", &o.budget_bytes) != ESTREAM_OK ||
 *       estream_model_load("model.gguf", &o, &m) != ESTREAM_OK) {
 *     fprintf(stderr, "%s\n", estream_last_error());
 *     return 1;
 *   }
 *   int32_t ids[256];
 *   size_t n = 0;
 *   estream_tokenize(m, "The capital of France is", (size_t)-1, ESTREAM_ADD_SPECIAL, ids, 256, &n);
 *   estream_request r;
 *   estream_request_init(&r);
 *   r.prompt.ids = ids; r.prompt.n = n; r.top_k = 5;
 *   estream_batch* b = NULL;
 *   if (estream_run_batch(m, &r, 1, &b) == ESTREAM_OK && estream_batch_status(b, 0) == ESTREAM_OK) {
 *     const estream_token_logprob* top = NULL;
 *     size_t k = estream_batch_top(b, 0, &top);     ... top[0].token, top[0].logprob ...
 *   }
 *   estream_batch_free(b);
 *   estream_model_free(m);
 *
 * Link with `pkg-config --cflags --libs estream` (libestream.so). The library is the C++ engine
 * of include/estream/engine.h behind a C ABI; the semantics of every output (log-probabilities in
 * natural log, what is scored, batching) are those documented there.
 *
 * Conventions
 *  - Functions that can fail return an int status: ESTREAM_OK (0) or one of estream_status. The
 *    message of the last failure on the calling thread is estream_last_error() (thread-local, one
 *    line naming the input at fault; valid until the next failing call on that thread).
 *  - Handles (estream_model, estream_batch) are opaque; each has one free function, which
 *    accepts NULL.
 *  - Outputs of variable size go either into caller-owned buffers (with the capacity given and
 *    the size needed always written back: ESTREAM_BUFFER_TOO_SMALL when it does not fit, then
 *    call again with a larger buffer; a NULL buffer with capacity 0 asks for the size, a NULL
 *    buffer with a capacity above 0 is INVALID_ARGUMENT), or stay in an estream_batch until
 *    estream_batch_free.
 *  - n = 0 inputs (estream_run_batch, estream_embed) is an empty call: OK, nothing runs (the
 *    model's last stats are left as they were).
 *  - Structs passed in or filled in begin with `size_t struct_size`; set it to sizeof(the
 *    struct) (the *_init functions do), so that later versions can add fields at the end
 *    without breaking binaries built against this header (a struct_size below sizeof(size_t) or
 *    above 4096, an uninitialised field, is INVALID_ARGUMENT).
 *  - Text is UTF-8 (invalid UTF-8 is replaced by U+FFFD before tokenizing, never an error).
 *
 * Thread safety: every function may be called from any thread. Calls that run the model
 * (estream_run_batch, estream_embed, estream_score_candidates) on one estream_model are
 * serialised (one runs at a time, in its own n_threads OpenMP threads); distinct models run
 * concurrently. Tokenizing never waits for a running request. An estream_batch is immutable and
 * may be read from any thread.
 */
#ifndef ESTREAM_ESTREAM_H_
#define ESTREAM_ESTREAM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ESTREAM_API __attribute__((visibility("default")))
#else
#define ESTREAM_API
#endif

#define ESTREAM_VERSION_MAJOR 0
#define ESTREAM_VERSION_MINOR 1
#define ESTREAM_VERSION_PATCH 0

/* Status codes (the engine's StatusCode, plus BUFFER_TOO_SMALL). */
typedef enum estream_status {
  ESTREAM_OK = 0,
  ESTREAM_INVALID_ARGUMENT = 1,   /* a bad argument: token id out of range, empty prompt, NULL */
  ESTREAM_CORRUPTION = 2,         /* a malformed model file */
  ESTREAM_IO_ERROR = 3,           /* the OS failed an open or a read */
  ESTREAM_NOT_SUPPORTED = 4,      /* architecture, weight type, or no vocabulary in the model */
  ESTREAM_OUT_OF_RANGE = 5,       /* a prompt longer than the context length */
  ESTREAM_RESOURCE_EXHAUSTED = 6, /* memory budget too small, allocation failed */
  ESTREAM_INTERNAL = 7,           /* a bug; the model stays usable */
  ESTREAM_BUFFER_TOO_SMALL = 8,   /* caller's buffer too small; the size needed was written */
  ESTREAM_CANCELLED = 9           /* stopped at the caller's request (estream_model_cancel) */
} estream_status;

/* The message of the last failed call on this thread ("" if none). Never NULL. */
ESTREAM_API const char* estream_last_error(void);
/* "OK", "InvalidArgument", ... for a status code; "Unknown" otherwise. */
ESTREAM_API const char* estream_status_name(int status);
/* "0.1.0": the library's version (compare with ESTREAM_VERSION_* of this header). */
ESTREAM_API const char* estream_version(void);

/* ---- loading --------------------------------------------------------------------------- */

typedef struct estream_model estream_model;

typedef enum estream_schedule {
  ESTREAM_SCHEDULE_EARLY = 0, /* default: read experts ahead, from the previous layer's routes */
  ESTREAM_SCHEDULE_AFTER_ROUTING = 1,
  ESTREAM_SCHEDULE_ON_DEMAND = 2
} estream_schedule;

typedef struct estream_load_options {
  size_t struct_size;     /* sizeof(estream_load_options) */
  int n_threads;          /* compute threads, 0 (one per CPU) to 1024 */
  uint64_t budget_bytes;  /* packed models: peak-memory budget (experts streamed); 0 = none */
  int schedule;           /* estream_schedule (streamed runs) */
  /* Longest prompt (pass) the budget plans activations for; 0 = the longest of 16384, 12288, 8192
   * (at most the context) the budget holds beside the full streaming arena, else min(context,
   * 4096), or for a budget too small for that the longest of 2048, 1024, 512, 256, 128 it holds
   * beside two banks of experts; estream_model_info.pass_tokens reports the choice. */
  int64_t budget_tokens;
  int64_t batch_tokens;   /* most tokens of one forward pass; 0 = the engine's default */
} estream_load_options;

/* Defaults: all threads, no budget, early schedule, engine defaults for the token counts. */
ESTREAM_API void estream_load_options_init(estream_load_options* options);
/* "4G", "600M", "1.5G", "123456" -> bytes (K, M, G, T = powers of 1024; an optional iB). Decimal
 * only, as the CLI's --budget: a sign, space, exponent, hex or a nonzero size below one byte is
 * INVALID_ARGUMENT. */
ESTREAM_API int estream_parse_size(const char* text, uint64_t* bytes);

/* Loads the model at `path` (options NULL = defaults) into *model. The model's vocabulary is
 * loaded too when the file has one (else the tokenize functions fail with NOT_SUPPORTED and
 * prompts are given as token ids). Errors: IO_ERROR, CORRUPTION, NOT_SUPPORTED,
 * INVALID_ARGUMENT (options), RESOURCE_EXHAUSTED (budget too small). */
ESTREAM_API int estream_model_load(const char* path, const estream_load_options* options, estream_model** model);
/* Frees the model (NULL is fine). REQUIRES: no call on it is running. */
ESTREAM_API void estream_model_free(estream_model* model);

typedef struct estream_model_info {
  size_t struct_size;        /* sizeof(estream_model_info) */
  const char* architecture;  /* "olmoe", "qwen3moe", "llama", ... (valid while the model lives) */
  const char* name;          /* general.name or "" */
  int n_layer, n_embd, n_vocab, n_ctx, n_expert, n_expert_used;
  int n_threads;             /* threads a run uses */
  int64_t pass_tokens;       /* most tokens of one forward pass */
  uint64_t weight_bytes;     /* bytes of all weights as held in memory */
  int has_tokenizer;         /* 1 when the file has a vocabulary */
  int32_t bos_id, eos_id;    /* -1 when none (or no vocabulary) */
} estream_model_info;

ESTREAM_API int estream_model_get_info(const estream_model* model, estream_model_info* info);

/* ---- tokens ---------------------------------------------------------------------------- */

/* estream_tokenize flags. */
#define ESTREAM_ADD_SPECIAL 1   /* BOS/EOS as the vocabulary asks (prompts; not continuations) */
#define ESTREAM_PARSE_SPECIAL 2 /* recognise control tokens ("<|im_start|>") written in the text */

/* Token ids of `text` (text_len bytes; (size_t)-1: NUL-terminated) into tokens[0..capacity).
 * *n_tokens = the number of ids (always written). BUFFER_TOO_SMALL when capacity < *n_tokens.
 * flags: ESTREAM_ADD_SPECIAL | ESTREAM_PARSE_SPECIAL or 0; other bits are INVALID_ARGUMENT. */
ESTREAM_API int estream_tokenize(const estream_model* model, const char* text, size_t text_len, int flags,
                                 int32_t* tokens, size_t capacity, size_t* n_tokens);
/* The text of tokens[0..n) into text[0..capacity), NUL-terminated; *text_len = its length
 * without the NUL (always written). BUFFER_TOO_SMALL when capacity < *text_len + 1. Control
 * tokens render only with render_special != 0; the bytes are exact (they may cut a UTF-8
 * character). An id outside [0, n_vocab) is INVALID_ARGUMENT (its position named), as in a
 * prompt. */
ESTREAM_API int estream_detokenize(const estream_model* model, const int32_t* tokens, size_t n, int render_special,
                                   char* text, size_t capacity, size_t* text_len);

/* ---- requests -------------------------------------------------------------------------- */

/* A view of token ids (not owned). */
typedef struct estream_tokens {
  const int32_t* ids;
  size_t n;
} estream_tokens;

typedef enum estream_pooling {
  ESTREAM_POOLING_NONE = 0,
  ESTREAM_POOLING_LAST = 1, /* the final hidden state (after the final norm) of the last token */
  ESTREAM_POOLING_MEAN = 2  /* the mean over all tokens */
} estream_pooling;

/* One prefill. Every output is opt-in. The arrays it points to must stay valid during the call
 * only. */
typedef struct estream_request {
  size_t struct_size;    /* sizeof(estream_request) */
  estream_tokens prompt; /* 1 <= n <= context length, ids < n_vocab */
  int top_k;             /* next-token distribution after the prompt: the top_k tokens (0: none) */
  int prompt_logprobs;   /* != 0: log p(prompt[t+1] | prompt[0..t]) for every t, and their sum */
  int pooling;           /* estream_pooling: the prompt's embedding */
  /* Candidate continuations scored after the prompt (the prompt is computed once; each
   * continuation attends to the prompt and to itself): log p(continuation | prompt). */
  const estream_tokens* continuations;
  size_t n_continuations;
} estream_request;

/* struct_size set, everything else zero (no outputs). */
ESTREAM_API void estream_request_init(estream_request* request);

/* The results of one estream_run_batch; read with the estream_batch_* accessors, then free. */
typedef struct estream_batch estream_batch;

/* Runs requests[0..n) as one batch (packed into as few forward passes as the pass length allows;
 * each output equals that of the request run alone). Returns OK when the batch ran; a request
 * with bad input fails alone (estream_batch_status) and the others complete. Fails as a whole
 * only for bad arguments (NULL, a struct_size that is too small). */
ESTREAM_API int estream_run_batch(estream_model* model, const estream_request* requests, size_t n,
                                  estream_batch** batch);
ESTREAM_API void estream_batch_free(estream_batch* batch);

/* Stops the calls that are running this model or waiting for it (estream_run_batch,
 * estream_embed, estream_score_candidates) at the engine's next layer: their requests not yet
 * finished end with ESTREAM_CANCELLED (estream_batch_status; estream_embed and
 * estream_score_candidates return it), those finished keep their results, the model stays
 * usable. Calls begun after it run as usual (a cancel is never pending). Async-signal-safe (one
 * lock-free atomic add): may be called from a SIGINT handler or any thread. NULL is ignored. */
ESTREAM_API void estream_model_cancel(estream_model* model);

/* Accessors. `i` is the request's index (REQUIRES i < estream_batch_size; out of range: the
 * empty result, status INVALID_ARGUMENT). Pointers stay valid until estream_batch_free. */
ESTREAM_API size_t estream_batch_size(const estream_batch* batch);
/* ESTREAM_OK or the request's error (its message: estream_batch_error). */
ESTREAM_API int estream_batch_status(const estream_batch* batch, size_t i);
ESTREAM_API const char* estream_batch_error(const estream_batch* batch, size_t i); /* "" when OK */
ESTREAM_API int64_t estream_batch_n_tokens(const estream_batch* batch, size_t i);

typedef struct estream_token_logprob {
  int32_t token;
  float logprob; /* natural log */
} estream_token_logprob;

/* The top_k next tokens, most likely first (ties: lower id); returns their number. */
ESTREAM_API size_t estream_batch_top(const estream_batch* batch, size_t i, const estream_token_logprob** top);
/* prompt_logprobs: n_tokens - 1 values (NULL / 0 when not requested or failed). */
ESTREAM_API const float* estream_batch_prompt_logprobs(const estream_batch* batch, size_t i, size_t* n);
/* Their sum (double; 0 for a 1-token prompt), and exp(-sum / (n_tokens - 1)) (NaN for a 1-token
 * prompt). Both are NaN when prompt_logprobs was not requested or the request failed. */
ESTREAM_API double estream_batch_log_likelihood(const estream_batch* batch, size_t i);
ESTREAM_API double estream_batch_perplexity(const estream_batch* batch, size_t i);
/* The embedding: n_embd floats (NULL / 0 when not requested). */
ESTREAM_API const float* estream_batch_embedding(const estream_batch* batch, size_t i, size_t* n);
ESTREAM_API size_t estream_batch_n_continuations(const estream_batch* batch, size_t i);
/* Continuation j of request i: its per-token log-probabilities (returned, *n of them), their
 * sum (*log_likelihood) and whether greedy decoding would produce it (*is_greedy); each output
 * pointer may be NULL. No such continuation (or a failed request): NULL, *n = 0,
 * *log_likelihood = NaN. */
ESTREAM_API const float* estream_batch_continuation(const estream_batch* batch, size_t i, size_t j, size_t* n,
                                                    double* log_likelihood, int* is_greedy);

/* ---- statistics ------------------------------------------------------------------------ */

/* Where the time and memory of a request (or of a whole call) went. Times in seconds. */
typedef struct estream_stats {
  size_t struct_size;  /* sizeof(estream_stats) */
  double wall_seconds; /* the whole call (tokenizing excluded in the C API) */
  double seconds;      /* forward passes, summed */
  int requests;        /* requests of the call */
  int passes;          /* forward passes that ran them */
  int64_t tokens;      /* tokens of those passes (continuations included) */
  double embed_seconds, attention_seconds, router_seconds, experts_seconds, dense_ffn_seconds, head_seconds;
  double expert_seconds, nonexpert_seconds;
  double bubble_seconds; /* compute threads waiting for expert data (streamed runs) */
  double bubble_rate;    /* bubble_seconds / seconds */
  uint64_t bytes_read;   /* expert bytes read from the file */
  double read_gbps;      /* bytes_read / loader busy time, GB/s */
  uint64_t peak_rss_bytes; /* the process's peak RSS (VmHWM) after the last pass */
  int streamed;            /* experts streamed through the arena (a budget on a packed model) */
  int group_size, banks, queue_depth;
  const char* schedule;    /* "early", "after-routing", "on-demand", or "" (static strings) */
  uint64_t arena_bytes, budget_bytes;
  int64_t groups_read, groups_skipped, groups_cancelled;
} estream_stats;

/* The figures of the forward pass that ran request i (shared by the requests of that pass). */
ESTREAM_API int estream_batch_stats(const estream_batch* batch, size_t i, estream_stats* stats);
/* The figures of the whole batch (each pass counted once). */
ESTREAM_API int estream_batch_total_stats(const estream_batch* batch, estream_stats* stats);
/* The figures of the last call that ran this model (estream_run_batch, estream_embed,
 * estream_score_candidates), from any thread. All zero before the first. */
ESTREAM_API int estream_model_last_stats(const estream_model* model, estream_stats* stats);

/* ---- one-call helpers (caller-owned outputs) ------------------------------------------- */

/* Embeddings of prompts[0..n), one batch: out[i * n_embd + d], row-major; out_len (floats) must
 * be >= n * n_embd (else BUFFER_TOO_SMALL). Fails if any prompt fails (the message names it).
 * n = 0: OK, nothing written (prompts and out may be NULL). */
ESTREAM_API int estream_embed(estream_model* model, const estream_tokens* prompts, size_t n, int pooling, float* out,
                              size_t out_len);

/* Candidate scoring (multiple choice, labels, reranking): log p(candidate j | context) into
 * log_likelihoods[j] for j < n, and, when is_greedy is not NULL, whether greedy decoding from the
 * context would produce it. One forward pass computes the context once. n = 0 (no candidates to
 * choose from) is INVALID_ARGUMENT, as an empty candidate list is in Python. */
ESTREAM_API int estream_score_candidates(estream_model* model, estream_tokens context, const estream_tokens* candidates,
                                         size_t n, double* log_likelihoods, int* is_greedy);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ESTREAM_ESTREAM_H_ */
