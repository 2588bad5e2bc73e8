#!/usr/bin/env bash
# Fails if any C++ file disagrees with .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(git ls-files -co --exclude-standard '*.cc' '*.h' | xargs clang-format --dry-run -Werror 2>&1 | grep -c "error:" || true)
if [[ $bad != 0 ]]; then
  git ls-files -co --exclude-standard '*.cc' '*.h' | xargs clang-format --dry-run -Werror 2>&1 | grep "error:" | cut -d: -f1 | sort -u
  echo "check_format: run clang-format -i on the files above" >&2
  exit 1
fi
