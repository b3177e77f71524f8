#!/usr/bin/env python3
"""Benchmark (not a test) of the Python module's overhead (issue 21).

1. Per call: Model.score(token_ids) on a 128-token prompt against the C++ API doing the same
   (build the Request, Engine::RunBatch of one, read the Response), timed inside the extension
   with the GIL released (Model._time_cpp_score), in the same process, alternating rounds.
   Overhead = median(Python) / median(C++) - 1.
2. Embeddings of 1,000 texts as one numpy array: wall time of Model.embed, against the engine's
   own time for the passes (Model.stats.seconds) and the call's time in C++ (stats.wall_seconds,
   tokenizing included).

    flock -x /tmp/estream-cpu.lock /usr/bin/python3 bench/python_overhead.py \
        [--model ../shared/testdata/models/olmoe-tiny-f32.gguf] [--rounds 7] [--reps 20] [--threads 2]

PYTHONPATH=build/python is assumed when the .pth file of scripts/build.sh is not in place.
"""
import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import estream

ROOT = Path(__file__).resolve().parents[1]
ap = argparse.ArgumentParser()
ap.add_argument("--model", default=str(ROOT.parent / "shared/testdata/models/olmoe-tiny-f32.gguf"))
ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (medians over all calls)")
ap.add_argument("--reps", type=int, default=20, help="calls per round and variant")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--tokens", type=int, default=128)
ap.add_argument("--texts", type=int, default=1000)
args = ap.parse_args()

m = estream.Model(args.model, threads=args.threads)
rng = np.random.default_rng(21)
ids = [int(x) for x in rng.integers(3, m.n_vocab, size=args.tokens)]
ids_np = np.array(ids, dtype=np.int32)

# Warm-up (first-touch of activation buffers, thread pool start).
for _ in range(5):
    m.score(ids)
m._time_cpp_score(ids, 5)

cpp, py_list, py_np = [], [], []
for _ in range(args.rounds):
    cpp += m._time_cpp_score(ids, args.reps)
    for _ in range(args.reps):
        t0 = time.perf_counter()
        m.score(ids)
        py_list.append(time.perf_counter() - t0)
    for _ in range(args.reps):
        t0 = time.perf_counter()
        m.score(ids_np)
        py_np.append(time.perf_counter() - t0)

c, pl, pn = (statistics.median(x) for x in (cpp, py_list, py_np))
print(f"model {args.model} ({m.info['architecture']}, n_embd {m.n_embd}), {args.threads} threads, "
      f"{args.tokens}-token prompt, {args.rounds} rounds x {args.reps} calls per variant")
print(f"score, C++ API (RunBatch of 1):  median {c * 1e3:8.3f} ms")
print(f"score, Python, list of ints:     median {pl * 1e3:8.3f} ms  overhead {100 * (pl / c - 1):+.2f}% "
      f"({(pl - c) * 1e6:+.1f} us)")
print(f"score, Python, int32 ndarray:    median {pn * 1e3:8.3f} ms  overhead {100 * (pn / c - 1):+.2f}% "
      f"({(pn - c) * 1e6:+.1f} us)")

texts = [f"document {i}: mixture-of-experts layers route each token to a few experts" for i in range(args.texts)]
m.embed(texts[:50])  # warm-up
walls, engine, call = [], [], []
for _ in range(5):
    t0 = time.perf_counter()
    E = m.embed(texts)
    walls.append(time.perf_counter() - t0)
    st = m.stats
    engine.append(st.seconds)
    call.append(st.wall_seconds)
assert E.shape == (args.texts, m.n_embd) and E.dtype == np.float32
w, e, cw = (statistics.median(x) for x in (walls, engine, call))
print(f"embed {args.texts} texts -> one {E.dtype} array {E.shape}: median {w * 1e3:.1f} ms in Python, "
      f"{cw * 1e3:.1f} ms in the C++ call (tokenizing + RunBatch), {e * 1e3:.1f} ms in the engine's passes "
      f"({st.passes} passes, {st.tokens} tokens); Python-side {100 * (w / cw - 1):+.2f}% over the C++ call")
