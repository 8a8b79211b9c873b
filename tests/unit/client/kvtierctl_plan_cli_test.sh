#!/bin/sh
# kvtierctl plan end to end: a table for a built-in model, JSON for scripts, exit 2 naming the
# option for bad input. Usage: kvtierctl_plan_cli_test.sh KVTIERCTL
set -u
ctl=$1
fail() { echo "FAIL: $*"; exit 1; }
out=$($ctl plan --model deepseek-r1-distill-qwen-7b --batch 4 --context 16384 \
  --prompt-tokens 512 --hbm-ratio 0.25 --evict-ratio 0.1 --compress-ratio 0.2) || fail "exit $?"
echo "$out" | grep -q "56.0 KiB (an MHA estimate: 392.0 KiB)" || fail "KV per token: $out"
echo "$out" | grep -q "T0 3696  T1 8288  T2 2832  evicted 1568" || fail "tokens: $out"
echo "$out" | grep -q "fits in this host's DDR" || fail "no DDR line: $out"
json=$($ctl plan --model llama3-70b --gpus 8 --batch 16 --context 32768 --json) || fail "json"
echo "$json" | grep -q '"kv_bytes_per_token": 327680' || fail "json: $json"
check_bad() {
  want=$1; shift
  err=$($ctl plan "$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] || fail "exit $rc for $*"
  echo "$err" | grep -q -- "$want" || fail "'$want' not in: $err"
}
check_bad "unknown model 'nope'" --model nope --context 10
check_bad "cannot read model file /no/such.gguf" --model /no/such.gguf --context 10
check_bad "context must be in \[1, 16777216\], got 0" --model llama3-8b --context 0
check_bad "\-\-hbm-ratio must be a number in \[0, 1\], got '2'" --model llama3-8b --context 9 \
  --hbm-ratio 2
check_bad "\-\-batch must be an integer" --model llama3-8b --context 9 --batch x
echo PASS
