#!/usr/bin/env python3
"""Score, classify and embed text with estream from Python.

    /usr/bin/python3 examples/python/score_classify_embed.py MODEL.gguf [--budget 4G] [--threads 2]

Works on any supported model with a vocabulary, e.g. the tiny test model
../shared/testdata/models/olmoe-tiny-f32.gguf (random weights: the numbers mean nothing).
"""
import argparse

import estream

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--budget", default=None, help='memory budget for packed models, e.g. "4G"')
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()

m = estream.Model(args.model, budget=args.budget, threads=args.threads)
print(m)

# Log-likelihood of a text: per-token log-probabilities (numpy) and their sum.
s = m.score("The capital of France is Paris.")
print(f"score: {len(s.tokens)} tokens, total {s.total:.3f}, perplexity {s.perplexity:.2f}")

# The most likely next tokens.
for token, logprob, text in m.next_token("The capital of France is", top_k=3):
    print(f"  next {token:6d} {logprob:8.4f} {text!r}")

# Zero-shot classification: labels as continuations of the prompt (note the leading space).
p = m.classify("Review: a wonderful, moving film.\nSentiment:", [" positive", " negative"])
print(f"classify: positive {p[0]:.3f}, negative {p[1]:.3f}")

# Embeddings of many texts in one batch: one float32 array [n, n_embd].
texts = [f"document {i}: experts are streamed from the SSD" for i in range(100)]
E = m.embed(texts, pooling="mean")
print(f"embed: {E.shape} {E.dtype}")

st = m.stats  # the last call (the embed above)
print(f"stats: {st.requests} inputs in {st.passes} pass(es), {st.tokens} tokens, {st.seconds:.3f} s, "
      f"bubble {st.bubble_rate:.1%}, {st.bytes_read} expert bytes read, peak RSS {st.peak_rss_bytes / 2**20:.0f} MiB")
