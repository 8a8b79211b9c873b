#!/usr/bin/env bash
# Decode step time of the reference engine through kvtierd while the daemon is held up, against
# the same run without a daemon: the token path must not wait on the daemon (DESIGN.md §6).
# "Delay D ms" stops the daemon (SIGSTOP) for D ms out of every D + 100 ms, so every request that
# arrives in a stop waits up to D ms. Each configuration runs ROUNDS times, alternating; the
# table reports medians of p50/p99/max step time and p99 as a ratio of the no-daemon run.
#   bench/engine/daemon_stalls.sh [ROUNDS] [MAX_NEW_TOKENS] [DELAYS_MS...]   (default: 3 256 0 5 50 500)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
tokens=${2:-256}
shift $(( $# > 2 ? 2 : $# )) || true
delays=("$@")
[ ${#delays[@]} -gt 0 ] || delays=(0 5 50 500)
for d in "$rounds" "$tokens" "${delays[@]}"; do
  case "$d" in ''|*[!0-9]*) echo "daemon_stalls: '$d' is not a whole number" >&2; exit 2 ;; esac
done
bin="${KVTIER_BUILD_DIR:-build}/bin"
prompt=scripts/demo-question.txt
dir=$(mktemp -d)
daemon_pid="" staller_pid=""
cleanup() {
  [ -n "$staller_pid" ] && kill "$staller_pid" 2>/dev/null
  [ -n "$daemon_pid" ] && { kill -CONT "$daemon_pid"; kill "$daemon_pid"; wait "$daemon_pid"; } 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
"$bin/kvtierd" --socket "$dir/k.sock" --metrics "" --log-level warning &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$dir/k.sock" ] && break; sleep 0.05; done
run() {  # prints p50 p99 max plans degraded
  "$bin/kvtier-run" generate --chat --prompt-file "$prompt" --max-new-tokens "$tokens" \
    --policy hierarchy --hbm-ratio 0.5 --evict-ratio 0 --json "$@" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["report"]; print(r["decode_step_p50_ms"], r["decode_step_p99_ms"], r["decode_step_max_ms"], r["plans"], r["degraded_plans"])'
}
stall() {  # $1 ms stopped out of every $1 + 100 ms, until killed
  while :; do
    kill -STOP "$daemon_pid"; sleep "$(awk "BEGIN{print $1/1000}")"
    kill -CONT "$daemon_pid"; sleep 0.1
  done
}
results="$dir/results"
for round in $(seq "$rounds"); do
  echo "round $round: no daemon" >&2
  echo "none $(run --local)" >>"$results"
  for d in "${delays[@]}"; do
    echo "round $round: kvtierd, delay $d ms" >&2
    if [ "$d" -gt 0 ]; then stall "$d" & staller_pid=$!; fi
    echo "$d $(run --daemon "unix:$dir/k.sock")" >>"$results"
    if [ -n "$staller_pid" ]; then kill "$staller_pid"; wait "$staller_pid" 2>/dev/null || true; fi
    staller_pid=""
    kill -CONT "$daemon_pid"
  done
done
python3 - "$results" "$tokens" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    key, *vals = line.split()
    rows[key].append([float(v) for v in vals])
med = {k: [statistics.median(col) for col in zip(*v)] for k, v in rows.items()}
base = med["none"][1]
print(f"decode step time, {sys.argv[2]} tokens, hierarchy beta 0.5 r 0, medians of {len(rows['none'])} rounds")
print("| daemon | p50 ms | p99 ms | max ms | p99 / no daemon | plans | degraded |")
print("|---|---|---|---|---|---|---|")
for k in ["none"] + [k for k in med if k != "none"]:
    p50, p99, mx, plans, degraded = med[k]
    name = "none (local pools)" if k == "none" else f"kvtierd, delay {k} ms"
    print(f"| {name} | {p50:.2f} | {p99:.2f} | {mx:.2f} | {p99 / base:.3f} | {plans:.0f} | {degraded:.0f} |")
PY
