"""estream: prefill-only mixture-of-experts inference from Python.

Score, rank, classify and embed text with a GGUF mixture-of-experts model (OLMoE, Qwen3-MoE,
Mixtral, DeepSeek-V2, LFM2-MoE), optionally within a memory budget (packed models stream their
experts from the SSD)::

    import estream
    m = estream.Model("model.gguf", budget="4G", threads=2)
    s = m.score("The capital of France is Paris.")       # s.logprobs, s.total, s.perplexity
    m.next_token("The capital of France is", top_k=5)    # [(id, logprob, text), ...]
    E = m.embed(["first text", "second text"])           # numpy float32 [2, n_embd]
    m.classify("Is the sky blue? Answer:", [" yes", " no"])  # numpy [2] probabilities
    m.stats                                              # timing, bubble, bytes read, peak RSS
    m.close()                                            # or: with estream.Model(...) as m:

A list of inputs runs as one batch (one forward pass reads each active expert once for all of
them). The GIL is released while the engine runs; calls on one Model from several threads take
turns. Errors raise ValueError (bad input), OSError (file), MemoryError (budget) with the engine's
message; the model stays usable. See docs/GUIDE.md, "From Python and C".
"""

try:
    import numpy as _numpy  # noqa: F401  (the results are numpy arrays)
except ImportError as e:  # pragma: no cover
    raise ImportError(
        "estream needs numpy; on Debian 12 run it with /usr/bin/python3 (python3-numpy, "
        "installed by scripts/setup.sh): " + str(e)) from e

from ._estream import Candidate, Model, Score, Stats, __version__

__all__ = ["Model", "Score", "Candidate", "Stats", "__version__"]
