"""Combines the pytorch-tests.json of runs of pytorch_tests.sh over parts of the selection
(PYTORCH_TESTS_PART=1/2, 2/2, ...) into one table and summary, as one run would print them.

    python3 scripts/gpu/torch/pytorch_tests_merge.py PART1.json PART2.json [...]

A test in more than one file keeps its outcomes from the last file that ran it with both
allocators. Exits 1 when a test passes with torch's allocator and not with cudamem.
"""

import json
import sys


def summarize(selected, native, cudamem, label=""):
    """Prints the outcome counts and the summary line of a comparison (`native` and `cudamem`
    map test ids to [outcome, message]); returns (passed natively, passed with both,
    passed natively but not with cudamem)."""
    o = lambda res, i: res.get(i, ("-",))[0]  # noqa: E731
    passed = [i for i in selected if o(native, i) == "passed"]
    both = [i for i in passed if o(cudamem, i) == "passed"]
    regressions = [i for i in passed if i not in both]
    counts = {}
    for m, res in (("native", native), ("cudamem", cudamem)):
        counts[m] = {}
        for out, _ in res.values():
            counts[m][out] = counts[m].get(out, 0) + 1
    print(f"\noutcomes: native {counts['native']}; cudamem {counts['cudamem']}")
    print(f"SUMMARY{label}: {len(selected)} selected; {len(passed)} passed with torch's allocator; "
          f"{len(both)} of those passed with cudamem; passing natively but not with cudamem: "
          + (", ".join(f"{i} ({o(cudamem, i)})" for i in regressions) or "none"))
    only = [i for i in selected if o(cudamem, i) == "passed" and i not in passed]
    if only:
        print("passing with cudamem but not natively:", ", ".join(only))
    return passed, both, regressions


def main(paths):
    if not paths:
        sys.exit(__doc__)
    selected, native, cudamem = [], {}, {}
    for p in paths:
        try:
            d = json.load(open(p))
        except (OSError, ValueError) as e:
            sys.exit(f"{p}: not a pytorch-tests.json ({e})")
        for i in d["selected"]:
            if i not in selected:
                selected.append(i)
            n, c = d["native"].get(i), d["cudamem"].get(i)
            if i not in native or (n and c and n[0] != "not run" and c[0] != "not run"):
                native[i], cudamem[i] = n or ["-", ""], c or ["-", ""]
    w = max([len(i) for i in selected] + [20])
    print(f"{'test':<{w}}  {'native':<9} {'cudamem':<9}")
    for i in selected:
        print(f"{i:<{w}}  {native[i][0]:<9} {cudamem[i][0]:<9}")
    regressions = summarize(selected, native, cudamem, f" ({len(paths)} parts)")[2]
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
