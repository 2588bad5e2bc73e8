#!/usr/bin/env bash
# Writes the demo corpus: the English text of Debian's `fortunes` package, concatenated.
# Usage: prepare_corpus.sh OUT_FILE
set -euo pipefail
out=${1:?usage: prepare_corpus.sh OUT_FILE}
src=/usr/share/games/fortunes
if [[ ! -d $src ]]; then
  echo "prepare_corpus: $src missing; run scripts/install_deps.sh" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
# Plain text files only (skip the .dat indexes and the .u8 symlinks), in a fixed order.
find -L "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort | xargs cat > "$out.tmp"
mv "$out.tmp" "$out"
echo "prepare_corpus: $(wc -c < "$out") bytes in $out"
