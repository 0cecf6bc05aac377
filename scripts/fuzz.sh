#!/usr/bin/env bash
# Runs every fuzz target of the module for a while each (default 10s):
#   scripts/fuzz.sh [duration]
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-10s}
grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r f; do
  pkg="./$(dirname "${f#./}")"
  for fn in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
    echo "== $pkg $fn ($t)"
    go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$t" "$pkg"
  done
done
