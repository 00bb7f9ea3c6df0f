#!/usr/bin/env bash
# Headless-browser test of `cudamem viz`: renders the report of a shared trace in Chromium and
# checks that the page's code ran to the end without a console error and without any network
# request, then takes a screenshot.
#
#   scripts/viz/browser-test.sh [TRACE] [SCREENSHOT]
#
# TRACE defaults to tests/data/bert_varlen_infer.pickle.gz, SCREENSHOT to
# docs/img/viz-<trace name>.png. Also checks the `--policy pytorch-expandable` view (DOM only).
# Installs Debian's chromium with apt-get when it is missing (needs root). Set CUDAMEM to use a
# prebuilt binary instead of `cargo build --release -p cudamem-cli`.
#
# What it checks, per page:
#   * the <body> carries data-render-ok="1": the page's script reached its last line (it sets
#     the marker after drawing every view) and no data-render-error (set by window.onerror);
#   * opened with #selftest, the page drives its own interactions (the slider at 41 events,
#     hovers over the segment map and the timeline, zoom in and out) and checks at each of
#     those events that the segment map's reserved and allocated bytes equal the curves';
#     it then carries data-selftest-ok;
#   * Chromium's console log (--enable-logging=stderr) has no CONSOLE line at all: the page
#     writes nothing to the console, so any line is an uncaught exception ("Uncaught ..."), a
#     console.error/warn, or a Content-Security-Policy refusal (the page's CSP is
#     default-src 'none', so any attempt to fetch something is refused and logged). Host names
#     resolve to nothing (--host-resolver-rules), so nothing could leave the machine anyway;
#   * the screenshot is a PNG of the requested size.
set -euo pipefail

cd "$(dirname "$0")/../.."
TRACE=${1:-tests/data/bert_varlen_infer.pickle.gz}
NAME=$(basename "$TRACE")
NAME=${NAME%%.*}
SHOT=${2:-docs/img/viz-$NAME.png}
START=$(date +%s.%N)

if ! command -v chromium >/dev/null 2>&1; then
    echo "browser-test: chromium is missing; installing chromium and fonts-dejavu-core now (apt-get update, apt-get install; needs root)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi

if [ -z "${CUDAMEM:-}" ]; then
    cargo build --release -q -p cudamem-cli
    CUDAMEM=target/release/cudamem
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

FLAGS=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
       --disable-background-networking --disable-component-update --disable-sync
       "--host-resolver-rules=MAP * ~NOTFOUND")

fail() { echo "browser-test: FAIL: $*" >&2; exit 1; }

# check_page HTML LABEL [MARKER]: load the page, dump the DOM after its scripts ran, check the
# marker attribute of <body>, scan the console.
check_page() {
    local html=$1 label=$2 marker=${3:-'data-render-ok="1"'}
    local profile
    profile=$(mktemp -d -p "$WORK")
    timeout 120 chromium "${FLAGS[@]}" --user-data-dir="$profile" --enable-logging=stderr --v=0 \
        --window-size=1400,1000 --virtual-time-budget=10000 --dump-dom "file://$html" \
        >"$WORK/$label.dom" 2>"$WORK/$label.log" || fail "$label: chromium exited with $?"
    grep -q "<body[^>]*$marker" "$WORK/$label.dom" \
        || { grep CONSOLE "$WORK/$label.log" >&2 || true; fail "$label: no $marker on <body>"; }
    if grep -q 'data-render-error="' "$WORK/$label.dom"; then
        fail "$label: the page reported an error: $(grep -o 'data-render-error="[^"]*"' "$WORK/$label.dom")"
    fi
    if grep -E ':CONSOLE|Uncaught|Content Security Policy|Refused to' "$WORK/$label.log" >&2; then
        fail "$label: console output: errors or refused requests (above)"
    fi
    echo "browser-test: $label: rendered, no console errors, no network requests$(grep -o ' data-selftest-ok="[0-9]*"' "$WORK/$label.dom" | sed 's/ data-selftest-ok="\([0-9]*\)"/, self-test: \1 hover checks passed/')"
}

"$CUDAMEM" viz "$TRACE" -o "$WORK/report.html" 2>/dev/null
SIZE=$(wc -c <"$WORK/report.html")
check_page "$WORK/report.html" recorded
check_page "$WORK/report.html#selftest" recorded-selftest 'data-selftest-ok="[1-9]'

"$CUDAMEM" viz "$TRACE" --policy pytorch-expandable -o "$WORK/expandable.html" 2>/dev/null
check_page "$WORK/expandable.html" pytorch-expandable
check_page "$WORK/expandable.html#selftest" pytorch-expandable-selftest 'data-selftest-ok="[1-9]'

mkdir -p "$(dirname "$SHOT")"
timeout 120 chromium "${FLAGS[@]}" --user-data-dir="$(mktemp -d -p "$WORK")" --hide-scrollbars \
    --window-size=1400,1000 --virtual-time-budget=10000 --screenshot="$PWD/$SHOT" \
    "file://$WORK/report.html" >/dev/null 2>&1 || fail "screenshot: chromium exited with $?"
[ -s "$SHOT" ] || fail "no screenshot at $SHOT"
python3 - "$SHOT" <<'EOF' || fail "the screenshot is not a 1400x1000 PNG"
import struct, sys
b = open(sys.argv[1], "rb").read(24)
assert b[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
w, h = struct.unpack(">II", b[16:24])
assert (w, h) == (1400, 1000), (w, h)
EOF

END=$(date +%s.%N)
printf 'browser-test: OK: %s (%s KiB report), screenshot %s, %.1f s\n' \
    "$TRACE" $((SIZE / 1024)) "$SHOT" "$(awk "BEGIN{print $END - $START}")"
