#!/usr/bin/env bash
# cudamem as torch's native CUDA allocator, on the GPU machine (one H200, torch 2.11). Build the
# wheel first on the development machine (bash scripts/gpu/torch/build.sh -> gpu-out/), then,
# from the repository root on the GPU machine:
#     bash scripts/gpu/torch/native.sh
# Steps:
#   (1) every capability check of native_check.py with cudamem installed
#   (1b) CUDA tensors between processes (ipc_check.py): cudamem and torch's allocator, both ways
#   (2) the graph checks again under compute-sanitizer memcheck
#   (3) the profiler's per-operator CUDA memory, torch's allocator vs cudamem (separate processes)
#   (4) torch.compile(mode="reduce-overhead") training, 20 steps, alternated 2x each
#       ($NATIVE_COMPILE_RUNS times): losses
#   (5) torch.empty/del at 512 B, 1 MiB, 64 MiB, alternated 5x each: ns per tensor
# Output: the log on stdout; with $OUT set, $OUT/native-log.txt and $OUT/native.json.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=scripts/gpu/torch
. $here/common.sh

main() {
    start=$(date +%s)
    install_wheel || return 1
    work=$(mktemp -d)
    rc=0

    step "(1) capability checks (cudamem installed)"
    timeout 420 python3 $here/native_check.py || { echo "checks FAILED"; rc=1; }
    echo "-- the same snapshot frames with torch's allocator, for comparison:"
    timeout 120 python3 $here/native_check.py --mode native --only frames

    step "(1b) CUDA tensors sent to another process (torch.multiprocessing)"
    timeout 600 python3 $here/ipc_check.py || { echo "IPC checks FAILED"; rc=1; }

    step "(2) graph checks under compute-sanitizer memcheck"
    if command -v compute-sanitizer >/dev/null; then
        CUDAMEM_UNDER_SANITIZER=1 timeout 300 compute-sanitizer --tool memcheck --target-processes all \
            python3 $here/native_check.py --only graphs >"$work/memcheck.txt" 2>&1
        m=$?
        grep -E "^PASS|^FAIL|left out|passed|ERROR SUMMARY" "$work/memcheck.txt"
        [ "$m" -eq 0 ] || { echo "memcheck FAILED"; rc=1; }
    else
        echo "SKIPPED: compute-sanitizer not found"
    fi

    step "(3) profiler memory: torch's allocator vs cudamem"
    timeout 120 python3 $here/native_check.py --mode native --profile-json "$work/prof-native.json" >/dev/null
    timeout 120 python3 $here/native_check.py --mode cudamem --profile-json "$work/prof-cudamem.json" >/dev/null
    python3 - "$work" <<'PY' || rc=1
import json, sys
w = sys.argv[1]
n, c = json.load(open(f"{w}/prof-native.json")), json.load(open(f"{w}/prof-cudamem.json"))
print(f"{'operator':<28}{'native':>14}{'cudamem':>14}")
for k in sorted(set(n) | set(c)):
    print(f"{k:<28}{n.get(k, 0):>14}{c.get(k, 0):>14}")
bad = [k for k in set(n) | set(c) if abs(n.get(k, 0) - c.get(k, 0)) > 512 * 1024]
print("profiler per-operator memory:", "EQUAL within block rounding" if not bad else f"DIFFERENT: {bad}")
sys.exit(1 if bad else 0)
PY

    step "(4) torch.compile(mode='reduce-overhead') training: losses, alternated"
    runs=${NATIVE_COMPILE_RUNS:-2}
    for i in $(seq 1 "$runs"); do
        for m in native cudamem; do
            timeout 300 python3 $here/native_check.py --mode $m --compile-train "$work/loss-$m-$i.json" --steps 20 \
                | tail -n 1 | cut -c1-200 || { echo "compile training $m FAILED"; rc=1; }
        done
    done
    python3 - "$work" <<'PY' || rc=1
import json, sys
w = sys.argv[1]
import glob
L = {k: [json.load(open(f)) for f in sorted(glob.glob(f"{w}/loss-{k}-*.json"))] for k in ("native", "cudamem")}
spread = max((abs(a - b) for a, b in zip(*L["native"][:2])), default=0.0) if len(L["native"]) > 1 else 0.0
diff = max(abs(x - y) for na in L["native"] for ca in L["cudamem"] for x, y in zip(na, ca))
print(f"final losses native {[l[-1] for l in L['native']]} cudamem {[l[-1] for l in L['cudamem']]}")
print(f"largest step difference: native vs native {spread:.3g}, native vs cudamem {diff:.3g}")
ok = diff <= max(spread * 2, 1e-3)
print("compile training losses:", "WITHIN native's spread" if ok else "OUTSIDE native's spread")
sys.exit(0 if ok else 1)
PY

    step "(5) torch.empty/del, ns per tensor, alternated"
    for i in 1 2 3 4 5; do
        for m in native cudamem; do
            timeout 120 python3 $here/native_check.py --mode $m --bench-json "$work/bench-$m-$i.json" | tail -n 1
        done
    done
    python3 - "$work" "${OUT:-}" <<'PY'
import json, statistics, sys
w, out = sys.argv[1], sys.argv[2]
B = {m: [json.load(open(f"{w}/bench-{m}-{i}.json")) for i in range(1, 6)] for m in ("native", "cudamem")}
rows = {}
for size in B["native"][0]:
    n = statistics.median(r[size] for r in B["native"])
    c = statistics.median(r[size] for r in B["cudamem"])
    rows[size] = {"native_ns": round(n, 1), "cudamem_ns": round(c, 1), "ratio": round(c / n, 3)}
    print(f"{size:>10} B  native {n:8.1f} ns  cudamem {c:8.1f} ns  cudamem/native {c / n:.3f}")
if out:
    json.dump({"empty_del": rows, "raw": B}, open(f"{out}/native.json", "w"), indent=1)
PY
    step "done (rc=$rc)"
    rm -rf "$CUDAMEM_CACHE_DIR" "$work"
    return $rc
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    main 2>&1 | tee "$OUT/native-log.txt"
    exit "${PIPESTATUS[0]}"
fi
main
