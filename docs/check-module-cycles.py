#!/usr/bin/env python3
"""The imports among the binary's top-level modules (`src/<module>`) must form no cycle.

Reads every `crate::<module>` path in `src/**/*.rs` outside `#[cfg(test)]` modules and test
files (`*_tests.rs`), builds the graph of top-level modules, and prints each cycle found
(exit 1) or the modules in an order where each uses only those before it (exit 0).
"""
import pathlib
import re
import sys

top = pathlib.Path(__file__).resolve().parent.parent
src = top / "src"
modules = sorted(
    p.stem if p.is_file() else p.name
    for p in src.iterdir()
    if (p.is_dir() and (p / "mod.rs").exists()) or (p.suffix == ".rs" and p.stem not in ("lib", "main"))
)
use_re = re.compile(r"\bcrate::(\w+)")
# `use crate::{a, b::c}` groups name several modules at once.
group_re = re.compile(r"\bcrate::\{([^}]*)\}", re.S)


def module_of(path):
    rel = path.relative_to(src).parts
    return rel[0][:-3] if rel[0].endswith(".rs") else rel[0]


def product_text(text):
    """The file without its `#[cfg(test)]` module (rustfmt puts it last)."""
    m = re.search(r"^#\[cfg\(test\)\]\s*\nmod ", text, re.M)
    return text[: m.start()] if m else text


edges = {m: set() for m in modules}
for path in sorted(src.rglob("*.rs")):
    if path.name.endswith("_tests.rs") or path.name in ("lib.rs", "main.rs"):
        continue
    here = module_of(path)
    text = product_text(path.read_text())
    text = "\n".join(line.split("//")[0] for line in text.splitlines())
    used = set(use_re.findall(text))
    for group in group_re.findall(text):
        used.update(re.findall(r"(?:^|,)\s*(\w+)", group))
    for m in used:
        if m in edges and m != here:
            edges[here].add(m)

# Tarjan's strongly connected components.
index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(edges[v]):
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        comps.append(sorted(comp))


for v in modules:
    if v not in index:
        visit(v)

cycles = [c for c in comps if len(c) > 1]
if cycles:
    for c in cycles:
        pairs = [f"{a} -> {b}" for a in c for b in sorted(edges[a]) if b in c]
        print("import cycle among src/ modules: " + ", ".join(c))
        print("  " + "; ".join(pairs))
    sys.exit(1)
print("no import cycle among src/ modules; each uses only those before it:")
print("  " + " < ".join(c[0] for c in comps))
