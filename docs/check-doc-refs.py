#!/usr/bin/env python3
"""Every file, directory and test a document names must exist.

Looks at the backticked spans of README.md, docs/*.md and the READMEs under e2e/ and
packaging/:
- a span that looks like a path of this repository (it starts with one of its top-level
  directories, or is a top-level file) must exist; `*` and `?` are globs, and a path with a
  `<placeholder>` in it, or one git ignores (what a command writes), is skipped;
- in docs/rules.md, a snake_case name (a scenario, a test function, a metric) must occur
  somewhere in the tree outside docs/, so a renamed test does not leave its citation behind.
Prints `file:line: what` for each one that does not and exits 1.
"""
import glob
import pathlib
import re
import subprocess
import sys

top = pathlib.Path(__file__).resolve().parent.parent
tracked = subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
    cwd=top, capture_output=True, text=True, check=True,
).stdout.split()
tops = {p.split("/")[0] for p in tracked}
dirs = sorted(t for t in tops if (top / t).is_dir() and not t.startswith("."))
docs = sorted(
    p for p in tracked
    if p == "README.md" or (p.startswith("docs/") and p.endswith(".md"))
    or (p.startswith(("e2e/", "packaging/")) and p.endswith("README.md"))
)
span = re.compile(r"`([^`\n]+)`")
path_like = re.compile(r"^(?:%s)/[\w.*?/<>{}-]*$" % "|".join(map(re.escape, dirs)))
name_like = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")

corpus = None


def occurs(name):
    global corpus
    if corpus is None:
        parts = []
        for p in tracked:
            if p.startswith("docs/") or not (top / p).is_file():
                continue
            try:
                parts.append((top / p).read_text(errors="ignore"))
            except OSError:
                pass
        parts.extend(pathlib.Path(p).stem for p in tracked)
        corpus = "\n".join(parts)
    return name in corpus


def ignored(p):
    """Output a command writes (git ignores it): named, not committed."""
    return subprocess.run(["git", "check-ignore", "-q", p], cwd=top).returncode == 0


bad = []
for doc in docs:
    for n, line in enumerate((top / doc).read_text().splitlines(), 1):
        for s in span.findall(line):
            s = s.strip().rstrip(".,:;")
            candidate = s.split()[0] if s.split() else s
            if candidate.startswith("./"):
                candidate = candidate[2:]
            if path_like.match(candidate) or candidate in tops:
                if "<" in candidate or "{" in candidate:
                    continue
                p = candidate.split(":")[0]
                if any(c in p for c in "*?"):
                    if not glob.glob(str(top / p)):
                        bad.append(f"{doc}:{n}: no file matches {p}")
                elif not (top / p).exists() and not ignored(p):
                    bad.append(f"{doc}:{n}: {p} does not exist")
            elif doc == "docs/rules.md" and name_like.match(s) and not occurs(s):
                bad.append(f"{doc}:{n}: `{s}` is named nowhere outside docs/")

for b in bad:
    print(b)
if bad:
    print("check-doc-refs: the documents above name files or tests that do not exist", file=sys.stderr)
    sys.exit(1)
print("check-doc-refs: every file and test the documents name exists")
