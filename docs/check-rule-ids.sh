#!/usr/bin/env bash
# Every rule ID cited in the tree must be defined in docs/rules.md.
#
# Looks at comments (Rust `//…`, `#` comments of scripts, Makefiles, YAML, units and the
# scenario files' header lines) and at whole Markdown files, everywhere except docs/ itself.
# An ID is defined when docs/rules.md writes it in bold (`**C8.1**`, `**CLI-6.5**`).
# Prints `file:line: ID` for every undefined citation and exits 1 if there is one; then
# docs/check-doc-refs.py checks that every file and test the documents name exists.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
rules=docs/rules.md
[[ -f $rules ]] || { echo "check-rule-ids: $rules is missing" >&2; exit 1; }

# Behaviour rules (B1, C8.1, W4 …) and contract/design IDs (CLI-6.5, ANN-4.2.5, LEASE-7, INV-3,
# CFG-1, DEC-2). Not part of a longer token: MACs (7A:10:C4), flags (-W1), versions (v1.2).
id='(?:[BCDEFKLMNPRSUW][0-9]{1,2}(?:\.[0-9]+)?|(?:CLI|ANN|LEASE|INV|CFG|DEC)-[0-9]+(?:\.[0-9]+)*)'
cite="(?<![\\w.:-])$id(?![\\w-]|\\.[0-9])"

defined=$(grep -oP "\\*\\*\\K$id(?=\\*\\*)" "$rules" | sort -u)

# Tracked and new (not ignored) files, minus docs/ and data that is not prose.
mapfile -t files < <(
  git ls-files --cached --others --exclude-standard |
    grep -vE '^docs/|(^|/)Cargo\.lock$|\.jsonl$|^reconcilers/proptest-regressions/' |
    while IFS= read -r f; do [[ -f $f ]] && printf '%s\n' "$f"; done
)

# Emit `file:line:text` for the comment part of each line.
comments() {
  awk '
    FNR == 1 { mode = "hash"; hdr = 1 }
    FNR == 1 && FILENAME ~ /\.rs$/ { mode = "rs" }
    FNR == 1 && FILENAME ~ /\.md$/ { mode = "md" }
    FNR == 1 && FILENAME ~ /\.txt$/ { mode = "txt" }
    mode == "md" { print FILENAME ":" FNR ":" $0; next }
    mode == "rs" {
      i = index($0, "//")
      if (i) print FILENAME ":" FNR ":" substr($0, i + 2)
      next
    }
    mode == "txt" {
      # Scenario files: `#` lines only (data lines carry `#<op>` numbers, MACs and IDs).
      if ($0 ~ /^#/) print FILENAME ":" FNR ":" substr($0, 2)
      next
    }
    {
      if (match($0, /(^|[ \t])#([ \t]|$)/)) print FILENAME ":" FNR ":" substr($0, RSTART + RLENGTH)
    }
  ' "$@"
}

# One grep over every comment line: its `file:line:` prefix, then the IDs it cites.
undefined=$(
  comments "${files[@]}" |
    { grep -oP -- "^[^:]+:[0-9]+:|$cite" || true; } |
    DEFINED=$defined awk '
      BEGIN { n = split(ENVIRON["DEFINED"], d, "\n"); for (i = 1; i <= n; i++) ok[d[i]] = 1 }
      /^[^:]+:[0-9]+:$/ { loc = $0; next }
      !($0 in ok) { print loc " " $0 }
    '
)

missing=0
if [[ -n $undefined ]]; then
  printf '%s\n' "$undefined"
  missing=1
fi

if ((missing)); then
  echo "check-rule-ids: the IDs above are cited but not defined in $rules" >&2
  exit 1
fi
echo "check-rule-ids: every cited rule ID is defined in $rules"
# The documents' citations of files and tests must hold too: a rule tested by a file that was
# renamed is a rule no longer known to be tested.
python3 docs/check-doc-refs.py
