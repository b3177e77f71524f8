#!/usr/bin/env python3
"""Stands in for llama-bench in tests of scripts/speed_vs_llamacpp.py: checks the options that
script passes and prints what `llama-bench -o json` prints for a prompt-only test (the fields the
script reads), R samples of made-up tokens/s."""
import argparse
import json
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument('-m', required=True)
ap.add_argument('-p', type=int, required=True)
ap.add_argument('-n', type=int, required=True)
ap.add_argument('-t', type=int, required=True)
ap.add_argument('-r', type=int, required=True)
ap.add_argument('-o', required=True)
ap.add_argument('-fa', type=int)
args = ap.parse_args()
if not os.path.isfile(args.m) or args.n != 0 or args.o != 'json':
    sys.exit('fake llama-bench: expected an existing model, -n 0 and -o json')
print(json.dumps([{'n_prompt': args.p, 'n_gen': 0, 'n_threads': args.t,
                   'samples_ts': [100.0 + i for i in range(args.r)]}], indent=1))
