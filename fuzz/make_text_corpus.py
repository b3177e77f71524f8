#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/text_fuzz.cc into fuzz/text_corpus/ (the committed seeds were
made with it): one valid input per parser, prefixed with the two bytes that select the parser
and the vocabulary (see text_fuzz.cc). usage: fuzz/make_text_corpus.py [OUT_DIR]"""
import json
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "text_corpus")
os.makedirs(out, exist_ok=True)


def op_tokenizer(flags):  # flags: 1 add_special, 2 parse_special, 4 ids modulo the vocabulary, 8 render_special
    return 0 + 6 * flags


def op_route(route):  # 0 completions, 1 embeddings, 2 classify, 3 rerank, 4 tokenize, 5 detokenize
    return 1 + 6 * route


OP_SCORE = 2


def op_eval(kind, n_tasks=0):  # kind 0 hellaswag, 1 winogrande, 2 multiple-choice
    return 3 + 6 * (kind + 4 * n_tasks)


def op_merge(with_input, shard_by_id=False):  # the input split at form feeds: shard a, shard b, input
    return 5 + 6 * (int(with_input) + 2 * int(shard_by_id))


def mc_file(tasks):
    """llama.cpp's multiple-choice binary: u32 n, u32 offsets[n], then per task a question and two
    answer sets (u32 n, n strings, n int32 labels); strings are u32 length + bytes."""
    def s(t):
        b = t.encode()
        return struct.pack("<I", len(b)) + b
    bodies = []
    for q, answers in tasks:
        body = s(q)
        for _ in range(2):  # mc1 and mc2
            body += struct.pack("<I", len(answers)) + b"".join(s(a) for a, _ in answers)
            body += b"".join(struct.pack("<i", l) for _, l in answers)
        bodies.append(body)
    head = 4 + 4 * len(tasks)
    offsets, pos = [], head
    for b in bodies:
        offsets.append(pos)
        pos += len(b)
    return struct.pack("<I", len(tasks)) + b"".join(struct.pack("<I", o) for o in offsets) + b"".join(bodies)


J = lambda o: json.dumps(o, ensure_ascii=False).encode()
seeds = {
    "tok_text": (op_tokenizer(0), 0, "Hello world, it's 2026! 12345 naïve café 你好 🙂\n\tend".encode()),
    "tok_special": (op_tokenizer(3), 1, b"<|endoftext|>The cat<|endoftext|>"),
    "tok_ids": (op_tokenizer(12), 2, bytes(range(64))),
    "completions_echo": (op_route(0), 0, J({"prompt": "The capital of France is", "max_tokens": 0, "echo": True, "logprobs": 3})),
    "completions_next": (op_route(0), 1, J({"prompt": ["a b", "c"], "max_tokens": 1, "logprobs": 2, "temperature": 0})),
    "completions_ids": (op_route(0), 0, J({"model": "m", "prompt": [[1, 2, 3], [4, 5]], "echo": True, "logprobs": 0, "max_tokens": 0})),
    "embeddings": (op_route(1), 0, J({"input": ["hello", "world"], "encoding_format": "base64", "pooling": "last"})),
    "embeddings_ids": (op_route(1), 0, J({"input": [1, 2, 3], "encoding_format": "float"})),
    "classify": (op_route(2), 0, J({"prompt": "Review: a great film. Sentiment:", "labels": [" positive", " negative", [5, 6]]})),
    "rerank": (op_route(3), 0, J({"query": "what is a cat", "documents": ["a cat is an animal", {"text": "Paris"}], "top_n": 1, "return_documents": True})),
    "tokenize": (op_route(4), 0, J({"content": "Hello <|endoftext|>", "add_special": True, "parse_special": True, "with_pieces": True})),
    "detokenize": (op_route(5), 0, J({"tokens": [72, 101, 108, 108, 111, 228]})),
    "score_prompt": (OP_SCORE, 0, J({"id": 1, "prompt": "hello there", "continuations": [" a", [1, 2]], "top_k": 3, "prompt_logprobs": True})),
    "score_tokens": (OP_SCORE, 0, J({"id": "x", "tokens": [1, 2, 3], "embedding": "mean"})),
    "hellaswag": (op_eval(0), 0, b"A man sits down. He\n2\nruns away.\nsings loudly.\nopens a book.\nfalls asleep.\n"
                  b"The sun rises and\n0\nthe birds sing.\nit snows.\nthe moon.\nnothing.\n"),
    "winogrande": (op_eval(1, 1), 0, b'0,"The trophy does not fit in the suitcase because _ is too big.",trophy,suitcase,1\n'
                   b"1,The cat chased the dog because _ was angry.,cat,dog,2\n"),
    "merge": (op_merge(True), 0, b'{"id":1,"top":[]}\n{"line":3,"id":1,"error":"duplicate id"}\n\f'
              b'{"id":"b","top":[]}\n\f{"id":1,"prompt":"a"}\n{"id":"b","prompt":"b"}\n{"id":1,"prompt":"c"}\n'),
    "merge_shard_spec": (op_merge(False, True), 0, b'1/2\f{"id":"x","error":"e"}\n'),
    "multiple_choice": (op_eval(2, 1), 0, mc_file([("Which is a fruit?", [("apple", 1), ("stone", 0)]),
                                                   ("2 + 2 =", [("3", 0), ("4", 1), ("5", 0)])])),
}
for name, (op, vocab, payload) in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([op, vocab]) + payload)
print(f"{len(seeds)} seeds in {out}")
