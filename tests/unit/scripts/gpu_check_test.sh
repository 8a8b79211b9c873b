#!/usr/bin/env bash
# scripts/gpu-check without a GPU: the carried run over stand-in binaries (a stand-in nvidia-smi,
# a Python environment holding a library in nvidia/*/lib) — a binary that cannot load, one that
# hangs and one that skips each fail alone while the rest run, the real model's cases are
# filtered out, the probe's facts are reported; and --pack over small ELF binaries: the listing,
# and the size check counting the working tree that travels beside the pack.
# Usage: gpu_check_test.sh SOURCE_DIR
set -uo pipefail
src="$1"
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
cc="${CC:-cc}"
fails=0
check() {  # check WHAT FILE PATTERN
  if grep -qF -- "$3" "$2"; then echo "ok: $1"; else echo "FAILED: $1 (no '$3' in $2)"; fails=$((fails + 1)); fi
}

# Stand-ins: two libraries, one left only in a Python environment, one deleted.
printf 'int kvtier_gone(void) { return 0; }\n' >"$tmp/lib.c"
printf 'int kvtier_gone(void);\n#include <stdio.h>\nint main(void) { puts("[  PASSED  ] 1 test."); return kvtier_gone(); }\n' >"$tmp/main.c"
mkdir -p "$tmp/site/nvidia/cublas/lib" "$tmp/build/bin" "$tmp/path" "$tmp/out"
"$cc" -shared -fPIC -o "$tmp/site/nvidia/cublas/lib/libkvtiergone.so" "$tmp/lib.c" || exit 1
"$cc" -o "$tmp/build/bin/cuda_kernels_gpu_test" "$tmp/main.c" -L"$tmp/site/nvidia/cublas/lib" -lkvtiergone || exit 1
"$cc" -shared -fPIC -o "$tmp/libkvtierreallygone.so" "$tmp/lib.c" || exit 1
"$cc" -o "$tmp/build/bin/cuda_store_gpu_test" "$tmp/main.c" -L"$tmp" -lkvtierreallygone || exit 1
rm "$tmp/libkvtierreallygone.so"
stand_in() { printf '#!/usr/bin/env bash\n%s\n' "$2" >"$1"; chmod +x "$1"; }
stand_in "$tmp/build/bin/cuda_runtime_gpu_test" 'echo "[  PASSED  ] 4 tests."'
for t in cuda_schedule_gpu_test tiered_sequence_cuda_gpu_test runtime_daemon_cuda_gpu_test; do
  stand_in "$tmp/build/bin/$t" 'echo "[  PASSED  ] 2 tests."'
done
stand_in "$tmp/build/bin/cuda_engine_gpu_test" "echo \"\$@\" >$tmp/engine-args; sleep 60"
stand_in "$tmp/build/bin/vmm_pool_gpu_test" 'printf "[  SKIPPED ] VmmPoolGpuTest.Import (0 ms)\n[  PASSED  ] 0 tests.\n[  SKIPPED ] 1 test, listed below:\n[  SKIPPED ] VmmPoolGpuTest.Import\n"'
stand_in "$tmp/build/bin/kvtier-gpu-probe" 'echo driver_version=13000; echo probe=PASS'
stand_in "$tmp/build/bin/kvtier-gpu-bench" 'echo "# bench" >"$2"; echo "figure: 1" >>"$2"'
stand_in "$tmp/build/bin/kvtierd" 'exit 0'
stand_in "$tmp/path/nvidia-smi" 'echo "Stand-in GPU, 580.00, 81559 MiB"'
stand_in "$tmp/path/python3" "echo $tmp/site"

t0=$(date +%s)
PATH="$tmp/path:$PATH" OUT="$tmp/out" KVTIER_GPU_BUILD_DIR="$tmp/build" KVTIER_GPU_TIMEOUT_S=3 \
  "$src/scripts/gpu-check" --skip-build >"$tmp/run.log" 2>&1
rc=$?
r="$tmp/out/gpu-check.md"
[ "$rc" = 1 ] && echo "ok: FAIL verdict exits 1" || { echo "FAILED: exit $rc"; fails=$((fails + 1)); }
check "probe facts first" "$r" "probe=PASS"
check "cuBLAS-like library found in a Python environment" "$r" "libkvtiergone.so from $tmp/site/nvidia/cublas/lib"
check "that binary then runs" "$r" "cuda_kernels_gpu_test: PASS (1 passed"
check "a binary that cannot load fails alone" "$r" "cuda_store_gpu_test: **FAIL** (cannot load: missing libkvtierreallygone.so"
check "the next one still runs" "$r" "cuda_runtime_gpu_test: PASS (4 passed"
check "a hang is cut by its timeout" "$r" "cuda_engine_gpu_test: **FAIL** (0 passed, 0 failed, 0 skipped; timed out"
check "the real model's cases are filtered out" "$tmp/engine-args" "--gtest_filter=-RealModel/*"
check "a skip fails" "$r" "vmm_pool_gpu_test: **FAIL** (0 passed, 0 failed, 1 skipped"
check "the bench still runs" "$r" "figure: 1"
check "verdict" "$r" "**FAIL** (gpu-check took"
check "the real model is opt-in" "$r" "real model: not carried (opt-in)"
[ $(($(date +%s) - t0)) -lt 30 ] && echo "ok: bounded run" || { echo "FAILED: took over 30 s"; fails=$((fails + 1)); }
[ "$(find "$tmp/out" -type f | wc -l)" -le 8 ] && echo "ok: at most 8 files in OUT" || { echo "FAILED: over 8 files in OUT"; fails=$((fails + 1)); }

# --pack over small ELF binaries.
printf 'int main(void) { return 0; }\n' >"$tmp/hello.c"
mkdir -p "$tmp/b2/bin"
"$cc" -o "$tmp/hello" "$tmp/hello.c" || exit 1
for t in cuda_kernels_gpu_test cuda_runtime_gpu_test cuda_store_gpu_test cuda_schedule_gpu_test \
         tiered_sequence_cuda_gpu_test runtime_daemon_cuda_gpu_test cuda_engine_gpu_test \
         vmm_pool_gpu_test kvtier-gpu-bench kvtierd kvtier-gpu-probe; do cp "$tmp/hello" "$tmp/b2/bin/$t"; done
KVTIER_GPU_BUILD_DIR="$tmp/b2" "$src/scripts/gpu-check" --pack "$tmp/pack" >"$tmp/pack.log" 2>&1
rc=$?
[ "$rc" = 0 ] && echo "ok: --pack" || { echo "FAILED: --pack exit $rc"; cat "$tmp/pack.log"; fails=$((fails + 1)); }
check "pack lists binaries" "$tmp/pack.log" "bin/kvtier-gpu-probe"
check "pack lists libraries" "$tmp/pack.log" "lib/libstdc++.so.6"
check "pack carries the script" "$tmp/pack.log" "  gpu-check"
check "pack counts the tree" "$tmp/pack.log" "+ working tree"
# A limit the pack fits alone but not with the tree beside it is refused: the tree counts.
pack_b=$(du -sb "$tmp/pack" | cut -f1)
tree_b=$(cd "$src" && git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
limit=$(( (pack_b + 1048575) / 1048576 ))
if [ "$tree_b" -gt $((limit * 1048576 - pack_b)) ]; then
  KVTIER_GPU_CARRY_MIB=$limit KVTIER_GPU_BUILD_DIR="$tmp/b2" "$src/scripts/gpu-check" --pack "$tmp/pack" >"$tmp/pack2.log" 2>&1
  rc=$?
  [ "$rc" = 1 ] && echo "ok: over the carry with the tree: refused" || { echo "FAILED: exit $rc at $limit MiB"; fails=$((fails + 1)); }
  check "refusal names the limit" "$tmp/pack2.log" "over the $limit MiB carry: refused"
else
  echo "FAILED: the working tree ($tree_b B) is too small to tell"; fails=$((fails + 1))
fi
echo "$fails failures"
[ "$fails" = 0 ]
