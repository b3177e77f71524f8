/* Score a text and print the next-token top 5 with the estream C API.
 *
 *   cc -o score examples/c/score.c $(pkg-config --cflags --libs estream)   (after cmake --install)
 *   ./score MODEL.gguf "The capital of France is"
 *
 * In the build tree it is built as build/examples/example_c_score. Ctrl-C stops a long prompt
 * at the engine's next layer (estream_model_cancel is async-signal-safe). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "estream/estream.h"

static estream_model* g_model = NULL; /* set before the handler is installed, never changed after */

static void OnInterrupt(int sig) {
  (void)sig;
  estream_model_cancel(g_model);
}

int main(int argc, char** argv) {
  estream_model* m = NULL;
  estream_load_options o;
  estream_request r;
  estream_batch* b = NULL;
  const estream_token_logprob* top = NULL;
  int32_t ids[4096];
  size_t n = 0, k, i;
  int rc;
  char piece[256];

  if (argc != 3) {
    fprintf(stderr, "usage: %s MODEL.gguf TEXT\n", argv[0]);
    return 2;
  }
  estream_load_options_init(&o);
  o.n_threads = 2;
  if (estream_model_load(argv[1], &o, &m) != ESTREAM_OK ||
      estream_tokenize(m, argv[2], (size_t)-1, ESTREAM_ADD_SPECIAL, ids, 4096, &n) != ESTREAM_OK) {
    fprintf(stderr, "error: %s\n", estream_last_error());
    estream_model_free(m);
    return 1;
  }

  g_model = m;
  signal(SIGINT, OnInterrupt);
  estream_request_init(&r);
  r.prompt.ids = ids;
  r.prompt.n = n;
  r.top_k = 5;
  r.prompt_logprobs = 1;
  rc = estream_run_batch(m, &r, 1, &b);
  signal(SIGINT, SIG_DFL); /* before the model can be freed */
  if (rc != ESTREAM_OK || estream_batch_status(b, 0) != ESTREAM_OK) {
    fprintf(stderr, "error: %s\n", b ? estream_batch_error(b, 0) : estream_last_error());
    estream_batch_free(b);
    estream_model_free(m);
    return 1;
  }
  printf("%zu tokens, log-likelihood %.4f\n", n, estream_batch_log_likelihood(b, 0));
  k = estream_batch_top(b, 0, &top);
  for (i = 0; i < k; ++i) {
    size_t len = 0;
    if (estream_detokenize(m, &top[i].token, 1, 0, piece, sizeof(piece), &len) != ESTREAM_OK) piece[0] = '\0';
    printf("  %6d  %9.4f  \"%s\"\n", (int)top[i].token, top[i].logprob, piece);
  }
  estream_batch_free(b);
  estream_model_free(m);
  return 0;
}
