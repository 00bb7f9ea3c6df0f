"""Replay speed of two cudamem CLI builds, alternated in one run: python3 scripts/dev/replay_ab.py OLD_EXE NEW_EXE
(from the repository root; every tests/data trace, policies pytorch and cudamem, 11 rounds of compare --repeats 41)."""
import subprocess, sys, statistics, glob
old, new = sys.argv[1], sys.argv[2]
traces = sorted(glob.glob("tests/data/*.pickle.gz"))
res = {}
for rnd in range(11):
    for name, exe in ((("old", old), ("new", new)) if rnd % 2 == 0 else (("new", new), ("old", old))):
        for t in traces:
            out = subprocess.run([exe, "compare", t, "--policies", "pytorch,cudamem", "--repeats", "41"], capture_output=True, text=True).stdout
            for line in out.splitlines()[1:]:
                f = line.split()
                if len(f) > 3:
                    res.setdefault((f[0], f[1], name), []).append(float(f[-1]))
print("# replay ns/op, median of 11 alternated rounds (compare --repeats 41), OLD and NEW as given")
print(f"{'trace':32} {'policy':8} {'old':>8} {'new':>8} {'new/old':>8} {'new faster in':>14}")
for (t, p, n) in sorted(k for k in res if k[2] == "old"):
    o, w = res[(t, p, "old")], res[(t, p, "new")]
    wins = sum(b < a for a, b in zip(o, w))
    print(f"{t:32} {p:8} {statistics.median(o):8.1f} {statistics.median(w):8.1f} {statistics.median(w)/statistics.median(o):8.3f} {wins:>8}/{len(o)}")
