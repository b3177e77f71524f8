#!/usr/bin/env python3
"""ctest speed_vs_llamacpp_script: scripts/speed_vs_llamacpp.py on the tiny shared model against
the stand-in llama-bench (fake_llama_bench.py, which prints runs of 100, 101, ... tok/s).

    speed_vs_llamacpp_test.py ESTREAM_BINARY MODEL.gguf TOKENS_FILE

Checks the JSON (holds in alternating order, every sample taken, the estream warm-up dropped, the
ratios from the medians), the progress lines (each hold's medians and ratio as it ends) and that
a failing llama-bench stops the script with one line naming it."""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, '..', '..', 'scripts', 'speed_vs_llamacpp.py')
FAKE = os.path.join(HERE, 'fake_llama_bench.py')


def run(llama_bench, extra=()):
    cmd = [sys.executable, SCRIPT, '--llama-bench', llama_bench, '--llama-args', '-fa 1', '--estream', sys.argv[1],
           '-m', sys.argv[2], '--tokens', sys.argv[3], '-p', '12', '-t', '1', '--holds', '3', '--reps', '2', *extra]
    return subprocess.run(cmd, capture_output=True, text=True)


def check(cond, what):
    if not cond:
        sys.exit(f'FAIL: {what}')


r = run(FAKE, ['--json'])
check(r.returncode == 0, f'exit status {r.returncode}: {r.stderr.strip()}')
d = json.loads(r.stdout)
check([h['order'] for h in d['holds']] == [['llama', 'estream'], ['estream', 'llama'], ['llama', 'estream']],
      'holds alternate the order')
check(all(h['llama'] == [100.0, 101.0] for h in d['holds']), 'every llama-bench sample kept')
check(all(len(h['estream']) == 2 and min(h['estream']) > 0 for h in d['holds']), 'estream: reps samples, warm-up dropped')
for h in d['holds']:
    check(abs(h['ratio'] - statistics.median(h['estream']) / 100.5) < 1e-9, 'hold ratio = ratio of the medians')
pooled = statistics.median([x for h in d['holds'] for x in h['estream']])
check(d['llama_median_ts'] == 100.5 and abs(d['ratio_pooled'] - pooled / 100.5) < 1e-9, 'pooled ratio')
check(r.stderr.count('hold ') == 9, 'progress: one stderr line per hold and engine, and one per finished hold')
for i, h in enumerate(d['holds']):
    line = (f'hold {i + 1} of 3: llama-bench 100.5 tok/s, estream {statistics.median(h["estream"]):.1f} tok/s: '
            f'{h["ratio"]:.2f}x')
    check(line in r.stderr, f'progress: hold {i + 1}\'s medians and ratio as it ends')

text = run(FAKE)
check(text.returncode == 0 and 'pooled: llama-bench 100.5 tok/s' in text.stdout, 'text output')

bad = run('/bin/false')
lines = bad.stderr.strip().splitlines()
check(bad.returncode != 0 and lines and lines[-1].startswith('speed_vs_llamacpp: /bin/false ') and
      'exited with status 1' in lines[-1], f'a failing llama-bench named in one line: {bad.stderr!r}')
not_estream = run(FAKE, ['--estream', '/bin/true'])
lines = not_estream.stderr.strip().splitlines()
check(not_estream.returncode != 0 and lines and lines[-1].startswith('speed_vs_llamacpp: /bin/true prefill') and
      'did not print JSON' in lines[-1], f'an estream that prints nothing named in one line: {not_estream.stderr!r}')
print('speed_vs_llamacpp_test: OK')
