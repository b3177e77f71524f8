#!/usr/bin/env python3
"""Throughput through HAProxy with 2 servers against one server directly (docs/PERFORMANCE.md).

  flock -x /tmp/estream-cpu.lock python3 tests/haproxy/bench_haproxy.py MODEL [--reps 5] [--requests 48]
      [--clients 8] [--tokens 128] [--estream E] [--serve-load B] [--threads 2] [--vocab V]
      [--serve-args "FLAGS"]

Starts, once: server A (`estream serve -t THREADS`, all cores), servers B1 and B2 (`-t THREADS/2`
each) behind HAProxy running deploy/haproxy.cfg (ports substituted, as in haproxy_load_test.py),
and server A again behind its own HAProxy (same config, its two `server` lines both pointing at A:
HAProxy's own cost). Then, REPS times in turn: bench/serve_load against A directly, against A
through HAProxy, and against HAProxy with B1 + B2 (C clients, keep-alive connections, REQUESTS
requests of T random token ids each: POST /v1/completions with echo and logprobs 1). Idle servers
use no CPU (OMP_WAIT_POLICY=PASSIVE). Prints each run and the medians.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import haproxy_load_test as t  # noqa: E402


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=0, help="serve_load --vocab (its default: 50304)")
    ap.add_argument("--estream", default=os.path.join(root, "build/tools/estream/estream"))
    ap.add_argument("--serve-load", default=os.path.join(root, "build/bench/serve_load"))
    ap.add_argument("--haproxy", default="haproxy")
    ap.add_argument("--serve-args", default="", help="more `estream serve` flags for every server")
    a = ap.parse_args()
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    D = tempfile.mkdtemp(prefix="estream-haproxy-bench.")
    try:
        pa, pb1, pb2, f1, s1, f2, s2 = t.free_ports(7)
        extra = a.serve_args.split()

        def serve(name, port, threads):
            return t.spawn([a.estream, "serve", "-m", a.model, "--port", str(port), "-t", str(threads)] + extra,
                           "%s/%s.log" % (D, name))
        serve("A", pa, a.threads)
        serve("B1", pb1, max(1, a.threads // 2))
        serve("B2", pb2, max(1, a.threads // 2))
        for port in (pa, pb1, pb2):
            t.wait_until(300, "a server on :%d to load" % port, lambda: t.http_get(port, "/health")[0] == 200, 0.2)
        cfg = os.path.join(root, "deploy", "haproxy.cfg")
        for name, front, stats, backends in (("two", f1, s1, (pb1, pb2)), ("one", f2, s2, (pa, pa))):
            d = "%s/%s" % (D, name)
            os.mkdir(d)
            with open(d + "/haproxy.cfg", "w") as f:
                f.write(t.haproxy_config(cfg, front, stats, backends, d))
            t.spawn([a.haproxy, "-db", "-f", d + "/haproxy.cfg"], d + "/haproxy.log")
            t.wait_until(30, "HAProxy (%s) to show its servers UP" % name,
                         lambda: [r["status"] for r in t.haproxy_stats(stats).values()] == ["UP", "UP"])
        variants = [("one server (-t %d), directly" % a.threads, pa),
                    ("one server (-t %d), through HAProxy" % a.threads, f2),
                    ("two servers (-t %d each), through HAProxy" % max(1, a.threads // 2), f1)]
        results = {v: [] for v, _ in variants}
        for rep in range(a.reps):
            for v, port in variants:
                out = subprocess.run([a.serve_load, "--port", str(port), "--clients", str(a.clients), "--tokens",
                                      str(a.tokens), "--requests", str(a.requests)] +
                                     (["--vocab", str(a.vocab)] if a.vocab else []),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
                text = out.stdout.decode()
                if out.returncode != 0:
                    raise t.Failure("serve_load exited %d: %s" % (out.returncode, text[-1000:]))
                rows = [l for l in text.splitlines() if l and l[0].isdigit()]
                if not rows:
                    raise t.Failure("no result from serve_load: " + text)
                results[v].append(rows[-1])
                print("rep %d | %s | %s" % (rep, v, rows[-1]), flush=True)
        print("serve_load columns: " + [l for l in text.splitlines() if l and not l[0].isdigit()][-1])
        for v, rows in results.items():
            cols = [r.split(",") for r in rows]
            print("median | %s | %s" % (v, ",".join(
                "%.4g" % statistics.median(float(c[i]) for c in cols) for i in range(len(cols[0])))))
        for name in ("A", "B1", "B2"):
            print(name + ": " + open("%s/%s.log" % (D, name)).read().strip().splitlines()[-1])
    finally:
        t.stop_all()
        subprocess.run(["rm", "-rf", D])


if __name__ == "__main__":
    try:
        main()
    except t.Failure as e:
        sys.exit("bench: FAILED: %s" % e)
