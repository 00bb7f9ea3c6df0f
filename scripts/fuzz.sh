#!/usr/bin/env bash
# Runs cudamem's fuzz targets (fuzz/, cargo-fuzz + libFuzzer) for a bounded time each and prints
# the executions and findings per target.
#
#   bash scripts/fuzz.sh [seconds-per-target] [target...]
#
# seconds-per-target defaults to 60; targets default to all five: pickle rmm_csv compact config
# allocator_ops (see docs/reliability.md for what each checks). Runs one job at a time (the
# development machines have 2 cores), in libFuzzer's fork mode with crashes, timeouts and OOMs
# ignored, so that one known bug does not stop the search for others: every failing input is
# kept in fuzz/artifacts/<target>/ and triaged at the end with the plain (uninstrumented) build
# (debug) of fuzz/examples/run_inputs.rs, which prints each input's panic message.
#
# Needs only a stable toolchain: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its nightly flags.
# cargo-fuzz is installed (cargo install cargo-fuzz) when missing. The seed corpora are made
# from tests/data/*.pickle.gz by fuzz/examples/make_seeds.rs when fuzz/corpus/<target> is
# missing or empty; the corpora grow as the fuzzer finds new coverage (git-ignored).
#
# Environment: FUZZ_SANITIZER (default none: every crate fuzzed is safe Rust, cudamem-trace
# forbids unsafe code, so AddressSanitizer would only halve the speed; set `address` to use it
# anyway), FUZZ_RSS_MB (default 2048).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(pickle rmm_csv compact config allocator_ops)
sanitizer=${FUZZ_SANITIZER:-none}
rss=${FUZZ_RSS_MB:-2048}
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz is missing; installing it now (cargo install cargo-fuzz, into ~/.cargo/bin; a few minutes)"
    cargo install cargo-fuzz
fi

need_seeds=0
for t in "${targets[@]}"; do
    if [ ! -d "corpus/$t" ] || [ -z "$(ls -A "corpus/$t")" ]; then need_seeds=1; fi
done
if [ $need_seeds -eq 1 ]; then
    echo "fuzz.sh: making seed corpora from tests/data"
    cargo run --quiet --release --example make_seeds -- ..
fi

echo "fuzz.sh: building the targets (sanitizer: $sanitizer)"
cargo fuzz build -s "$sanitizer" >/dev/null 2>&1 || cargo fuzz build -s "$sanitizer"
# Triage build: debug, so that debug assertions and overflow checks fire as in the fuzz build.
cargo build --quiet --example run_inputs

max_len() {
    case $1 in
        config) echo 4096 ;;
        allocator_ops) echo 8192 ;;
        *) echo 131072 ;;
    esac
}

mkdir -p target/fuzz-logs
declare -a summary
for t in "${targets[@]}"; do
    mkdir -p "artifacts/$t"
    before=$(ls "artifacts/$t" | wc -l)
    log=target/fuzz-logs/$t.log
    echo "fuzz.sh: $t for $secs s (log: fuzz/$log)"
    # Fork mode: a child process fuzzes, the parent keeps the corpus and the crashes and goes on.
    cargo fuzz run -s "$sanitizer" "$t" -- \
        -max_total_time="$secs" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        -timeout=30 -rss_limit_mb="$rss" -max_len="$(max_len "$t")" -print_final_stats=1 \
        >"$log" 2>&1 || true
    # The parent's status lines start with '#<total executions>:'.
    execs=$(grep -aoE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
    [ -n "$execs" ] || execs=$(grep -aoE 'number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | paste -sd+ | bc 2>/dev/null || echo 0)
    corpus=$(ls "corpus/$t" | wc -l)
    after=$(ls "artifacts/$t" | wc -l)
    new=$((after - before))
    summary+=("$(printf '%-14s %12s executions  %6s corpus  %4s new failing inputs (%s kept)' "$t" "$execs" "$corpus" "$new" "$after")")
done

echo
echo "=== fuzz.sh summary: $secs s per target ==="
printf '%s\n' "${summary[@]}"
status=0
for t in "${targets[@]}"; do
    if [ -n "$(ls -A "artifacts/$t")" ]; then
        echo
        echo "--- $t: failing inputs (fuzz/artifacts/$t), by panic message ---"
        # One process per input, with the fuzzer's memory limit and a time limit: some inputs
        # are failing precisely because they take too much of either.
        for f in "artifacts/$t"/*; do
            out=$( (ulimit -v $((rss * 1024 * 2)); timeout 120 ./target/debug/examples/run_inputs "$t" "$f") 2>&1) && rc=0 || rc=$?
            msg=$(printf '%s\n' "$out" | grep -m 1 '^PANIC' | sed 's/^PANIC [^:]*: //' || true)
            if [ -n "$msg" ]; then
                echo "$msg"
            elif [ $rc -ne 0 ]; then
                echo "killed (exit $rc: over the memory or time limit)"
            else
                echo "passes now (it was over the fuzzer's -timeout or -rss_limit_mb, or the harness changed since)"
            fi
        done | sort | uniq -c | sort -rn | head -n 20
        status=1
    fi
done
[ $status -eq 0 ] && echo "no failing inputs"
exit $status
