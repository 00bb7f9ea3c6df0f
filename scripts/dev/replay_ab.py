"""Replay speed of two cudamem CLI builds, alternated in one run:
    python3 scripts/dev/replay_ab.py OLD_EXE NEW_EXE [--warm] [--rounds N]
(from the repository root; every tests/data trace, policies pytorch and cudamem, N rounds (default 11) of
compare --repeats 41; --warm times warm passes, the cache filled by a first pass)."""
import argparse, subprocess, statistics, glob
ap = argparse.ArgumentParser()
ap.add_argument("old"); ap.add_argument("new")
ap.add_argument("--warm", action="store_true"); ap.add_argument("--rounds", type=int, default=11)
args = ap.parse_args()
old, new, rounds = args.old, args.new, args.rounds
traces = sorted(glob.glob("tests/data/*.pickle.gz"))
res = {}
for rnd in range(rounds):
    for name, exe in ((("old", old), ("new", new)) if rnd % 2 == 0 else (("new", new), ("old", old))):
        for t in traces:
            out = subprocess.run([exe, "compare", t, "--policies", "pytorch,cudamem", "--repeats", "41"] + (["--warm"] if args.warm else []), capture_output=True, text=True).stdout
            for line in out.splitlines()[1:]:
                f = line.split()
                if len(f) > 3:
                    res.setdefault((f[0], f[1], name), []).append(float(f[-1]))
print(f"# replay ns/op{', warm passes' if args.warm else ''}, median of {rounds} alternated rounds (compare --repeats 41), OLD and NEW as given")
print(f"{'trace':32} {'policy':8} {'old':>8} {'new':>8} {'new/old':>8} {'round ratios':>15} {'new faster in':>14}")
for (t, p, n) in sorted(k for k in res if k[2] == "old"):
    o, w = res[(t, p, "old")], res[(t, p, "new")]
    wins = sum(b < a for a, b in zip(o, w))
    ratios = [b / a for a, b in zip(o, w)]
    print(f"{t:32} {p:8} {statistics.median(o):8.1f} {statistics.median(w):8.1f} {statistics.median(w)/statistics.median(o):8.3f}"
          f" {min(ratios):6.3f}-{max(ratios):6.3f} {wins:>8}/{len(o)}")
