#!/usr/bin/env python3
"""The imports among the binary's top-level modules (`src/<module>`) must form no cycle.

Reads every path into another module (`crate::…`, `super::…`, `self::…`, `use` groups
included) in `src/**/*.rs` outside inline `#[cfg(test)] mod x { … }` modules and test files
(`*_tests.rs`), builds the graph of top-level modules, and prints each cycle found (exit 1) or
the modules in an order where each uses only those before it (exit 0).

It reads the modules of the core's `reconcilers/src/handle/` the same way (a module there is
reached as `crate::handle::<module>`, as `crate::<module>` through the crate root's
re-exports, or as `super::<module>`) and prints the cycles among them as a report; they are
being taken apart, so they do not fail the check yet.
"""
import pathlib
import re
import sys

top = pathlib.Path(__file__).resolve().parent.parent

# `#[cfg(test)]` (other attributes may follow) opening a module with its body here; a
# `#[cfg(test)] mod x;` line declares a module kept in another file and is product text.
inline_test_mod = re.compile(
    r"^#\[cfg\(test\)\][ \t]*\n(?:#\[[^\n]*\][ \t]*\n)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{",
    re.M,
)
path_start = re.compile(r"\b(crate|super|self)\b(?=\s*::)")
word = re.compile(r"\w+|\*")


def product_text(text):
    """The file without its inline test module (rustfmt puts it last) and comments."""
    m = inline_test_mod.search(text)
    text = text[: m.start()] if m else text
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def use_tree(text, i):
    """The paths a use tree (or an expression path) at `text[i]` names, as lists of
    segments: `a::{b, c::d}` gives [a, b] and [a, c, d]."""
    while i < len(text) and text[i].isspace():
        i += 1
    if text.startswith("{", i):
        paths, i = [], i + 1
        while i < len(text):
            sub, i = use_tree(text, i)
            paths += sub
            while i < len(text) and text[i].isspace():
                i += 1
            if text.startswith(",", i):
                i += 1
            elif text.startswith("}", i):
                return paths, i + 1
            else:
                return paths, i
        return paths, i
    m = word.match(text, i)
    if not m:
        return [[]], i
    i = m.end()
    j = i
    while j < len(text) and text[j].isspace():
        j += 1
    if text.startswith("::", j):
        rest, i = use_tree(text, j + 2)
        return [[m.group()] + r for r in rest], i
    return [[m.group()]], i


def used_paths(text, here):
    """Every absolute path (segments under the crate root) that `text`, the text of the
    module at path `here`, names."""
    out, read_to = [], 0
    for m in path_start.finditer(text):
        # A `super` inside the path just read (`super::super::x`) starts no path of its own.
        if m.start() < read_to:
            continue
        base = {"crate": [], "self": list(here), "super": list(here[:-1])}[m.group(1)]
        i = text.index("::", m.end()) + 2
        while re.match(r"\s*super\s*::", text[i:]):
            base = base[:-1]
            i = text.index("::", i) + 2
        paths, read_to = use_tree(text, i)
        for p in paths:
            out.append(base + [s for s in p if s not in ("self", "*")])
    return out


def module_path(path, root):
    """`a/b.rs` is a::b, `a/mod.rs` is a."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return parts


def cycles_of(edges):
    """Tarjan's strongly connected components of more than one node, and all of them in an
    order where each uses only those before it."""
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [c for c in comps if len(c) > 1], comps


def print_cycles(cycles, edges, where, indent=""):
    for c in cycles:
        pairs = [f"{a} -> {b}" for a in c for b in sorted(edges[a]) if b in c]
        print(f"{indent}import cycle among {where} modules: " + ", ".join(c))
        print(f"{indent}  " + "; ".join(pairs))


def graph(files, root, node_of):
    """Edges between the nodes `node_of` gives a module path (None: not in the graph)."""
    edges = {}
    for path in files:
        here = module_path(path, root)
        me = node_of(here)
        if me is None:
            continue
        edges.setdefault(me, set())
        for p in used_paths(product_text(path.read_text()), here):
            other = node_of(p)
            if other is not None and other != me:
                edges[me].add(other)
    for targets in list(edges.values()):
        for t in targets:
            edges.setdefault(t, set())
    return edges


def rust_files(root):
    return [
        p for p in sorted(root.rglob("*.rs"))
        if not p.name.endswith("_tests.rs")
    ]


# The binary: its top-level modules.
src = top / "src"
modules = {
    p.stem if p.is_file() else p.name
    for p in src.iterdir()
    if (p.is_dir() and (p / "mod.rs").exists()) or (p.suffix == ".rs" and p.stem not in ("lib", "main"))
}
src_edges = graph(
    [p for p in rust_files(src) if p.name not in ("lib.rs", "main.rs") or p.parent != src],
    src,
    lambda p: p[0] if p and p[0] in modules else None,
)
for m in modules:
    src_edges.setdefault(m, set())
src_cycles, src_order = cycles_of(src_edges)

# The core: the modules of reconcilers/src/handle/, reached by their path or by the name the
# crate root re-exports them under (lib.rs; no other module of the crate has that name).
core = top / "reconcilers" / "src"
handle = core / "handle"
handle_modules = {
    p.stem if p.is_file() else p.name
    for p in handle.iterdir()
    if (p.is_dir() and (p / "mod.rs").exists()) or (p.suffix == ".rs" and p.stem != "mod")
}


def handle_node(p):
    if len(p) >= 2 and p[0] == "handle" and p[1] in handle_modules:
        return p[1]
    if len(p) >= 1 and p[0] in handle_modules:
        return p[0]
    return None


handle_edges = graph(
    [p for p in rust_files(handle) if p != handle / "mod.rs"],
    core,
    handle_node,
)
for m in handle_modules:
    handle_edges.setdefault(m, set())
handle_cycles, _ = cycles_of(handle_edges)

if src_cycles:
    print_cycles(src_cycles, src_edges, "src/")
else:
    print("no import cycle among src/ modules; each uses only those before it:")
    print("  " + " < ".join(c[0] for c in src_order))

print()
if handle_cycles:
    print(
        f"report, not failing: {len(handle_cycles)} import cycle(s) among "
        "reconcilers/src/handle/ modules (being restructured):"
    )
    print_cycles(handle_cycles, handle_edges, "reconcilers/src/handle/", "  ")
else:
    print("no import cycle among reconcilers/src/handle/ modules")

sys.exit(1 if src_cycles else 0)
