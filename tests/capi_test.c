/* The C API from C (C11, not C++): every function on the tiny shared OLMoE model, checked
 * against the golden logits of testdata/models and against itself (candidates vs the same tokens
 * scored as one prompt, estream_embed vs estream_run_batch), and every error path, after which
 * the model must stay usable.
 *
 * Usage: capi_test MODELS_DIR   (ESTREAM_SHARED_DIR/testdata/models)
 *        capi_test MODELS_DIR PACKED_MODEL   (the tiny OLMoE model packed by `estream pack`): only
 *        the budgeted load (BudgetedLoad below). */
#define _POSIX_C_SOURCE 200809L /* nanosleep under C11 without extensions */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "estream/estream.h"

static int g_failures = 0;

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              estream_last_error());                                                    \
      ++g_failures;                                                                     \
    }                                                                                   \
  } while (0)
#define CHECK_OK(expr) CHECK((expr) == ESTREAM_OK)

/* Reads "a,b,c,..." ids; returns their number. */
static size_t ReadIds(const char* path, int32_t* ids, size_t cap) {
  FILE* f = fopen(path, "r");
  size_t n = 0;
  long v;
  if (f == NULL) return 0;
  while (n < cap && fscanf(f, "%ld", &v) == 1) {
    ids[n++] = (int32_t)v;
    if (fgetc(f) != ',') break;
  }
  fclose(f);
  return n;
}

/* Golden logits [rows][n_vocab] -> the log-softmax of row `row`. */
static int GoldenLogSoftmax(const char* path, int row, int n_vocab, double* out) {
  FILE* f = fopen(path, "rb");
  float* buf = (float*)malloc(sizeof(float) * (size_t)n_vocab);
  double mx = -1e300, sum = 0;
  int i, ok = 0;
  if (f != NULL && buf != NULL && fseek(f, (long)row * n_vocab * (long)sizeof(float), SEEK_SET) == 0 &&
      fread(buf, sizeof(float), (size_t)n_vocab, f) == (size_t)n_vocab) {
    for (i = 0; i < n_vocab; ++i) mx = buf[i] > mx ? buf[i] : mx;
    for (i = 0; i < n_vocab; ++i) sum += exp(buf[i] - mx);
    for (i = 0; i < n_vocab; ++i) out[i] = buf[i] - mx - log(sum);
    ok = 1;
  }
  if (f != NULL) fclose(f);
  free(buf);
  return ok;
}

/* Two threads share one model: each embeds the same prompts several times (the calls take turns
 * in the engine) and must get the reference rows bit for bit; each thread's last error is its
 * own. */
typedef struct ThreadArg {
  estream_model* m;
  const estream_tokens* prompts;
  const float* reference; /* [2][256] */
  int index;
  int failures;
} ThreadArg;

static void* EmbedWorker(void* p) {
  ThreadArg* a = (ThreadArg*)p;
  float out[2 * 256];
  int32_t bad = 999999;
  estream_tokens bad_prompt;
  int rep, j;
  bad_prompt.ids = &bad;
  bad_prompt.n = 1;
  for (rep = 0; rep < 4; ++rep) {
    if (estream_embed(a->m, a->prompts, 2, ESTREAM_POOLING_MEAN, out, 2 * 256) != ESTREAM_OK) ++a->failures;
    for (j = 0; j < 2 * 256; ++j)
      if (out[j] != a->reference[j]) ++a->failures;
    if (a->index == 1) {
      if (estream_embed(a->m, &bad_prompt, 1, ESTREAM_POOLING_MEAN, out, 256) != ESTREAM_INVALID_ARGUMENT) ++a->failures;
      if (strstr(estream_last_error(), "999999") == NULL) ++a->failures;
    } else if (strcmp(estream_last_error(), "") != 0) {
      ++a->failures; /* thread 0 never failed: another thread's error must not show here */
    }
  }
  return NULL;
}

/* One estream_run_batch on a thread of its own (the cancellation test). */
typedef struct RunArg {
  estream_model* m;
  const estream_request* requests;
  size_t n;
  estream_batch* batch;
  int rc;
} RunArg;

static void* RunWorker(void* p) {
  RunArg* a = (RunArg*)p;
  a->rc = estream_run_batch(a->m, a->requests, a->n, &a->batch);
  return NULL;
}

/* The budget (MiB) a load of `packed` with pass length `tokens` needs in this process, from the
 * RESOURCE_EXHAUSTED message of a load with a 1-byte budget ("need at least X MiB"); 0 if none. */
static double NeededMib(const char* packed, int64_t tokens) {
  estream_load_options o;
  estream_model* m = NULL;
  const char* at;
  estream_load_options_init(&o);
  o.n_threads = 1;
  o.budget_bytes = 1;
  o.budget_tokens = tokens;
  if (estream_model_load(packed, &o, &m) != ESTREAM_RESOURCE_EXHAUSTED) {
    estream_model_free(m);
    return 0;
  }
  at = strstr(estream_last_error(), "need at least ");
  return at != NULL ? strtod(at + strlen("need at least "), NULL) : 0;
}

/* A budget that holds a short pass but not the 4096-token one the library planned by default (a
 * budget that `estream prefill`, planning for the prompt's length, runs with): the load chooses a
 * shorter pass (estream_model_info.pass_tokens) instead of failing, computes what the resident
 * model computes, and refuses a longer request naming budget_tokens; only a budget too small for
 * a 128-token pass fails, naming budget_tokens too. Budgets are taken from this process's own
 * figures (they vary with the build, e.g. under a sanitizer). */
static int BudgetedLoad(const char* packed, const int32_t* prompt, size_t n_prompt) {
  const double need_long = NeededMib(packed, 4096), need_short = NeededMib(packed, 128);
  estream_load_options o;
  estream_model_info info;
  estream_model* m = NULL;
  estream_request r;
  estream_batch* b = NULL;
  const float* lp;
  float streamed[64];
  int32_t* longer;
  size_t n = 0, j;
  uint64_t budget;

  CHECK(need_short > 0 && need_long > need_short + 16);
  if (!(need_short > 0 && need_long > need_short + 16)) return 1;
  budget = (uint64_t)((need_short + need_long) / 2 * 1048576.0);
  estream_load_options_init(&o);
  o.n_threads = 2;
  o.budget_bytes = budget;
  o.budget_tokens = 4096;
  CHECK(estream_model_load(packed, &o, &m) == ESTREAM_RESOURCE_EXHAUSTED);
  CHECK(strstr(estream_last_error(), "budget_tokens") != NULL);
  o.budget_tokens = 0;
  CHECK_OK(estream_model_load(packed, &o, &m));
  if (m == NULL) return 1;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  CHECK_OK(estream_model_get_info(m, &info));
  CHECK(info.pass_tokens >= 128 && info.pass_tokens < 4096);

  estream_request_init(&r);
  r.prompt.ids = prompt;
  r.prompt.n = n_prompt;
  r.prompt_logprobs = 1;
  CHECK_OK(estream_run_batch(m, &r, 1, &b));
  lp = estream_batch_prompt_logprobs(b, 0, &n);
  CHECK(lp != NULL && n == n_prompt - 1);
  for (j = 0; j < n && lp != NULL; ++j) streamed[j] = lp[j];
  estream_batch_free(b);
  /* A request longer than the pass: an input error that names the option. */
  longer = (int32_t*)calloc((size_t)info.pass_tokens + 1, sizeof(int32_t));
  r.prompt.ids = longer;
  r.prompt.n = (size_t)info.pass_tokens + 1;
  CHECK_OK(estream_run_batch(m, &r, 1, &b));
  CHECK(estream_batch_status(b, 0) == ESTREAM_INVALID_ARGUMENT);
  CHECK(strstr(estream_batch_error(b, 0), "budget_tokens") != NULL);
  estream_batch_free(b);
  free(longer);
  estream_model_free(m);

  /* The same prompt with every expert resident (no budget): the same values, bit for bit. */
  estream_load_options_init(&o);
  o.n_threads = 2;
  CHECK_OK(estream_model_load(packed, &o, &m));
  if (m == NULL) return 1;
  r.prompt.ids = prompt;
  r.prompt.n = n_prompt;
  CHECK_OK(estream_run_batch(m, &r, 1, &b));
  lp = estream_batch_prompt_logprobs(b, 0, &n);
  CHECK(lp != NULL && n == n_prompt - 1);
  for (j = 0; j < n && lp != NULL; ++j) CHECK(lp[j] == streamed[j]);
  estream_batch_free(b);
  estream_model_free(m);

  /* Too small even for the shortest default pass: refused, naming budget_tokens. */
  estream_load_options_init(&o);
  o.budget_bytes = (uint64_t)((need_short - 4) * 1048576.0);
  CHECK(estream_model_load(packed, &o, &m) == ESTREAM_RESOURCE_EXHAUSTED);
  CHECK(m == NULL && strstr(estream_last_error(), "budget_tokens") != NULL);
  if (g_failures == 0) printf("capi_test (budgeted load): OK\n");
  return g_failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  char path[4096], tokens_path[4096], logits_path[4096];
  int32_t prompt[64];
  size_t n_prompt;
  estream_model* m = NULL;
  estream_load_options o;
  estream_model_info info;
  uint64_t bytes = 0;
  int i;

  if (argc != 2 && argc != 3) {
    fprintf(stderr, "usage: %s MODELS_DIR [PACKED_MODEL]\n", argv[0]);
    return 2;
  }
  snprintf(path, sizeof(path), "%s/olmoe-tiny-f32.gguf", argv[1]);
  snprintf(tokens_path, sizeof(tokens_path), "%s/olmoe-tiny.tokens.txt", argv[1]);
  snprintf(logits_path, sizeof(logits_path), "%s/olmoe-tiny-f32.logits.f32", argv[1]);
  n_prompt = ReadIds(tokens_path, prompt, 64);
  if (n_prompt != 48) {
    fprintf(stderr, "cannot read 48 ids from %s\n", tokens_path);
    return 1;
  }
  if (argc == 3) return BudgetedLoad(argv[2], prompt, n_prompt);

  /* ---- version, sizes, statuses ---- */
  CHECK(strcmp(estream_version(), "0.1.0") == 0);
  CHECK(strcmp(estream_status_name(ESTREAM_IO_ERROR), "IOError") == 0);
  CHECK(strcmp(estream_status_name(ESTREAM_CANCELLED), "Cancelled") == 0);
  CHECK(strcmp(estream_status_name(99), "Unknown") == 0);
  CHECK_OK(estream_parse_size("4G", &bytes));
  CHECK(bytes == 4ull << 30);
  CHECK_OK(estream_parse_size("600M", &bytes));
  CHECK(bytes == 600ull << 20);
  CHECK(estream_parse_size("4X", &bytes) == ESTREAM_INVALID_ARGUMENT);
  CHECK(strstr(estream_last_error(), "4X") != NULL);
  CHECK_OK(estream_parse_size("1.5GiB", &bytes));
  CHECK(bytes == 3ull << 29);
  CHECK_OK(estream_parse_size("0", &bytes));
  CHECK(bytes == 0);
  {
    /* as the CLI's --budget: decimal only (strtod read these as 16, 1000, 4G, 4G and 1G bytes),
     * and a nonzero size below one byte is not 0 (no budget) */
    const char* bad[] = {"0x10", "1e3", " 4G", "+4G", "0x1p30", "-0", "0.4", "inf", "."};
    size_t k;
    for (k = 0; k < sizeof(bad) / sizeof(bad[0]); ++k) {
      bytes = 7;
      CHECK(estream_parse_size(bad[k], &bytes) == ESTREAM_INVALID_ARGUMENT);
      CHECK(bytes == 7 && strstr(estream_last_error(), bad[k]) != NULL);
    }
  }

  /* ---- load errors ---- */
  CHECK(estream_model_load("/nonexistent/model.gguf", NULL, &m) == ESTREAM_IO_ERROR);
  CHECK(m == NULL);
  CHECK(strstr(estream_last_error(), "/nonexistent/model.gguf") != NULL);
  CHECK(estream_model_load("", NULL, &m) == ESTREAM_INVALID_ARGUMENT); /* not ": cannot open" */
  CHECK(m == NULL && strstr(estream_last_error(), "empty model path") != NULL);
  CHECK(estream_model_load(tokens_path, NULL, &m) == ESTREAM_CORRUPTION); /* not a GGUF file */
  estream_load_options_init(&o);
  o.struct_size = 0;
  CHECK(estream_model_load(path, &o, &m) == ESTREAM_INVALID_ARGUMENT);
  o.struct_size = 12345678; /* uninitialised */
  CHECK(estream_model_load(path, &o, &m) == ESTREAM_INVALID_ARGUMENT);
  CHECK(m == NULL && strstr(estream_last_error(), "struct_size is 12345678") != NULL);
  estream_load_options_init(&o);
  o.schedule = 7;
  CHECK(estream_model_load(path, &o, &m) == ESTREAM_INVALID_ARGUMENT);
  CHECK(estream_model_load(path, NULL, NULL) == ESTREAM_INVALID_ARGUMENT);
  estream_load_options_init(&o);
  o.n_threads = 3000; /* the CLI's -t range is 0..1024 */
  CHECK(estream_model_load(path, &o, &m) == ESTREAM_INVALID_ARGUMENT);
  CHECK(m == NULL && strstr(estream_last_error(), "1024") != NULL);

  /* ---- load ---- */
  estream_load_options_init(&o);
  o.n_threads = 2;
  CHECK_OK(estream_model_load(path, &o, &m));
  if (m == NULL) return 1;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  CHECK_OK(estream_model_get_info(m, &info));
  CHECK(strcmp(info.architecture, "olmoe") == 0);
  CHECK(info.n_embd == 256 && info.n_vocab == 512 && info.n_layer == 2 && info.n_threads == 2);
  CHECK(info.has_tokenizer == 1);
  CHECK(info.pass_tokens > 0);

  /* ---- tokens ---- */
  {
    const char* text = "Hello, world! Mixture of experts.";
    int32_t ids[128], one[1];
    size_t n = 0, len = 0, n2 = 0;
    char out[256], small[4];
    CHECK_OK(estream_tokenize(m, text, (size_t)-1, 0, ids, 128, &n));
    CHECK(n > 1);
    CHECK(estream_tokenize(m, text, (size_t)-1, 0, one, 1, &n2) == ESTREAM_BUFFER_TOO_SMALL);
    CHECK(n2 == n); /* the size needed is written back */
    CHECK_OK(estream_detokenize(m, ids, n, 0, out, sizeof(out), &len));
    CHECK(len == strlen(text) && strcmp(out, text) == 0); /* byte-level BPE round trip */
    CHECK(estream_detokenize(m, ids, n, 0, small, sizeof(small), &len) == ESTREAM_BUFFER_TOO_SMALL);
    CHECK(len == strlen(text));
    CHECK_OK(estream_tokenize(m, text, 5, 0, ids, 128, &n2)); /* explicit length: "Hello" */
    CHECK_OK(estream_detokenize(m, ids, n2, 0, out, sizeof(out), &len));
    CHECK(strcmp(out, "Hello") == 0);
    CHECK_OK(estream_tokenize(m, "", 0, 0, ids, 128, &n2));
    CHECK(n2 == 0);
    /* A NULL output buffer: with capacity 0 a size query, with a capacity an error (not a crash) */
    CHECK(estream_tokenize(m, text, (size_t)-1, 0, NULL, 0, &n2) == ESTREAM_BUFFER_TOO_SMALL);
    CHECK(n2 == n);
    CHECK(estream_tokenize(m, "hello", (size_t)-1, 0, NULL, 64, &n2) == ESTREAM_INVALID_ARGUMENT);
    CHECK(n2 == 0 && strstr(estream_last_error(), "tokens is NULL") != NULL);
    CHECK(estream_detokenize(m, ids, n, 0, NULL, 0, &len) == ESTREAM_BUFFER_TOO_SMALL);
    CHECK(len == strlen(text));
    CHECK(estream_detokenize(m, ids, n, 0, NULL, 64, &len) == ESTREAM_INVALID_ARGUMENT);
    CHECK(strstr(estream_last_error(), "text is NULL") != NULL);
    /* Ids outside the vocabulary have no text: refused (not rendered as U+FFFD), position named */
    {
      const int32_t bad_ids[3] = {ids[0], -5, ids[0]}, big_ids[2] = {ids[0], 1 << 30};
      CHECK(estream_detokenize(m, bad_ids, 3, 0, out, sizeof(out), &len) == ESTREAM_INVALID_ARGUMENT);
      CHECK(len == 0 && strstr(estream_last_error(), "token id -5 at position 1") != NULL);
      CHECK(estream_detokenize(m, big_ids, 2, 1, out, sizeof(out), &len) == ESTREAM_INVALID_ARGUMENT);
      CHECK(strstr(estream_last_error(), "out of range") != NULL);
    }
    /* Unknown flag bits are refused, not ignored */
    CHECK(estream_tokenize(m, text, (size_t)-1, 4, ids, 128, &n2) == ESTREAM_INVALID_ARGUMENT);
    CHECK(n2 == 0 && strstr(estream_last_error(), "flags = 4") != NULL);
    CHECK_OK(estream_tokenize(m, text, (size_t)-1, ESTREAM_ADD_SPECIAL | ESTREAM_PARSE_SPECIAL, ids, 128, &n2));
  }

  /* ---- a batch: scores, a bad request, embeddings and candidates ---- */
  {
    estream_request r[3];
    estream_tokens cands[2];
    int32_t bad[3] = {1, 999999, 2};
    estream_batch* b = NULL;
    const estream_token_logprob* top = NULL;
    const float* lp;
    size_t n = 0, k, j;
    double* golden = (double*)malloc(sizeof(double) * 512);
    double sum = 0, ll, cand_ll[2];
    int greedy[2];
    estream_stats st;
    float emb_helper[2 * 256];
    estream_tokens two[2];

    for (i = 0; i < 3; ++i) estream_request_init(&r[i]);
    r[0].prompt.ids = prompt;
    r[0].prompt.n = n_prompt;
    r[0].top_k = 5;
    r[0].prompt_logprobs = 1;
    r[1].prompt.ids = bad;
    r[1].prompt.n = 3;
    r[1].top_k = 5;
    cands[0].ids = prompt + 16;
    cands[0].n = 4;
    cands[1].ids = prompt + 16;
    cands[1].n = 2;
    r[2].prompt.ids = prompt;
    r[2].prompt.n = 16;
    r[2].pooling = ESTREAM_POOLING_MEAN;
    r[2].continuations = cands;
    r[2].n_continuations = 2;
    CHECK_OK(estream_run_batch(m, r, 3, &b));
    CHECK(estream_batch_size(b) == 3);

    /* request 0 against the golden logits of the last position */
    CHECK(estream_batch_status(b, 0) == ESTREAM_OK);
    CHECK(estream_batch_n_tokens(b, 0) == 48);
    k = estream_batch_top(b, 0, &top);
    CHECK(k == 5 && top != NULL);
    CHECK(GoldenLogSoftmax(logits_path, 47, 512, golden));
    for (j = 0; j < k && top != NULL; ++j) CHECK(fabs(top[j].logprob - golden[top[j].token]) < 1e-4);
    for (j = 0; j < 512 && top != NULL; ++j) CHECK(golden[j] <= golden[top[0].token] + 1e-6);
    lp = estream_batch_prompt_logprobs(b, 0, &n);
    CHECK(lp != NULL && n == 47);
    for (j = 0; j < n && lp != NULL; ++j) {
      sum += lp[j];
      if (j == 20) {
        CHECK(GoldenLogSoftmax(logits_path, 20, 512, golden));
        CHECK(fabs(lp[j] - golden[prompt[21]]) < 1e-4);
      }
    }
    CHECK(fabs(sum - estream_batch_log_likelihood(b, 0)) < 1e-4);
    CHECK(fabs(estream_batch_perplexity(b, 0) - exp(-sum / 47)) < 1e-3);
    CHECK(estream_batch_embedding(b, 0, &n) == NULL && n == 0);

    /* request 1 failed alone, with a message naming the id */
    CHECK(estream_batch_status(b, 1) == ESTREAM_INVALID_ARGUMENT);
    CHECK(strstr(estream_batch_error(b, 1), "999999") != NULL);
    CHECK(estream_batch_top(b, 1, &top) == 0 && top == NULL);
    CHECK(estream_batch_error(b, 0)[0] == '\0');
    /* no figure is NaN, never 0 (a probability of 1): a failed request, an index out of range, a
     * request that did not ask for prompt_logprobs (request 2), a continuation that is not there */
    CHECK(isnan(estream_batch_log_likelihood(b, 1)) && isnan(estream_batch_perplexity(b, 1)));
    CHECK(isnan(estream_batch_log_likelihood(b, 9)) && isnan(estream_batch_perplexity(b, 9)));
    CHECK(isnan(estream_batch_log_likelihood(b, 2)) && isnan(estream_batch_perplexity(b, 2)));
    CHECK(estream_batch_continuation(b, 1, 0, &n, &ll, NULL) == NULL && n == 0 && isnan(ll));

    /* request 2: candidates equal the same tokens scored inside request 0's prompt */
    CHECK(estream_batch_status(b, 2) == ESTREAM_OK);
    CHECK(estream_batch_n_continuations(b, 2) == 2);
    lp = estream_batch_continuation(b, 2, 0, &n, &ll, NULL);
    CHECK(lp != NULL && n == 4);
    {
      const float* full = estream_batch_prompt_logprobs(b, 0, NULL);
      double s4 = 0;
      for (j = 0; j < 4 && full != NULL && lp != NULL; ++j) {
        CHECK(fabs(lp[j] - full[15 + j]) < 1e-4);
        s4 += full[15 + j];
      }
      CHECK(fabs(ll - s4) < 1e-3);
    }
    CHECK(estream_batch_continuation(b, 2, 2, &n, &ll, NULL) == NULL && n == 0);
    lp = estream_batch_embedding(b, 2, &n);
    CHECK(lp != NULL && n == 256);

    /* estream_score_candidates: the same numbers */
    CHECK_OK(estream_score_candidates(m, r[2].prompt, cands, 2, cand_ll, greedy));
    {
      double ll0 = 0, ll1 = 0;
      estream_batch_continuation(b, 2, 0, NULL, &ll0, NULL);
      estream_batch_continuation(b, 2, 1, NULL, &ll1, NULL);
      CHECK(fabs(cand_ll[0] - ll0) < 1e-6 && fabs(cand_ll[1] - ll1) < 1e-6);
      CHECK(greedy[0] == 0 || greedy[0] == 1);
    }

    /* estream_embed: the same embedding as the batch, bit for bit (the kernels are row-wise) */
    two[0] = r[0].prompt;
    two[1] = r[2].prompt;
    CHECK_OK(estream_embed(m, two, 2, ESTREAM_POOLING_MEAN, emb_helper, 2 * 256));
    for (j = 0; j < 256 && lp != NULL; ++j) CHECK(fabs(emb_helper[256 + j] - lp[j]) <= 1e-6f * (1 + fabsf(lp[j])));
    CHECK_OK(estream_model_last_stats(m, (memset(&st, 0, sizeof(st)), st.struct_size = sizeof(st), &st)));
    CHECK(st.requests == 2 && st.passes >= 1 && st.tokens == 48 + 16 && st.seconds > 0 && st.peak_rss_bytes > 0);
    CHECK(st.wall_seconds >= st.seconds);
    CHECK(st.streamed == 0 && st.bytes_read == 0 && strcmp(st.schedule, "") == 0);

    /* per-request and whole-batch statistics */
    memset(&st, 0, sizeof(st));
    st.struct_size = sizeof(st);
    CHECK_OK(estream_batch_stats(b, 0, &st));
    CHECK(st.requests == 1 && st.seconds > 0 && st.tokens >= 48);
    CHECK(st.attention_seconds > 0 && st.experts_seconds > 0);
    CHECK(estream_batch_stats(b, 1, &st) == ESTREAM_INVALID_ARGUMENT); /* failed request */
    CHECK_OK(estream_batch_total_stats(b, &st));
    CHECK(st.requests == 3 && st.passes >= 1 && st.tokens == 48 + 16 + 6);
    /* an older, shorter struct: only its fields are written */
    {
      estream_stats small;
      memset(&small, 0x7f, sizeof(small));
      small.struct_size = offsetof(estream_stats, seconds);
      CHECK_OK(estream_batch_total_stats(b, &small));
      CHECK(small.wall_seconds > 0);
      CHECK(small.requests == 0x7f7f7f7f); /* untouched */
    }

    /* error paths of the helpers; the model stays usable */
    CHECK(estream_embed(m, two, 2, ESTREAM_POOLING_MEAN, emb_helper, 256) == ESTREAM_BUFFER_TOO_SMALL);
    CHECK(estream_embed(m, two, 2, ESTREAM_POOLING_NONE, emb_helper, 512) == ESTREAM_INVALID_ARGUMENT);
    two[1].ids = bad;
    two[1].n = 3;
    CHECK(estream_embed(m, two, 2, ESTREAM_POOLING_LAST, emb_helper, 512) == ESTREAM_INVALID_ARGUMENT);
    CHECK(strstr(estream_last_error(), "prompt 1:") != NULL);
    two[1].n = 0;
    CHECK(estream_embed(m, two, 2, ESTREAM_POOLING_LAST, emb_helper, 512) == ESTREAM_INVALID_ARGUMENT);
    CHECK(estream_score_candidates(m, r[2].prompt, cands, 0, cand_ll, NULL) == ESTREAM_INVALID_ARGUMENT);
    cands[1].n = 0; /* an empty continuation */
    CHECK(estream_score_candidates(m, r[2].prompt, cands, 2, cand_ll, NULL) == ESTREAM_INVALID_ARGUMENT);
    estream_batch_free(b);
    CHECK(estream_run_batch(m, NULL, 1, &b) == ESTREAM_INVALID_ARGUMENT);
    CHECK(b == NULL);
    r[0].pooling = 9;
    CHECK(estream_run_batch(m, r, 1, &b) == ESTREAM_INVALID_ARGUMENT);
    r[0].pooling = ESTREAM_POOLING_LAST;
    /* an uninitialised struct_size (garbage) is refused before it is used as the array's stride */
    r[0].struct_size = (size_t)1 << 40;
    CHECK(estream_run_batch(m, r, 3, &b) == ESTREAM_INVALID_ARGUMENT);
    CHECK(b == NULL && strstr(estream_last_error(), "uninitialised") != NULL);
    r[0].struct_size = sizeof(r[0]);
    CHECK_OK(estream_run_batch(m, r, 1, &b));
    CHECK(estream_batch_status(b, 0) == ESTREAM_OK);
    CHECK(estream_batch_embedding(b, 0, &n) != NULL && n == 256);
    CHECK(estream_batch_status(b, 5) == ESTREAM_INVALID_ARGUMENT);
    CHECK(strstr(estream_last_error(), "no request 5 (the batch has 1)") != NULL);
    CHECK(estream_batch_status(NULL, 0) == ESTREAM_INVALID_ARGUMENT);
    CHECK(strstr(estream_last_error(), "batch is NULL") != NULL);
    estream_batch_free(b);

    /* an empty call is a no-op returning OK, in both batch calls; the last stats stay */
    CHECK_OK(estream_run_batch(m, r, 0, &b));
    CHECK(b != NULL && estream_batch_size(b) == 0);
    estream_batch_free(b);
    CHECK_OK(estream_run_batch(m, NULL, 0, &b));
    CHECK(b != NULL && estream_batch_size(b) == 0);
    estream_batch_free(b);
    CHECK_OK(estream_embed(m, NULL, 0, ESTREAM_POOLING_LAST, NULL, 0));
    CHECK_OK(estream_embed(m, two, 0, ESTREAM_POOLING_MEAN, emb_helper, 512));
    CHECK_OK(estream_model_last_stats(m, (memset(&st, 0, sizeof(st)), st.struct_size = sizeof(st), &st)));
    CHECK(st.requests == 1 && st.passes == 1); /* the last run: estream_run_batch of r[0] above */
    CHECK(estream_embed(m, two, 1, ESTREAM_POOLING_MEAN, NULL, 256) == ESTREAM_INVALID_ARGUMENT);
    CHECK(estream_embed(m, two, 1, ESTREAM_POOLING_MEAN, NULL, 0) == ESTREAM_BUFFER_TOO_SMALL);
    estream_batch_free(NULL);
    free(golden);
  }

  /* ---- two threads on one model ---- */
  {
    estream_tokens prompts[2];
    float reference[2 * 256];
    pthread_t th[2];
    ThreadArg args[2];
    prompts[0].ids = prompt;
    prompts[0].n = 48;
    prompts[1].ids = prompt + 5;
    prompts[1].n = 11;
    CHECK_OK(estream_embed(m, prompts, 2, ESTREAM_POOLING_MEAN, reference, 2 * 256));
    for (i = 0; i < 2; ++i) {
      args[i].m = m;
      args[i].prompts = prompts;
      args[i].reference = reference;
      args[i].index = i;
      args[i].failures = 0;
      CHECK(pthread_create(&th[i], NULL, EmbedWorker, &args[i]) == 0);
    }
    for (i = 0; i < 2; ++i) {
      pthread_join(th[i], NULL);
      CHECK(args[i].failures == 0);
    }
  }

  /* ---- estream_model_cancel: a cancel before a call is not pending; one from another thread
   * stops the running batch at a layer (the passes finished keep their results, the rest are
   * CANCELLED) and the model runs the next call as usual. One request a pass (batch_tokens =
   * its length), so that the batch runs many passes; if the cancel came before the run began
   * (the run then completes), the attempt is repeated with a later cancel. ---- */
  {
    enum { kRequests = 3000 };
    estream_model* mc = NULL;
    estream_request* reqs = (estream_request*)calloc(kRequests, sizeof(estream_request));
    estream_batch* b = NULL;
    const estream_token_logprob* top = NULL;
    estream_token_logprob want;
    int attempt, cancelled = 0;
    estream_model_cancel(NULL);
    estream_load_options_init(&o);
    o.n_threads = 1;
    o.batch_tokens = 48;
    CHECK_OK(estream_model_load(path, &o, &mc));
    for (i = 0; i < kRequests; ++i) {
      estream_request_init(&reqs[i]);
      reqs[i].prompt.ids = prompt;
      reqs[i].prompt.n = 48;
      reqs[i].top_k = 1;
    }
    estream_model_cancel(mc);
    CHECK_OK(estream_run_batch(mc, reqs, 1, &b));
    CHECK(estream_batch_status(b, 0) == ESTREAM_OK && estream_batch_top(b, 0, &top) == 1);
    want = top[0];
    estream_batch_free(b);
    for (attempt = 0; attempt < 6 && cancelled == 0; ++attempt) {
      RunArg run;
      pthread_t th;
      int ok = 0;
      run.m = mc;
      run.requests = reqs;
      run.n = kRequests;
      run.batch = NULL;
      run.rc = -1;
      CHECK(pthread_create(&th, NULL, RunWorker, &run) == 0);
      {
        struct timespec wait; /* 20 ms, doubled each attempt */
        wait.tv_sec = 0;
        wait.tv_nsec = 20000000L << attempt;
        while (wait.tv_nsec >= 1000000000L) {
          ++wait.tv_sec;
          wait.tv_nsec -= 1000000000L;
        }
        nanosleep(&wait, NULL);
      }
      estream_model_cancel(mc);
      pthread_join(th, NULL);
      CHECK(run.rc == ESTREAM_OK && estream_batch_size(run.batch) == kRequests);
      for (i = 0; i < (int)estream_batch_size(run.batch); ++i) {
        const int st = estream_batch_status(run.batch, (size_t)i);
        if (st == ESTREAM_OK) {
          ++ok;
          CHECK(estream_batch_top(run.batch, (size_t)i, &top) == 1 && top[0].token == want.token &&
                top[0].logprob == want.logprob);
        } else {
          CHECK(st == ESTREAM_CANCELLED && strlen(estream_batch_error(run.batch, (size_t)i)) > 0);
          ++cancelled;
        }
      }
      CHECK(ok + cancelled == (int)estream_batch_size(run.batch));
      estream_batch_free(run.batch);
    }
    CHECK(cancelled > 0);
    CHECK_OK(estream_run_batch(mc, reqs, 2, &b));
    CHECK(estream_batch_status(b, 0) == ESTREAM_OK && estream_batch_status(b, 1) == ESTREAM_OK);
    CHECK(estream_batch_top(b, 1, &top) == 1 && top[0].token == want.token && top[0].logprob == want.logprob);
    estream_batch_free(b);
    estream_model_free(mc);
    free(reqs);
  }

  /* ---- a request longer than one forward pass: an input error, not a memory one ---- */
  {
    estream_model* m4 = NULL;
    estream_request r;
    estream_batch* b = NULL;
    estream_load_options_init(&o);
    o.n_threads = 1;
    o.batch_tokens = 4;
    CHECK_OK(estream_model_load(path, &o, &m4));
    estream_request_init(&r);
    r.prompt.ids = prompt;
    r.prompt.n = 6;
    r.top_k = 1;
    CHECK_OK(estream_run_batch(m4, &r, 1, &b));
    CHECK(estream_batch_status(b, 0) == ESTREAM_INVALID_ARGUMENT);
    CHECK(strstr(estream_batch_error(b, 0), "raise batch_tokens (--batch-tokens)") != NULL);
    estream_batch_free(b);
    estream_model_free(m4);
  }

  estream_model_free(m);
  estream_model_free(NULL);
  if (g_failures > 0) {
    fprintf(stderr, "capi_test: %d checks failed\n", g_failures);
    return 1;
  }
  printf("capi_test: all checks passed\n");
  return 0;
}
