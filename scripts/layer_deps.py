#!/usr/bin/env python3
"""Checks estream's layering from the #include lines and prints the dependency graph (Mermaid).

Usage: scripts/layer_deps.py [--mermaid] [--with-base]

Every source file belongs to one layer: its folder under src/ (src/io/ holds two libraries: the
packed-model files packed_layout.*, pack_*.* and metadata_update.* form `pack`, the rest `io`),
tools/estream/ is `tools`, and include/estream/engine.h is the public API of the `model` layer
(src/model/engine.cc implements it). An edge A -> B means a file of A includes a header of B.
Each edge must be one that docs/DESIGN.md section 1 allows (ALLOWED below, the same table); the
script prints every edge that is not and exits 1, else exits 0.
--mermaid prints the edges found as a Mermaid flowchart (top to bottom: a layer above depends on
the layers below it); edges to `base`, which every layer uses, are left out unless --with-base.
No third-party packages.
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each layer may include (besides itself). Keep in step with docs/DESIGN.md section 1.
ALLOWED = {
    "base": set(),
    "quant": {"base"},
    "gguf": {"base", "quant"},
    "kernels": {"base", "quant"},
    "moe": {"base", "quant", "kernels"},
    "io": {"base"},
    "pack": {"base", "quant", "gguf", "kernels"},
    "vmem": {"base", "io"},
    "pipeline": {"base", "io", "pack", "vmem"},
    "config": {"base", "gguf"},
    "tokenizer": {"base", "gguf"},
    "model": {"base", "quant", "gguf", "kernels", "moe", "io", "pack", "vmem", "pipeline", "config"},
    "profiler": {"base", "quant", "gguf", "kernels", "io", "pack", "config", "tokenizer", "model"},
    "server": {"base", "tokenizer", "model"},
    "tools": {"base", "quant", "gguf", "kernels", "moe", "io", "pack", "vmem", "pipeline", "config", "tokenizer",
              "model", "profiler", "server"},
}
ORDER = ["tools", "server", "profiler", "model", "tokenizer", "config", "pipeline", "vmem", "pack", "io", "moe", "kernels",
         "gguf", "quant", "base"]
PACK_FILES = re.compile(r"^(packed_layout|pack_[^/]*|metadata_update)\.(h|cc)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of_path(rel):
    """Layer of a repository-relative source path, or None when not part of a layer."""
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) >= 3:
        if parts[1] == "io":
            return "pack" if PACK_FILES.match(parts[-1]) else "io"
        return parts[1]
    if parts[:2] == ["tools", "estream"]:
        return "tools"
    if parts[:2] == ["include", "estream"]:
        return "model"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mermaid", action="store_true", help="print the graph as a Mermaid flowchart")
    ap.add_argument("--with-base", action="store_true", help="also draw the edges to base")
    args = ap.parse_args()

    edges = {}  # (from, to) -> an example "file: include"
    for top in ("src", "tools", "include"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT)
                src = layer_of_path(rel)
                if src is None:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        dst = layer_of_path(m.group(1) if m.group(1).startswith(("tools/", "include/"))
                                            else ("include/" + m.group(1) if m.group(1).startswith("estream/")
                                                  else "src/" + m.group(1)))
                        if dst is None or dst == src:
                            continue
                        edges.setdefault((src, dst), f"{rel}: {m.group(1)}")

    bad = [(a, b) for (a, b) in sorted(edges) if b not in ALLOWED.get(a, set())]
    for a, b in bad:
        print(f"layer violation: {a} -> {b} ({edges[(a, b)]})", file=sys.stderr)

    if args.mermaid:
        print("flowchart TD")
        for a in ORDER:
            for b in ORDER:
                if (a, b) in edges and (args.with_base or b != "base"):
                    print(f"  {a} --> {b}")
    elif not bad:
        print(f"{len(edges)} include edges between layers, all allowed by docs/DESIGN.md section 1")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
