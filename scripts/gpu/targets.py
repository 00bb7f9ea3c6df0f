#!/usr/bin/env python3
"""The H200 performance targets, judged from the outputs of `gpu_bench` and `replay_gpu`.

    python3 scripts/gpu/targets.py DIR_OR_FILE...

Reads the files named, or in a directory (searched recursively) every `.txt` whose name contains
`gpu_bench` or `replay_gpu`, and prints, per file and per output found in it, whether each
target holds:

* gpu_bench, pair: the cudamem cache-hit alloc+free pair through the CUDA device is at most
  200 ns (100 per operation) at every size of the latency table (each cell is the median of
  the rounds, in outputs measured in rounds); an output measured on the simulated device is
  not judged;
* gpu_bench, threads: with `sharded:True`, 8 threads reach at least 4x one thread (the table's
  "ratio to 1 thread" column: the median of the rounds' own ratios, in outputs measured in
  rounds);
* replay_gpu: the cuda:0 warm ns/op of every trace is at most 100 with both the `pytorch` and
  the `cudamem` policy (the cell's median of rounds, in outputs measured in rounds), and the
  run printed "disagreements: 0".

A file whose figures are missing (no GPU: "n/a" columns; a run cut short) is reported as such,
never as met. Exit status: 0 if every target judged held in every file, 1 otherwise, 2 on a
usage error. `--self-test` checks the parser on the outputs in docs/bench/results and on both
output formats (one round; rounds with a range column and a rounds table).
"""

import re
import sys
from pathlib import Path

PAIR_LIMIT_NS = 200.0
THREAD_RATIO = 4.0
REPLAY_LIMIT_NS = 100.0
NUMBER = re.compile(r"^-?[0-9]+(?:\.[0-9]+)?")


def first_number(cell):
    """The leading number of a table cell ("99.3 [70.1–127.1]" -> 99.3), None if there is none."""
    m = NUMBER.match(cell.strip())
    return float(m.group(0)) if m else None


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def judge_gpu_bench(text):
    """[(target, verdict, detail)] for one gpu_bench output."""
    out = []
    pairs = []
    section = None
    simulated = False
    for line in text.splitlines():
        if line.startswith("## ") or line.startswith("rounds:"):
            if section == "latency":
                break  # only the first latency table: the default allocator beside the driver
            section = "latency" if line.startswith("## alloc+free pair latency, ns (median; cudamem") else None
            continue
        if section == "latency" and line.startswith("| size | cudamem (sim)"):
            simulated = True
        c = cells(line) if section == "latency" and line.startswith("| ") else []
        # | 512 B | 119 | 82751 | 611 | ... : size, cudamem ns, then the driver's
        if len(c) >= 4 and re.fullmatch(r"[0-9]+ (B|KiB|MiB)", c[0]) and c[1].isdigit():
            pairs.append((c[0], float(c[1])))
    if simulated:
        out.append(("pair <= 200 ns at every size", None, "measured on the simulated device, not through CUDA"))
    elif pairs:
        worst = max(ns for _, ns in pairs)
        detail = ", ".join(f"{s} {ns:.0f}" for s, ns in pairs)
        out.append(("pair <= 200 ns at every size", worst <= PAIR_LIMIT_NS, detail))
    else:
        out.append(("pair <= 200 ns at every size", None, "no latency table"))
    ratio = None
    in_sharded = False
    for line in text.splitlines():
        if line.startswith("## "):
            in_sharded = line.startswith("## throughput, sharded:True")
        elif in_sharded and line.startswith("| 8 |"):
            ratio = first_number(cells(line)[2])
    if ratio is None:
        out.append(("8 threads sharded >= 4x one thread", None, "no sharded throughput table"))
    else:
        out.append(("8 threads sharded >= 4x one thread", ratio >= THREAD_RATIO, f"{ratio:.2f}x"))
    return out


def judge_replay_gpu(text):
    """[(target, verdict, detail)] for one replay_gpu output."""
    over, seen, missing = [], 0, []
    header_done = False
    for line in text.splitlines():
        if not line.startswith("| "):
            if header_done and seen:
                break  # the main table ended (the rounds table follows)
            continue
        c = cells(line)
        if c[0] == "trace" or set(c[0]) <= {"-"}:
            header_done = True
            continue
        if len(c) < 9 or c[1] not in ("pytorch", "cudamem"):
            continue
        ns = first_number(c[8])
        if ns is None:
            missing.append(f"{c[0]} {c[1]}")
            continue
        seen += 1
        if ns > REPLAY_LIMIT_NS:
            over.append(f"{c[0]} {c[1]} {ns:.1f}")
    agree = re.search(r"^disagreements: 0$", text, re.M) is not None
    target = "cuda:0 warm replay <= 100 ns/op, 4 traces x pytorch, cudamem"
    if missing or seen == 0:
        return [(target, None, "no cuda:0 figures: " + (", ".join(missing) or "no table"))]
    verdict = not over and agree
    detail = "all under" if not over else "over: " + ", ".join(over)
    if not agree:
        detail += "; disagreements printed (or the run was cut short)"
    return [(target, verdict, f"{seen} rows, {detail}")]


def files_of(args):
    for a in args:
        p = Path(a)
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*.txt") if "gpu_bench" in q.name or "replay_gpu" in q.name)
        elif p.is_file():
            yield p
        else:
            raise FileNotFoundError(f"{a}: no such file or directory")


def judge(path):
    """Judges what the file holds: a gpu_bench output, a replay_gpu output, or both in turn."""
    text = path.read_text(errors="replace")
    out = []
    if "## throughput" in text or "alloc+free pair latency" in text:
        out += judge_gpu_bench(text)
    if "| trace | policy |" in text:
        out += judge_replay_gpu(text)
    return out or [("gpu_bench or replay_gpu output", None, "neither found in the file")]


def self_test():
    root = Path(__file__).resolve().parents[2] / "docs/bench/results"
    bench = judge(root / "2026-12-01-h200-gpu_bench.txt")
    assert bench[0][1] is True and "1 MiB 148" in bench[0][2], bench
    assert bench[1][1] is True and bench[1][2] == "4.32x", bench
    rounds = judge(root / "2026-12-01-h200-replay_gpu.txt")
    assert rounds[0][1] is True and rounds[0][2].startswith("8 rows"), rounds
    sim = judge(root / "2026-12-01-h200-replay_sim.txt")
    assert sim[0][1] is None, sim  # sim only: n/a columns are not "met"
    # The one-round format (no range column): gpt2_train pytorch over 100.
    one = judge_replay_gpu(
        "| trace | policy | a | b | c | d | agree | sim | cuda |\n|---|---|---|---|---|---|---|---|---|\n"
        "| gpt2_train | pytorch | 1 | 1 | 1 | 1 | true | 115.6 | 116.1 |\n"
        "| gpt2_train | cudamem | 1 | 1 | 1 | 1 | true | 80.0 | 81.0 |\ndisagreements: 0\n"
    )
    assert one[0][1] is False and "gpt2_train pytorch 116.1" in one[0][2], one
    # The rounds format: a range column, then the rounds table (not parsed as sizes).
    head = "## alloc+free pair latency, ns (median; cudamem: cache hits, batches of 64; each cell the median of 5 rounds)\n\n"
    rows = "| 512 B | 150 | 120–260 | 90000 | 700 | 600x | 5x |\n| 64 MiB | 120 | 100–130 | 90000 | 700 | 750x | 6x |\n"
    tail = "\nrounds: cudamem ns / ...\n\n| size | round 1 |\n|---|---|\n| 512 B | 260 / 700 |\n"
    cols = "| size | {} | cudamem, rounds' range | a | b | c | d |\n|---:|---:|---:|---:|---:|---:|---:|\n"
    new = judge_gpu_bench(head + cols.format("cudamem (cuda:0)") + rows + tail)
    assert new[0][1] is True and new[0][2] == "512 B 150, 64 MiB 120", new
    sim = judge_gpu_bench(head + cols.format("cudamem (sim)") + rows + tail)
    assert sim[0][1] is None and "simulated" in sim[0][2], sim
    print("targets.py self-test: ok")


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        files = list(files_of(argv))
    except FileNotFoundError as e:
        print(f"targets.py: {e}", file=sys.stderr)
        return 2
    if not files:
        print("targets.py: no .txt file named after gpu_bench or replay_gpu found", file=sys.stderr)
        return 2
    held = judged = 0
    for f in files:
        for target, verdict, detail in judge(f):
            word = {True: "met", False: "NOT MET", None: "not judged"}[verdict]
            print(f"{f}: {target}: {word} ({detail})")
            if verdict is not None:
                judged += 1
                held += verdict
    print(f"{held} of {judged} judged targets met")
    return 0 if held == judged else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
