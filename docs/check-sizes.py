#!/usr/bin/env python3
"""No product file over 700 lines before its `#[cfg(test)]` module, no function over 120 lines.

Reads `src/` and `reconcilers/src/` (the testkit aside: it is test code). A file's product part
ends at its first inline test module, `#[cfg(test)] mod x { … }`; a `#[cfg(test)] mod x;` line
declares a test module kept in another file and does not end it. A function's length runs from
its `fn` line to the closing brace rustfmt puts at the same indent. Prints each offender and
exits 1, or says that none is over.
"""
import pathlib
import re
import sys

FN_LIMIT, FILE_LIMIT = 120, 700
top = pathlib.Path(__file__).resolve().parent.parent
fn_re = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")
# A module with its body here; `mod x;` (its body in another file) does not match.
inline_mod_re = re.compile(r"^(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def product_end(lines):
    """The index of the first top-level `#[cfg(test)]` that opens an inline module (other
    attributes may stand between them), or the number of lines when there is none."""
    for i, l in enumerate(lines):
        if l.strip() != "#[cfg(test)]" or l.startswith(" "):
            continue
        j = i + 1
        while j < len(lines) and lines[j].startswith("#["):
            j += 1
        if j < len(lines) and inline_mod_re.match(lines[j]):
            return i
    return len(lines)


bad = []
for root in ("src", "reconcilers/src"):
    for p in sorted((top / root).rglob("*.rs")):
        if "testkit" in p.parts or p.name.endswith("_tests.rs"):
            continue
        lines = p.read_text().splitlines()
        body = product_end(lines)
        rel = p.relative_to(top)
        if body > FILE_LIMIT:
            bad.append(f"{rel}: {body} lines before its tests (limit {FILE_LIMIT})")
        for i, l in enumerate(lines[:body]):
            m = fn_re.match(l)
            if not m or l.rstrip().endswith(";"):
                continue
            end = next((j for j in range(i + 1, body) if lines[j] == m.group(1) + "}"), None)
            if end is not None and end - i + 1 > FN_LIMIT:
                bad.append(f"{rel}:{i + 1}: fn {m.group(7)} is {end - i + 1} lines (limit {FN_LIMIT})")
for b in bad:
    print(b)
if bad:
    print("check-sizes: split the files and functions above by what each part does", file=sys.stderr)
    sys.exit(1)
print(f"check-sizes: no file over {FILE_LIMIT} lines before its tests, no function over {FN_LIMIT}")
