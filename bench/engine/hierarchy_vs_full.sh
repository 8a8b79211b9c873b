#!/usr/bin/env bash
# Decode tok/s of `hierarchy` (β = 0.5, r = 0.03) as a ratio of `full`, measured in the same
# run: the two alternate, N rounds each, and the ratio of their medians is reported (this
# machine is noisy, so only the ratio means anything). Local pools; the daemon adds a round
# trip per Δ steps, measure it with --daemon unix:PATH.
#   bench/engine/hierarchy_vs_full.sh [ROUNDS] [MAX_NEW_TOKENS] [extra kvtier-run flags...]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
tokens=${2:-384}
shift $(( $# > 2 ? 2 : $# )) || true
bin="${KVTIER_BUILD_DIR:-build}/bin/kvtier-run"
prompt=scripts/demo-question.txt
run() {
  "$bin" generate --chat --prompt-file "$prompt" --max-new-tokens "$tokens" --json "$@" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["report"]; print(r["decode_tokens_per_second"], r["generated_tokens"])'
}
full=() hier=()
for i in $(seq "$rounds"); do
  read -r f n1 < <(run --policy full "$@")
  read -r h n2 < <(run --policy hierarchy --hbm-ratio 0.5 --evict-ratio 0.03 "$@")
  echo "round $i: full $f tok/s ($n1 tokens), hierarchy $h tok/s ($n2 tokens)"
  full+=("$f") hier+=("$h")
done
python3 - "${full[*]}" "${hier[*]}" <<'PY'
import statistics, sys
f = [float(x) for x in sys.argv[1].split()]
h = [float(x) for x in sys.argv[2].split()]
mf, mh = statistics.median(f), statistics.median(h)
print(f"median decode tok/s: full {mf:.1f}, hierarchy {mh:.1f}; ratio hierarchy/full = {mh / mf:.3f}")
PY
