#!/usr/bin/env python3
"""Checks estream's layering from the #include lines and prints the dependency graph (Mermaid).

Usage: scripts/layer_deps.py [--mermaid] [--with-base]

Every source file belongs to one layer: its folder under src/, tools/estream/ is `tools`, python/
is `python`; of the public headers, include/estream/status.h and options.h (the vocabulary:
Status, Schedule, ...) belong to `base` (src/base implements them), tokenizer.h to `tokenizer`,
estream.h (the C API, src/capi/) to `capi`, and the others, such as include/estream/engine.h, to
the `model` layer (src/model/engine.cc implements the API). An edge A -> B means a file of A
includes a header of B.
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
    "profiler": {"base", "quant", "gguf", "kernels", "io", "pack", "pipeline", "config", "tokenizer", "model"},
    "tools": {"base", "quant", "gguf", "kernels", "moe", "io", "pack", "vmem", "pipeline", "config", "tokenizer",
              "model", "profiler", "batch", "server"},
    "server": {"base", "tokenizer", "model", "batch"},
    "batch": {"base", "tokenizer", "model"},
    # Front ends that embed the engine: public headers only (plus the shared front-end helpers).
    "capi": {"base", "model", "tokenizer"},
    "python": {"base", "model", "tokenizer", "capi", "batch"},
}
# Files held to less than their layer may use: the packed layout and the metadata updates know the
# kernel-native weight format from quant/packed_format.h only (the packer, pack_model.*, uses the
# kernels to write it), so the pipeline that reads packed models does not depend on the kernels.
FILE_FORBIDDEN = {
    "src/pack/packed_layout.": {"kernels"},
    "src/pack/metadata_update.": {"kernels"},
}
ORDER = ["python", "capi", "tools", "server", "batch", "profiler", "model", "tokenizer", "config", "pipeline", "vmem", "pack", "io", "moe", "kernels",
         "gguf", "quant", "base"]
BASE_PUBLIC = {"status.h", "options.h"}  # include/estream/ headers of the base layer
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of_path(rel):
    """Layer of a repository-relative source path, or None when not part of a layer."""
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) >= 3:
        return parts[1]
    if parts[:2] == ["tools", "estream"]:
        return "tools"
    if parts[:2] == ["include", "estream"]:
        if parts[-1] in BASE_PUBLIC:
            return "base"
        return {"tokenizer.h": "tokenizer", "estream.h": "capi"}.get(parts[-1], "model")
    if parts[0] == "python":
        return "python"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mermaid", action="store_true", help="print the graph as a Mermaid flowchart")
    ap.add_argument("--with-base", action="store_true", help="also draw the edges to base")
    args = ap.parse_args()

    edges = {}  # (from, to) -> an example "file: include"
    file_bad = []  # "file: include" lines that FILE_FORBIDDEN refuses
    for top in ("src", "tools", "include", "python"):
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
                        if any(rel.startswith(p) and dst in f for p, f in FILE_FORBIDDEN.items()):
                            file_bad.append(f"{rel}: {m.group(1)}")
                        edges.setdefault((src, dst), f"{rel}: {m.group(1)}")

    bad = [(a, b) for (a, b) in sorted(edges) if b not in ALLOWED.get(a, set())]
    for a, b in bad:
        print(f"layer violation: {a} -> {b} ({edges[(a, b)]})", file=sys.stderr)
    for where in file_bad:
        print(f"layer violation: {where} (FILE_FORBIDDEN)", file=sys.stderr)

    if args.mermaid:
        print("flowchart TD")
        for a in ORDER:
            for b in ORDER:
                if (a, b) in edges and (args.with_base or b != "base"):
                    print(f"  {a} --> {b}")
    elif not bad and not file_bad:
        print(f"{len(edges)} include edges between layers, all allowed by docs/DESIGN.md section 1")
    return 1 if bad or file_bad else 0


if __name__ == "__main__":
    sys.exit(main())
