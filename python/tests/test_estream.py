"""The Python module on the tiny shared models: every method, equality with the C++ API (through
the CLI's `estream score` and `estream tokenize --json`, which call Engine::RunBatch and the
tokenizer directly), the golden logits, errors and thread safety. Nothing is timed.

Environment (set by ctest, python/CMakeLists.txt): ESTREAM_SHARED_DIR (shared/ with testdata/),
ESTREAM_CLI (the estream binary), PYTHONPATH (build/python).
"""
import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import estream

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("ESTREAM_SHARED_DIR", ROOT.parent / "shared"))
MODELS = SHARED / "testdata" / "models"
CLI = Path(os.environ.get("ESTREAM_CLI", ROOT / "build" / "tools" / "estream" / "estream"))
MODEL = MODELS / "olmoe-tiny-f32.gguf"

if not MODEL.exists():
    pytest.skip(f"no shared test models at {MODELS} (set ESTREAM_SHARED_DIR)", allow_module_level=True)

PROMPT = [int(x) for x in (MODELS / "olmoe-tiny.tokens.txt").read_text().strip().split(",")]
TEXTS = ["The capital of France is Paris.", "Hello, world!", "Mixture-of-experts models route each token."]


@pytest.fixture(scope="module")
def model():
    return estream.Model(str(MODEL), threads=2)


def golden_log_softmax(row):
    logits = np.fromfile(MODELS / "olmoe-tiny-f32.logits.f32", dtype=np.float32).reshape(48, -1)
    z = logits[row].astype(np.float64)
    z -= z.max()
    return z - math.log(np.exp(z).sum())


def run_cli_score(tmp_path, lines):
    """`estream score` on JSONL `lines`; returns its output objects by id."""
    assert CLI.exists(), f"{CLI} not built"
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    if out.exists():
        out.unlink()
    subprocess.run([str(CLI), "score", "-m", str(MODEL), "--input", str(inp), "--output", str(out), "-t", "2",
                    "--no-progress"], check=True, capture_output=True)
    return {o["id"]: o for o in map(json.loads, out.read_text().splitlines())}


# ---- module, model, tokens ------------------------------------------------------------------

def test_version_and_info(model):
    assert estream.__version__ == "0.1.0"
    assert model.n_embd == 256 and model.n_vocab == 512 and model.n_ctx >= 48
    info = model.info
    assert info["architecture"] == "olmoe" and info["n_layer"] == 2 and info["threads"] == 2
    assert info["has_tokenizer"] is True
    assert "olmoe" in repr(model)


def test_every_public_name_has_a_docstring():
    for cls in (estream.Model, estream.Score, estream.Candidate, estream.Stats):
        assert cls.__doc__, cls
        for name in dir(cls):
            if not name.startswith("_"):
                assert getattr(cls, name).__doc__, f"{cls.__name__}.{name} has no docstring"


def test_tokenize_matches_cli(model):
    for text in TEXTS:
        cli = json.loads(subprocess.run([str(CLI), "tokenize", "-m", str(MODEL), "-p", text, "--json"], check=True,
                                        capture_output=True, text=True).stdout)
        assert model.tokenize(text) == cli["ids"]
    assert model.tokenize(TEXTS) == [model.tokenize(t) for t in TEXTS]


def test_detokenize_round_trip(model):
    for text in TEXTS + ["naïve café ☕", ""]:
        ids = model.tokenize(text, add_special=False)
        assert model.detokenize(ids) == text
        assert model.detokenize(np.array(ids, dtype=np.int64)) == text
    ids = [model.tokenize(t, add_special=False) for t in TEXTS]
    assert model.detokenize(ids) == TEXTS
    # A token cutting a multi-byte character decodes with U+FFFD, never raises.
    assert isinstance(model.detokenize([model.tokenize("☕", add_special=False)[0]]), str)


# ---- results equal the C++ API's (the CLI) ----------------------------------------------------

def test_score_and_next_token_match_cli(model, tmp_path):
    inputs = [PROMPT, TEXTS[0], PROMPT[:7], TEXTS[1]]
    lines = []
    for i, x in enumerate(inputs):
        line = {"id": i, "prompt_logprobs": True, "top_k": 5}
        line["tokens" if isinstance(x, list) else "prompt"] = x
        lines.append(line)
    cli = run_cli_score(tmp_path, lines)
    scores = model.score(inputs)
    tops = model.next_token(inputs, top_k=5)
    assert len(scores) == len(inputs) and len(tops) == len(inputs)
    for i, (s, top) in enumerate(zip(scores, tops)):
        ref = cli[i]
        assert "error" not in ref, ref
        assert len(s.tokens) == ref["n_tokens"]
        assert s.logprobs.dtype == np.float32 and s.tokens.dtype == np.int32
        np.testing.assert_array_equal(s.logprobs, np.array(ref["prompt_logprobs"], dtype=np.float32))
        assert s.total == ref["log_likelihood"]
        assert s.perplexity == pytest.approx(math.exp(-s.total / (len(s.tokens) - 1)))
        assert [t[0] for t in top] == [t["token"] for t in ref["top"]]
        assert [t[1] for t in top] == [np.float32(t["logprob"]) for t in ref["top"]]
        assert [t[2] for t in top] == [t["text"] for t in ref["top"]]
    # One input gives one result, equal to its row of the batch.
    one = model.score(PROMPT)
    np.testing.assert_array_equal(one.logprobs, scores[0].logprobs)
    assert model.next_token(TEXTS[0], top_k=5) == tops[1]
    assert model.score(np.array(PROMPT, dtype=np.int32)).total == one.total


def test_score_matches_golden_logits(model):
    s = model.score(PROMPT)
    for t in (0, 20, 46):
        assert s.logprobs[t] == pytest.approx(golden_log_softmax(t)[PROMPT[t + 1]], abs=1e-4)
    top = model.next_token(PROMPT, top_k=3)
    g = golden_log_softmax(47)
    assert top[0][0] == int(np.argmax(g))
    for tok, lp, _ in top:
        assert lp == pytest.approx(g[tok], abs=1e-4)


def test_embed_matches_cli(model, tmp_path):
    inputs = [TEXTS[0], PROMPT[:20], TEXTS[2]]
    for pooling in ("mean", "last"):
        lines = []
        for i, x in enumerate(inputs):
            line = {"id": i, "embedding": pooling}
            line["tokens" if isinstance(x, list) else "prompt"] = x
            lines.append(line)
        cli = run_cli_score(tmp_path, lines)
        E = model.embed(inputs, pooling=pooling)
        assert E.shape == (3, 256) and E.dtype == np.float32 and E.flags["C_CONTIGUOUS"]
        for i in range(3):
            np.testing.assert_array_equal(E[i], np.array(cli[i]["embedding"], dtype=np.float32))
        e1 = model.embed(TEXTS[0], pooling=pooling)
        assert e1.shape == (256,)
        np.testing.assert_array_equal(e1, E[0])
    assert model.embed([]).shape == (0, 256)


def test_classify_and_candidates_match_cli(model, tmp_path):
    labels = [" yes", " no", " maybe not"]
    cli = run_cli_score(tmp_path, [{"id": 0, "prompt": TEXTS[0], "continuations": labels},
                                   {"id": 1, "tokens": PROMPT[:16], "continuations": [PROMPT[16:20], PROMPT[16:18]]}])
    cands = model.score_candidates(TEXTS[0], labels)
    assert len(cands) == 3
    for c, ref in zip(cands, cli[0]["continuations"]):
        np.testing.assert_array_equal(c.logprobs, np.array(ref["logprobs"], dtype=np.float32))
        assert c.total == ref["logprob"] and c.is_greedy == ref["is_greedy"] and len(c.tokens) == ref["n_tokens"]
    cands2 = model.score_candidates(PROMPT[:16], [PROMPT[16:20], PROMPT[16:18]])
    for c, ref in zip(cands2, cli[1]["continuations"]):
        assert c.total == ref["logprob"]
    # Candidates equal the same tokens scored inside the whole prompt (to rounding).
    full = model.score(PROMPT)
    np.testing.assert_allclose(cands2[0].logprobs, full.logprobs[15:19], atol=1e-5)

    p = model.classify(TEXTS[0], labels)
    assert p.shape == (3,) and p.dtype == np.float64
    ll = np.array([c.total for c in cands])
    np.testing.assert_allclose(p, np.exp(ll - ll.max()) / np.exp(ll - ll.max()).sum(), rtol=1e-12)
    assert p.sum() == pytest.approx(1.0)
    P = model.classify([TEXTS[0], TEXTS[1]], labels)
    assert P.shape == (2, 3)
    np.testing.assert_array_equal(P[0], p)


def test_batch_equals_single_calls(model):
    inputs = [TEXTS[0], PROMPT, TEXTS[1], PROMPT[:5]]
    batch = model.score(inputs)
    for x, b in zip(inputs, batch):
        np.testing.assert_array_equal(model.score(x).logprobs, b.logprobs)
    E = model.embed(inputs)
    for x, e in zip(inputs, E):
        np.testing.assert_array_equal(model.embed(x), e)
    # A 2-D integer array is a batch of equal-length token lists; tuples work like lists.
    rows = np.array([PROMPT[:10], PROMPT[10:20]], dtype=np.int64)
    by_rows = model.score(rows)
    assert len(by_rows) == 2
    np.testing.assert_array_equal(by_rows[1].logprobs, model.score(tuple(PROMPT[10:20])).logprobs)
    np.testing.assert_array_equal(model.embed(rows), model.embed([PROMPT[:10], PROMPT[10:20]]))


def test_many_embeddings_one_array(model):
    texts = [f"text number {i} about experts" for i in range(300)]
    E = model.embed(texts)
    assert E.shape == (300, 256) and np.isfinite(E).all()
    np.testing.assert_array_equal(E[123], model.embed(texts[123]))
    assert model.stats.requests == 1  # the last call: the single embed


def test_stats(model):
    model.embed(TEXTS)
    st = model.stats
    assert st.requests == 3 and st.passes >= 1 and st.seconds > 0 and st.wall_seconds >= st.seconds
    assert st.tokens == sum(len(model.tokenize(t)) for t in TEXTS)
    assert st.peak_rss_bytes > 0 and st.bytes_read == 0 and st.streamed is False
    d = st.to_dict()
    for key in ("bubble_seconds", "bubble_rate", "bytes_read", "peak_rss_bytes", "attention_seconds",
                "experts_seconds", "schedule"):
        assert key in d
    assert "Stats(" in repr(st)


# ---- errors ---------------------------------------------------------------------------------

def test_load_errors():
    with pytest.raises(OSError, match="nonexistent"):
        estream.Model("/nonexistent/model.gguf")
    with pytest.raises(OSError):
        estream.Model(str(MODELS / "olmoe-tiny.tokens.txt"))  # not GGUF
    with pytest.raises(ValueError, match="4X"):
        estream.Model(str(MODEL), budget="4X")
    with pytest.raises(ValueError, match="schedule"):
        estream.Model(str(MODEL), schedule="sometimes")
    with pytest.raises(ValueError):
        estream.Model(str(MODEL), threads=-1)
    with pytest.raises(TypeError):
        estream.Model(str(MODEL), budget=[1])


def test_ctrl_c_interrupts_a_long_batch():
    # SIGINT while a batch of thousands of one-pass requests runs (minutes uninterrupted on the tiny
    # model: batch_tokens 16 holds one request per pass): KeyboardInterrupt before the next pass,
    # and the model stays usable with the same results.
    m = estream.Model(MODEL, threads=1, batch_tokens=16)
    want = m.score(PROMPT[:12]).total
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            m.score([PROMPT[:12]] * 50000)
    finally:
        timer.cancel()
    assert m.score(PROMPT[:12]).total == want


def test_path_types(tmp_path):
    # pathlib.Path and bytes are paths, as open() takes them.
    m = estream.Model(MODEL, threads=1)
    assert m.info["path"] == str(MODEL) and repr(str(MODEL)) in repr(m)
    assert estream.Model(os.fsencode(MODEL), threads=1).info["path"] == str(MODEL)
    # A NUL byte would open the file the bytes before it name: refused, as open() refuses it.
    with pytest.raises(ValueError, match="null byte"):
        estream.Model(str(MODEL) + "\0.other.gguf")
    for args in ((None,), ()):  # Model() too: one line, not pybind11's list of signatures
        with pytest.raises(TypeError, match=r"^path: expected a str, bytes or os.PathLike .*NoneType$"):
            estream.Model(*args)
    # A file name that is not UTF-8 (os.fsdecode keeps its bytes as surrogates) loads and reports it.
    link = os.fsdecode(bytes(tmp_path) + b"/model-\xff.gguf")
    os.symlink(MODEL, link)
    m2 = estream.Model(link, threads=1)
    assert m2.info["path"] == link and m2.score(PROMPT).total == m.score(PROMPT).total


def test_bad_inputs_raise_and_model_stays_usable(model):
    before = model.score(PROMPT).logprobs.copy()
    with pytest.raises(ValueError, match="999999"):
        model.score([1, 999999, 2])
    with pytest.raises(ValueError, match="input 1:"):
        model.score([PROMPT, [1, -5]])
    with pytest.raises(ValueError):
        model.score([[]])  # an empty prompt
    with pytest.raises(ValueError):
        model.embed([[1] * (model.n_ctx + 1)])  # longer than the context
    with pytest.raises(ValueError, match="out of range"):
        model.score([1, 2**40])
    with pytest.raises(ValueError, match="top_k"):
        model.next_token(PROMPT, top_k=0)
    with pytest.raises(ValueError, match="pooling"):
        model.embed(PROMPT, pooling="max")
    with pytest.raises(ValueError, match="labels"):
        model.classify(TEXTS[0], [])
    with pytest.raises(ValueError):
        model.classify(TEXTS[0], [" yes", ""])  # a label of no tokens
    with pytest.raises(TypeError):
        model.score(3.5)
    with pytest.raises(TypeError):
        model.score([1.5, 2.5])
    with pytest.raises(TypeError):
        model.classify(TEXTS[0], " yes")
    with pytest.raises(TypeError):
        model.detokenize("text")
    # Flags are bools (ints and NumPy bools too); None is refused, not taken as False.
    for kwargs in ({"add_special": None}, {"parse_special": "yes"}):
        with pytest.raises(TypeError, match=r"^(add|parse)_special: expected a bool, got (NoneType|str)$"):
            model.tokenize(TEXTS[0], **kwargs)
    with pytest.raises(TypeError, match="render_special"):
        model.detokenize([1, 2], render_special=None)
    assert model.tokenize(TEXTS[0], add_special=np.bool_(False)) == model.tokenize(TEXTS[0], add_special=0)
    np.testing.assert_array_equal(model.score(PROMPT).logprobs, before)
    assert model.score([]) == []


def test_bytes_are_not_token_ids(model):
    # bytes are sequences of ints to Python; taken as ids, b"hello" would score [104, 101, ...].
    for x in (b"hello", bytearray(b"hello"), memoryview(b"hello")):
        with pytest.raises(TypeError, match="decode"):
            model.score(x)
        with pytest.raises(TypeError, match="decode"):
            model.classify("a", [x])
        with pytest.raises(TypeError, match="decode"):
            model.tokenize(x)
        with pytest.raises(TypeError):
            model.classify("a", x)
    with pytest.raises(TypeError, match=r"score\[1\]"):
        model.score(["text", b"bytes"])
    with pytest.raises(TypeError):
        model.next_token(b"hi")
    with pytest.raises(TypeError):
        model.embed([b"hi"])
    with pytest.raises(TypeError):
        model.score_candidates(b"hi", [" yes"])
    with pytest.raises(TypeError):
        model.detokenize(b"")


def test_lone_surrogates_raise_unicode_error(model):
    # No UTF-8 exists for them: UnicodeEncodeError (a ValueError) naming the argument.
    with pytest.raises(UnicodeEncodeError, match="score"):
        model.score("x\ud800")
    with pytest.raises(UnicodeEncodeError, match="tokenize"):
        model.tokenize("\udcff")
    with pytest.raises(ValueError, match=r"tokenize\[1\]"):
        model.tokenize(["ok", "\udcff"])
    with pytest.raises(ValueError, match=r"labels\[0\]"):
        model.classify("a", ["\ud800"])
    with pytest.raises(ValueError, match="budget"):
        estream.Model(str(MODEL), budget="4\ud800G")
    assert model.tokenize("x") == model.tokenize("x")  # still usable


def test_option_ranges():
    for bad in (2**64, 2**70, -1):
        with pytest.raises(ValueError, match="budget"):
            estream.Model(str(MODEL), budget=bad)
    with pytest.raises(ValueError, match="1024"):
        estream.Model(str(MODEL), threads=3000)
    with pytest.raises(ValueError, match="threads"):
        estream.Model(str(MODEL), threads=2**40)
    with pytest.raises(ValueError, match="batch_tokens"):
        estream.Model(str(MODEL), batch_tokens=2**63)
    with pytest.raises(ValueError, match="budget_tokens"):
        estream.Model(str(MODEL), budget_tokens=-1)
    with pytest.raises(TypeError, match="threads"):
        estream.Model(str(MODEL), threads="2")
    with pytest.raises(TypeError, match="threads"):
        estream.Model(str(MODEL), threads=True)
    assert estream.Model(str(MODEL), threads=np.int64(1)).info["threads"] == 1
    # A size string is read as the CLI's --budget reads it: "0x100M", "1e9", " 4G", "0.4" and a NUL
    # (the C side stopped there) each gave some budget, or none, without a word.
    for bad in ("0x100M", "1e9", " 4G", "0.4", "4G\0junk"):
        with pytest.raises(ValueError, match="size"):
            estream.Model(str(MODEL), budget=bad)
    with pytest.raises(TypeError, match=r"^schedule: expected a str .*NoneType$"):
        estream.Model(str(MODEL), schedule=None)


def test_call_options_wrong_type_or_range(model):
    # One line naming the option (pybind11's own message lists every overload on many lines).
    for bad in (None, 2.5, True, "5"):
        with pytest.raises(TypeError, match=r"^top_k: expected an int, got \w+$"):
            model.next_token(PROMPT, top_k=bad)
    for bad in (0, model.n_vocab + 1, 10**30):
        with pytest.raises(ValueError, match=r"^top_k = \d+ must be between 1 and 512"):
            model.next_token(PROMPT, top_k=bad)
    assert len(model.next_token(PROMPT, top_k=np.int64(3))) == 3
    assert len(model.next_token(PROMPT, top_k=model.n_vocab)) == model.n_vocab
    with pytest.raises(TypeError, match=r"^pooling: expected a str .*NoneType$"):
        model.embed(PROMPT, pooling=None)
    # An empty array is checked for its dtype as a non-empty one is.
    with pytest.raises(TypeError, match="dtype float64"):
        model.detokenize(np.array([], dtype=np.float64))
    assert model.detokenize(np.array([], dtype=np.int32)) == ""


def test_token_id_errors(model):
    for bad in ([-5], [1, 512], [[1, 2], [600]]):
        with pytest.raises(ValueError, match="out of range"):
            model.detokenize(bad)
    with pytest.raises(ValueError, match=r"detokenize\[1\]: token id 600 at position 0"):
        model.detokenize([[1, 2], [600]])
    with pytest.raises(ValueError, match="18446744073709551615"):
        model.score(np.array([1, 2**64 - 1], dtype=np.uint64))
    with pytest.raises(ValueError, match="18446744073709551615"):
        model.score([1, np.uint64(2**64 - 1)])
    with pytest.raises(ValueError, match="-2147483649"):
        model.score(np.array([1, -2**31 - 1], dtype=np.int64))


def test_request_longer_than_a_pass_is_an_input_error():
    m = estream.Model(str(MODEL), batch_tokens=4, threads=1)
    with pytest.raises(ValueError, match=r"raise batch_tokens \(--batch-tokens\)") as e:
        m.score("hello world")
    assert not isinstance(e.value, MemoryError)
    assert len(m.score(PROMPT[:4]).tokens) == 4


def test_budget_load_ignores_memory_freed_before(tmp_path):
    # The load's own peak counts, not the process's peak from memory used and freed earlier. In a
    # fresh process (this one's RSS holds the other tests' models), as a script would run it.
    packed = tmp_path / "olmoe.packed.gguf"
    subprocess.run([str(CLI), "pack", str(MODEL), "-o", str(packed), "-q", "-t", "1"], check=True,
                   capture_output=True)
    script = f"""
import estream, numpy as np
P, kw = {str(packed)!r}, dict(threads=1, budget="150M", budget_tokens=300)
ref = estream.Model(P, **kw).score({PROMPT!r}).logprobs
a = np.ones(200 * 2**20 // 8)  # 200 MiB touched, then freed: the process's peak is above 150M
del a
assert (estream.Model(P, **kw).score({PROMPT!r}).logprobs == ref).all()
try:
    estream.Model(P, threads=1, budget="20M", budget_tokens=300)
except MemoryError as e:
    print(e)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "memory budget 20.0 MiB is too small" in r.stdout, r.stdout


def test_budget_that_prefill_runs_with_loads(tmp_path):
    # A budget too small for the default 4096-token pass beside the arena, which `estream prefill`
    # (planning for the prompt's length) runs with, loads here too: the library chooses a shorter
    # pass (info["pass_tokens"]); only a budget too small for 128 tokens fails, naming budget_tokens.
    # In a fresh process (this one's RSS holds the other tests' models); the budget comes from that
    # process's own figures.
    packed = tmp_path / "olmoe.packed.gguf"
    subprocess.run([str(CLI), "pack", str(MODEL), "-o", str(packed), "-q", "-t", "1"], check=True,
                   capture_output=True)
    script = f"""
import json, re, estream
P = {str(packed)!r}
def need(tokens):
    try:
        estream.Model(P, threads=1, budget=1, budget_tokens=tokens)
    except MemoryError as e:
        return float(re.search(r"need at least ([0-9.]+) MiB", str(e)).group(1))
need_long, need_short = need(4096), need(128)
assert need_long > need_short + 16, (need_long, need_short)
budget = int((need_long + need_short) / 2 * 2**20)
try:
    estream.Model(P, threads=2, budget=budget, budget_tokens=4096)
    raise AssertionError("a 4096-token pass fits: the budget does not test the fallback")
except MemoryError as e:
    assert "budget_tokens" in str(e), e
m = estream.Model(P, threads=2, budget=budget)
s = m.score({PROMPT!r})
streamed = m.stats.streamed
try:
    m.score([1] * (m.info["pass_tokens"] + 1))
    raise AssertionError("a request longer than the pass ran")
except ValueError as e:
    assert "raise budget_tokens" in str(e), e
try:
    estream.Model(P, threads=2, budget=int((need_short - 4) * 2**20))
    raise AssertionError("a budget below a 128-token pass loaded")
except MemoryError as e:
    assert "budget_tokens" in str(e), e
print(json.dumps(dict(budget=budget, pass_tokens=m.info["pass_tokens"], streamed=streamed,
                      logprobs=s.logprobs.tolist())))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert 128 <= got["pass_tokens"] < 4096 and got["streamed"], got
    # The CLI's prefill runs with the same budget, and the values are its own.
    ids = ",".join(map(str, PROMPT))
    cli = subprocess.run([str(CLI), "prefill", "-m", str(packed), "--tokens", ids, "--budget", str(got["budget"]),
                          "-t", "2", "--logprobs", "--json"], check=True, capture_output=True, text=True)
    assert json.loads(cli.stdout)["logprobs"] == pytest.approx(got["logprobs"], abs=0)


def test_close_and_context_manager():
    with estream.Model(MODEL, threads=1) as m:
        assert not m.closed
        total = m.score(PROMPT).total
    assert m.closed and "closed" in repr(m)
    for call in (lambda: m.score(PROMPT), lambda: m.embed("text"), lambda: m.tokenize("text"),
                 lambda: m.detokenize([1]), lambda: m.next_token(PROMPT), lambda: m.info, lambda: m.n_embd,
                 lambda: m.classify("a", [" b"]), lambda: m.score_candidates("a", [" b"])):
        with pytest.raises(ValueError, match="closed"):
            call()
    assert m.stats.requests == 1  # the last call's figures stay readable
    m.close()  # again: nothing to do
    assert estream.Model(MODEL, threads=1).score(PROMPT).total == total


def test_results_pickle_and_copy(model):
    # Results are plain values: they pickle (multiprocessing workers return them) and copy.
    import copy
    import pickle
    s = model.score(PROMPT)
    c = model.score_candidates(PROMPT[:5], [PROMPT[5:8]])[0]
    st = model.stats
    for f in (lambda x: pickle.loads(pickle.dumps(x)), copy.copy, copy.deepcopy):
        s2, c2, st2 = f(s), f(c), f(st)
        np.testing.assert_array_equal(s2.tokens, s.tokens)
        np.testing.assert_array_equal(s2.logprobs, s.logprobs)
        assert s2.logprobs.dtype == np.float32 and s2.tokens.dtype == np.int32
        assert (s2.total, s2.perplexity) == (s.total, s.perplexity)
        np.testing.assert_array_equal(c2.logprobs, c.logprobs)
        assert (c2.total, c2.is_greedy) == (c.total, c.is_greedy)
        assert st2.to_dict() == st.to_dict()
    with pytest.raises(ValueError, match="Score.__setstate__"):
        estream.Score.__new__(estream.Score).__setstate__((1, 2))


def test_uninitialised_model_raises_instead_of_crashing():
    # Model.__new__ without __init__ leaves no C++ object: each method said so, not a segfault.
    m = estream.Model.__new__(estream.Model)
    assert "not initialised" in repr(m)
    for call in (lambda: m.score(PROMPT), lambda: m.tokenize("a"), lambda: m.info, lambda: m.n_embd,
                 lambda: m.stats, lambda: m.close(), lambda: m.closed):
        with pytest.raises(TypeError, match="never initialised"):
            call()
    with pytest.raises(TypeError, match="expected an estream.Model as self, got int"):
        estream.Model.score(5, PROMPT)

    class Sub(estream.Model):  # a subclass that initialises its base works as the base
        def __init__(self, path):
            super().__init__(path, threads=1)

    assert Sub(MODEL).score(PROMPT).total == estream.Model(MODEL, threads=1).score(PROMPT).total


def test_model_cannot_be_pickled_or_copied(model):
    import copy
    import pickle
    for f in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be pickled or copied.*estream.Model\\(path"):
            f(model)


# ---- threads --------------------------------------------------------------------------------

def test_close_waits_for_calls_running_in_other_threads():
    # Whichever comes first, a call either completes with the right values or raises ValueError
    # (closed); close() never frees the engine under a running call.
    ref = [s.total for s in estream.Model(MODEL, threads=1).score(TEXTS * 4)]
    for _ in range(3):
        m = estream.Model(MODEL, threads=1)
        got, errors = [], []

        def worker():
            try:
                got.append([s.total for s in m.score(TEXTS * 4)])
            except ValueError as e:
                got.append("closed" in str(e))
            except Exception as e:  # noqa: BLE001  (reported below)
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        m.close()
        for t in threads:
            t.join()
        assert not errors and len(got) == 3 and all(g is True or g == ref for g in got), (errors, got)
        assert m.closed


def test_two_threads_share_one_model(model):
    ref_scores = [s.logprobs for s in model.score(TEXTS)]
    ref_embed = model.embed(TEXTS)
    errors, done = [], []

    def worker(k):
        try:
            for _ in range(6):
                if k == 0:
                    got = [s.logprobs for s in model.score(TEXTS)]
                    for a, b in zip(got, ref_scores):
                        np.testing.assert_array_equal(a, b)
                else:
                    np.testing.assert_array_equal(model.embed(TEXTS), ref_embed)
                with pytest.raises(ValueError):
                    model.score([1, 999999])
                _ = model.stats.requests
            done.append(k)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(done) == [0, 1]
