#!/usr/bin/env python3
"""estream eval against llama.cpp's llama-perplexity on the same model and task files.

    scripts/eval_vs_llamacpp.py --llama-perplexity PATH/llama-perplexity -m MODEL.gguf \
        [--estream build/tools/estream/estream] [--text FILE ...] [--dir DIR] [-t 2] [--kv f32]

Writes three task files into DIR (default: a temporary folder) made from sentences of the text
files (default: README.md and docs/GUIDE.md): hellaswag (6 lines per task), winogrande (CSV with a
header) and multiple-choice (llama.cpp's binary format). Runs `estream eval --json` and
`llama-perplexity --hellaswag / --winogrande / --multiple-choice` on each and compares, task by
task: which tasks each got right (from llama-perplexity's running accuracy), and for winogrande
the two candidates' scores, which llama-perplexity prints with 6 decimals. `--kv f32` gives
llama.cpp an fp32 KV cache (its default, f16, rounds K and V); `--kv both` also runs it with f16
and compares its two runs, which shows how far rounding alone moves the scores of that model.
Then `estream perplexity --llama-cpp` against llama-perplexity's final estimate on the first text
file (windows of 128 tokens). Exit status 0 when every task's verdict agrees. Not a CI test: CI
has no llama.cpp build.
"""
import argparse
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = {'hellaswag': ('hs.txt', 60), 'winogrande': ('wg.csv', 60), 'multiple-choice': ('mc.bin', 40)}


def sentences(paths):
    text = ''.join(open(p, encoding='utf-8').read() for p in paths)
    text = re.sub(r'[`*|#\[\]()<>_]', ' ', text)
    out = [' '.join(s.split()) for s in re.split(r'(?<=[.!?])\s+', text)]
    return [s for s in out if 20 <= len(s) <= 160 and ',' not in s and '"' not in s]


def write_tasks(d, sents, seed=7):
    rng = random.Random(seed)
    words = sorted({w for s in sents for w in s.split() if w.isalpha() and 3 <= len(w) <= 9})
    with open(os.path.join(d, 'hs.txt'), 'w') as f:
        for _ in range(TASKS['hellaswag'][1]):
            f.write(rng.choice(sents) + '\n' + str(rng.randrange(4)) + '\n' + '\n'.join(rng.sample(sents, 4)) + '\n')
    with open(os.path.join(d, 'wg.csv'), 'w') as f:
        f.write('index,sentence,option1,option2,answer\n')
        n = 0
        short = ['it', 'we', 'he', 'so', 'no', 'up', 'on', 'at']
        for s in sents:
            ws = s.split()
            cand = [i for i, w in enumerate(ws) if w.isalpha() and len(w) >= 4][1:]
            if n % 4 == 3:  # a short tail: the choice words themselves are scored
                ws, cand = ws[:-1] + [rng.choice(short), '.'], [len(ws) - 1]
            if not cand:
                continue
            i = rng.choice(cand)
            o1, o2 = ws[i], rng.choice([w for w in (short if n % 4 == 3 else words) if w != ws[i]])
            if rng.random() < 0.5:
                o1, o2 = o2, o1
            answer = 1 if ws[i] == o1 else 2
            ws[i] = '_'
            f.write('%d,"%s",%s,%s,%d\n' % (n, ' '.join(ws), o1, o2, answer))
            n += 1
            if n == TASKS['winogrande'][1] + 1:  # llama-perplexity never scores the last line
                break

    def string(s):
        b = s.encode()
        return struct.pack('<I', len(b)) + b
    tasks = []
    for _ in range(TASKS['multiple-choice'][1]):
        n = rng.randint(2, 5)
        labels = [0] * n
        labels[rng.randrange(n)] = 1
        answers = struct.pack('<I', n) + b''.join(string(a) for a in rng.sample(sents, n)) + struct.pack('<%di' % n, *labels)
        tasks.append(string(rng.choice(sents)) + answers + answers)
    pos, off = [], 4 + 4 * len(tasks)
    for t in tasks:
        pos.append(off)
        off += len(t)
    with open(os.path.join(d, 'mc.bin'), 'wb') as f:
        f.write(struct.pack('<I', len(tasks)) + struct.pack('<%dI' % len(tasks), *pos) + b''.join(tasks))


WG_ROW = re.compile(r'^(\d+)\t([\d.]+)\t\s*(-?[\d.]+)\s+(-?[\d.]+)\s+(\d)\s+(\d)$', re.M)
ACC_ROW = re.compile(r'^(\d+)\t([\d.]+)$', re.M)


def llama_rows(args, kind, path, n, kv):
    flag = {'hellaswag': '--hellaswag', 'winogrande': '--winogrande', 'multiple-choice': '--multiple-choice'}[kind]
    r = subprocess.run([args.llama_perplexity, '-m', args.model, '-f', path, flag, flag + '-tasks', str(n),
                        '-t', str(args.threads), '-c', '2048', '-b', '2048', '-ctk', kv, '-ctv', kv],
                       capture_output=True, text=True)
    out = r.stdout + r.stderr
    rows = WG_ROW.findall(out) if kind == 'winogrande' else ACC_ROW.findall(out)
    if not rows:
        sys.exit('llama-perplexity %s printed no task lines:\n%s' % (flag, out[-2000:]))
    acc = [float(x[1]) for x in rows]
    right = [round(a * (i + 1) / 100) - (round(acc[i - 1] * i / 100) if i else 0) for i, a in enumerate(acc)]
    return rows, right, acc[-1]


def score_gaps(rows_a, scores_b):
    gaps = sorted(max(abs(float(r[2]) - s[0]), abs(float(r[3]) - s[1])) for r, s in zip(rows_a, scores_b))
    return gaps[len(gaps) // 2], gaps[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--llama-perplexity', required=True)
    ap.add_argument('-m', '--model', required=True)
    ap.add_argument('--estream', default=os.path.join(ROOT, 'build/tools/estream/estream'))
    ap.add_argument('--text', nargs='+', default=[os.path.join(ROOT, 'README.md'), os.path.join(ROOT, 'docs/GUIDE.md')])
    ap.add_argument('--dir', default=None)
    ap.add_argument('-t', '--threads', type=int, default=2)
    ap.add_argument('--kv', choices=['f32', 'f16', 'both'], default='f32')
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix='eval_vs_llamacpp_')
    os.makedirs(d, exist_ok=True)
    write_tasks(d, sentences(args.text))
    agree = True
    for kind, (name, n) in TASKS.items():
        path = os.path.join(d, name)
        es = json.loads(subprocess.run([args.estream, 'eval', '--task', kind, '-m', args.model, path, '--json',
                                        '-t', str(args.threads)], capture_output=True, text=True, check=True).stdout)
        kv = 'f16' if args.kv == 'f16' else 'f32'
        rows, right, acc = llama_rows(args, kind, path, n, kv)
        es_right = [1 if it['correct'] else 0 for it in es['items']]
        differ = [i for i, (a, b) in enumerate(zip(es_right, right)) if a != b]
        agree &= not differ and len(es_right) == len(right)
        line = '%-16s tasks %d / %d, accuracy %.4f%% / %.4f%% (estream / llama.cpp), verdicts differ at %s' % (
            kind, len(es_right), len(right), es['accuracy'], acc, differ)
        if kind == 'winogrande':
            line += '; score gaps median %.1e, largest %.1e' % score_gaps(rows, [it['scores'] for it in es['items']])
        print(line)
        if args.kv == 'both':
            rows16, right16, acc16 = llama_rows(args, kind, path, n, 'f16')
            line = '%-16s llama.cpp f16 KV against f32 KV: accuracy %.4f%%, verdicts differ at %s' % (
                '', acc16, [i for i, (a, b) in enumerate(zip(right, right16)) if a != b])
            if kind == 'winogrande':
                line += '; score gaps median %.1e, largest %.1e' % score_gaps(rows16, [(float(r[2]), float(r[3]))
                                                                                        for r in rows])
            print(line)
    # Perplexity by llama-perplexity's rule (estream perplexity --llama-cpp) on the first text file.
    es = json.loads(subprocess.run([args.estream, 'perplexity', '-m', args.model, '-f', args.text[0], '--ctx', '128',
                                    '--llama-cpp', '--json', '-t', str(args.threads)],
                                   capture_output=True, text=True, check=True).stdout)
    r = subprocess.run([args.llama_perplexity, '-m', args.model, '-f', args.text[0], '-c', '128', '-b', '128',
                        '-t', str(args.threads), '-ctk', 'f32', '-ctv', 'f32'], capture_output=True, text=True)
    m = re.search(r'Final estimate: PPL = ([\d.]+)', r.stdout + r.stderr)
    print('%-16s %s, ctx 128: %.4f / %s (estream --llama-cpp / llama.cpp)' % (
        'perplexity', os.path.basename(args.text[0]), es['perplexity'], m.group(1) if m else 'none'))
    print('task files in', d)
    return 0 if agree else 1


if __name__ == '__main__':
    sys.exit(main())
