#!/usr/bin/env python3
"""Prefill speed of estream against llama.cpp / ik_llama.cpp's llama-bench on the same GGUF file.

    scripts/speed_vs_llamacpp.py --llama-bench PATH/llama-bench -m MODEL.gguf \
        [--estream build/tools/estream/estream] [-p 1024] [-t 2] [--holds 3] [--reps 6] \
        [--llama-args "-rtr 1 -fa 1 -fmoe 1"] [--tokens FILE] [--json]

Runs the two engines one after the other in `--holds` holds, the order alternating (llama first in
holds 1, 3, ...; estream first in 2, 4, ...), so that a slow or fast stretch of a shared host
falls on both. Per hold: `llama-bench -p N -n 0 -t T -r R -o json` (its own warm-up run first; the
tokens/s of each of its R runs), and `estream prefill --sweep N,...,N --repeat 1 --json` with R + 1
entries (the first dropped as the warm-up; the model loaded once), both with all weights resident
and OMP_WAIT_POLICY=passive unless the environment sets it (e.g. to active: OpenMP's spinning
waits; an unset variable does not give OpenMP's own default here). The prompt for estream is N
tokens of real text (README.md and docs/GUIDE.md, tokenized with the model's vocabulary and
repeated as needed) or the ids of `--tokens FILE`; llama-bench makes its own. Prints each hold's
tokens/s (both engines' samples and medians) and the ratio of the medians, then the ratio of the
pooled medians over every hold; `--json` prints one object instead. Progress (which hold and
engine runs, and each hold's medians and ratio as it ends, so that an interrupted run keeps its
finished holds) goes to stderr. The ratio is estream's tokens/s over llama-bench's. The tests
run it against a stand-in llama-bench (tests/scripts/fake_llama_bench.py, ctest
speed_vs_llamacpp_script); docs/PERFORMANCE.md quotes real runs ("ik_llama.cpp against estream"
and the sessions after it).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(msg):
    sys.exit(f'speed_vs_llamacpp: {msg}')


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ['(no output)']
        fail(f'{shlex.join(cmd)} exited with status {r.returncode}: {tail[0]}')
    return r.stdout


def run_json(cmd, env):
    out = run(cmd, env)
    try:
        return json.loads(out)
    except json.JSONDecodeError as e:
        fail(f'{shlex.join(cmd)} did not print JSON ({e}); is it the program named?')


def prompt_ids(args):
    if args.tokens:
        with open(args.tokens, encoding='utf-8') as f:
            ids = f.read().replace(',', ' ').split()
    else:
        text = ''.join(open(os.path.join(ROOT, p), encoding='utf-8').read() for p in ('README.md', 'docs/GUIDE.md'))
        with tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False, encoding='utf-8') as f:
            f.write(text)
        try:
            ids = run([args.estream, 'tokenize', '-m', args.model, '-f', f.name, '--ids']).split()
        finally:
            os.unlink(f.name)
        if not ids:
            fail(f'{args.estream} tokenize printed no token ids for README.md and docs/GUIDE.md')
    if not ids:
        fail(f'{args.tokens} holds no token ids')
    while len(ids) < args.p:
        ids += ids
    return ids[:args.p]


def llama_hold(args, env):
    cmd = [args.llama_bench, '-m', args.model, '-p', str(args.p), '-n', '0', '-t', str(args.threads), '-r',
           str(args.reps), '-o', 'json'] + shlex.split(args.llama_args)
    rows = run_json(cmd, env)
    rows = rows if isinstance(rows, list) else []
    samples = [x for r in rows if isinstance(r, dict) and r.get('n_prompt') == args.p for x in r.get('samples_ts', [])]
    if not samples:
        fail(f'llama-bench printed no pp{args.p} samples')
    return samples


def estream_hold(args, env, token_file):
    sweep = ','.join([str(args.p)] * (args.reps + 1))
    cmd = [args.estream, 'prefill', '-m', args.model, '--tokens', '@' + token_file, '-t', str(args.threads),
           '--sweep', sweep, '--repeat', '1', '--json']
    out = run_json(cmd, env)
    try:
        return [e['tokens_per_second'] for e in out['sweep'][1:]]
    except (KeyError, TypeError):
        fail(f'{shlex.join(cmd)} printed JSON without sweep[].tokens_per_second; is it an estream binary?')


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--llama-bench', required=True, help='llama-bench binary of llama.cpp or ik_llama.cpp')
    ap.add_argument('-m', '--model', required=True, help='GGUF model file (both engines read it)')
    ap.add_argument('--estream', default=os.path.join(ROOT, 'build/tools/estream/estream'),
                    help='estream binary (default: build/tools/estream/estream of this checkout)')
    ap.add_argument('-p', type=int, default=1024, help='prompt length in tokens (default 1024)')
    ap.add_argument('-t', '--threads', type=int, default=os.cpu_count(), help='threads of both engines')
    ap.add_argument('--holds', type=int, default=3, help='holds, the order alternating (default 3)')
    ap.add_argument('--reps', type=int, default=6, help='timed runs of each engine per hold (default 6)')
    ap.add_argument('--llama-args', default='-rtr 1 -fa 1 -fmoe 1',
                    help='more llama-bench options (default: ik_llama.cpp\'s run-time repacking, flash '
                    'attention, fused MoE; give "" for mainline llama.cpp, which lacks -rtr and -fmoe)')
    ap.add_argument('--tokens', help='file of prompt token ids for estream (default: real text, see above)')
    ap.add_argument('--json', action='store_true', help='print one JSON object')
    args = ap.parse_args()
    for path, what in ((args.llama_bench, '--llama-bench'), (args.estream, '--estream')):
        if not os.access(path, os.X_OK):
            fail(f'{what} {path} is not an executable file')
    if not os.path.isfile(args.model):
        fail(f'model {args.model} not found')
    if args.tokens and not os.path.isfile(args.tokens):
        fail(f'--tokens {args.tokens} not found')
    if args.p < 1 or args.holds < 1 or args.reps < 1 or args.threads < 1:
        fail('-p, --holds, --reps and --threads must be at least 1')
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get('OMP_WAIT_POLICY', 'passive'))

    with tempfile.NamedTemporaryFile('w', suffix='.txt', delete=False) as f:
        f.write(' '.join(prompt_ids(args)))
        token_file = f.name
    holds = []
    try:
        for h in range(args.holds):
            order = ('llama', 'estream') if h % 2 == 0 else ('estream', 'llama')
            hold = {'order': list(order), 'start': time.strftime('%H:%M:%S')}
            for engine in order:
                print(f'hold {h + 1} of {args.holds}: {engine} ({time.strftime("%H:%M:%S")})', file=sys.stderr,
                      flush=True)
                hold[engine] = llama_hold(args, env) if engine == 'llama' else estream_hold(args, env, token_file)
            hold['ratio'] = statistics.median(hold['estream']) / statistics.median(hold['llama'])
            holds.append(hold)
            print(f'hold {h + 1} of {args.holds}: llama-bench {statistics.median(hold["llama"]):.1f} tok/s, estream '
                  f'{statistics.median(hold["estream"]):.1f} tok/s: {hold["ratio"]:.2f}x', file=sys.stderr, flush=True)
    finally:
        os.unlink(token_file)

    pooled_llama = [x for h in holds for x in h['llama']]
    pooled_estream = [x for h in holds for x in h['estream']]
    result = {
        'model': args.model, 'n_prompt': args.p, 'threads': args.threads, 'llama_args': args.llama_args,
        'holds': holds, 'llama_median_ts': statistics.median(pooled_llama),
        'estream_median_ts': statistics.median(pooled_estream),
        'ratio_pooled': statistics.median(pooled_estream) / statistics.median(pooled_llama),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    threads = f'{args.threads} thread' + ('s' if args.threads > 1 else '')
    print(f'{os.path.basename(args.model)}, pp{args.p}, {threads}, llama-bench {args.llama_args or "(no options)"}')
    print('hold  order              llama-bench tok/s (median)        estream tok/s (median)            ratio')
    for i, h in enumerate(holds):
        fmt = lambda xs: ' '.join(f'{x:.1f}' for x in xs) + f' ({statistics.median(xs):.1f})'
        print(f'{i + 1:>4}  {" then ".join(h["order"]):<18} {fmt(h["llama"]):<33} {fmt(h["estream"]):<33} '
              f'{h["ratio"]:.2f}x')
    print(f'pooled: llama-bench {result["llama_median_ts"]:.1f} tok/s, estream {result["estream_median_ts"]:.1f} '
          f'tok/s: {result["ratio_pooled"]:.2f}x')


if __name__ == '__main__':
    main()
