"""What online and offline placement could reach on a trace: a small heap simulator.

The engine's `cudamem` policy without reclaim is, for fragmentation, best fit in one growable
address range per (pool, stream), whose pages are never unmapped: its peak reserved is the
highest address any block reached, rounded to 2 MiB pages. This script replays a PyTorch
snapshot (`.pickle.gz`) through that model (it reproduces the engine's ratio on the shared
traces), through variants of it (large blocks in a range of their own; short-lived blocks,
known from the trace, in a range of their own or at the high end of holes; small requests in
a hole of the large range before the small range grows; large requests rounded up as
PyTorch's `roundup_power2_divisions` does), and through an
offline placement that knows every block's lifetime (greedy dynamic storage allocation:
largest first, each at the lowest offset free over its whole lifetime), and prints peak
reserved / peak requested for each.

    python3 scripts/dev/frag_sim.py tests/data/*.pickle.gz

Rules of the model: requests round up to 512 bytes; blocks of at most 1 MiB go to the small
pool; a block is freed at its `free_completed`; pools and streams never share memory.
"""

import bisect
import gzip
import pickle
import sys

MiB = 1 << 20
PAGE = 2 * MiB


def load(path):
    """Allocations in order: [size, stream, index of the op that frees it or None], and frees."""
    tr = pickle.load(gzip.open(path))["device_traces"][0]
    ev, live = [], {}
    for e in tr:
        if e["action"] == "alloc":
            live[e["addr"]] = len(ev)
            ev.append(["a", e["size"], e["stream"], None])
        elif e["action"] == "free_completed" and e["addr"] in live:
            i = live.pop(e["addr"])
            ev.append(["f", i])
    for j, x in enumerate(ev):
        if x[0] == "f":
            ev[x[1]][3] = j
    return ev


def rnd(s):
    return max(512, (s + 511) // 512 * 512)


class Heap:
    """A growable range: free holes by address; best fit, else growth at the end."""

    def __init__(self, short_high=False):
        self.free, self.top, self.maxtop, self.short_high = [], 0, 0, short_high

    def fits(self, size, hole_max=None):
        """Whether a hole holds `size` bytes (no growth needed), among holes of at most
        `hole_max` bytes if given."""
        return any(z >= size and (hole_max is None or z <= hole_max) for _, z in self.free)

    def alloc(self, size, short=False, hole_max=None):
        fr = self.free
        fits = [i for i, (a, z) in enumerate(fr) if z >= size and (hole_max is None or z <= hole_max)]
        if fits and short and self.short_high:
            i = max(fits, key=lambda i: fr[i][0])  # highest hole, its high end
            a, z = fr[i]
            if z == size:
                fr.pop(i)
                return a
            fr[i] = (a, z - size)
            return a + z - size
        if fits:
            i = min(fits, key=lambda i: (fr[i][1], fr[i][0]))
            a, z = fr[i]
            if z == size:
                fr.pop(i)
            else:
                fr[i] = (a + size, z - size)
            return a
        if fr and fr[-1][0] + fr[-1][1] == self.top:
            addr = fr.pop()[0]
        else:
            addr = self.top
        self.top = addr + size
        self.maxtop = max(self.maxtop, self.top)
        return addr

    def release(self, addr, size):
        fr = self.free
        i = bisect.bisect(fr, (addr, 0))
        if i < len(fr) and addr + size == fr[i][0]:
            size += fr.pop(i)[1]
        if i > 0 and fr[i - 1][0] + fr[i - 1][1] == addr:
            fr[i - 1] = (fr[i - 1][0], fr[i - 1][1] + size)
        else:
            fr.insert(i, (addr, size))


def round_power2(size, div):
    """`size` rounded up to a multiple of 1/`div` of its power of two (large requests only)."""
    if size <= MiB:
        return size
    step = max((1 << (size.bit_length() - 1)) // div, 512)
    return (size + step - 1) // step * step


def online(ev, split=None, short=None, short_high=False, small_fallback=False, round_div=None):
    """Peak reserved / peak requested of best fit; `split(size, lifetime)` sends a large block
    to a range of its own when true; `short(size, lifetime)` marks it short-lived;
    `small_fallback` serves a small request that would grow the small range from a hole of the
    same stream's large range instead, when one fits (True: any hole; a number: holes of at
    most that many bytes); `round_div` rounds large requests with `round_power2`."""
    heaps, blocks, live, peak = {}, {}, 0, 0
    for j, x in enumerate(ev):
        if x[0] == "a":
            size = rnd(x[1])
            if round_div:
                size = round_power2(size, round_div)
            life = (x[3] if x[3] is not None else len(ev)) - j
            key = ("s" if size <= MiB else "l", x[2])
            if split and key[0] == "l":
                key += (split(size, life),)
            h = heaps.setdefault(key, Heap(short_high))
            hole_max = None
            if small_fallback and key[0] == "s" and not h.fits(size):
                big = heaps.get(("l", x[2]))
                cap = None if small_fallback is True else small_fallback
                if big is not None and big.fits(size, cap):
                    h, hole_max = big, cap
            blocks[j] = (h, h.alloc(size, bool(short and short(size, life)), hole_max), size, x[1])
            live += x[1]
            peak = max(peak, live)
        else:
            h, addr, size, req = blocks.pop(x[1])
            h.release(addr, size)
            live -= req
    return sum((h.maxtop + PAGE - 1) // PAGE * PAGE for h in heaps.values()) / peak


def offline(ev):
    """Greedy dynamic storage allocation on the recorded lifetimes, per (pool, stream)."""
    pools, lv, live, peak = {}, {}, 0, 0
    for j, x in enumerate(ev):
        if x[0] == "a":
            size = rnd(x[1])
            key = ("s" if size <= MiB else "l", x[2])
            pools.setdefault(key, []).append((j, x[3] if x[3] is not None else len(ev), size))
            live += x[1]
            lv[j] = x[1]
            peak = max(peak, live)
        else:
            live -= lv.pop(x[1])
    total = 0
    for items in pools.values():
        placed, top = [], 0
        for s, e, z in sorted(items, key=lambda t: (-t[2], t[0])):
            off = 0
            for a, b in sorted((o, o + zz) for (ss, ee, o, zz) in placed if ss < e and s < ee):
                if a - off >= z:
                    break
                off = max(off, b)
            placed.append((s, e, off, z))
            top = max(top, off + z)
        total += (top + PAGE - 1) // PAGE * PAGE
    return total / peak


def when_reached(ev):
    """Where best fit's reserved memory reaches 99% of its final total, and where live bytes
    first reach their peak, as fractions of the trace's operations."""
    heaps, blocks, live, peak, growth, lives = {}, {}, 0, 0, [], []
    for j, x in enumerate(ev):
        if x[0] == "a":
            size = rnd(x[1])
            h = heaps.setdefault(("s" if size <= MiB else "l", x[2]), Heap())
            top = h.maxtop
            blocks[j] = (h, h.alloc(size), size, x[1])
            live += x[1]
            if h.maxtop > top:
                growth.append((j, sum(g.maxtop for g in heaps.values())))
            peak = max(peak, live)
        else:
            h, addr, size, req = blocks.pop(x[1])
            h.release(addr, size)
            live -= req
        lives.append(live)
    total = growth[-1][1]
    reached = next(j for j, t in growth if t >= 0.99 * total)
    return reached / len(ev), lives.index(peak) / len(ev)


EXPERIMENTS = [
    ("best fit (the cudamem policy)", lambda ev: online(ev)),
    ("blocks >= 64 MiB in a range of their own", lambda ev: online(ev, split=lambda s, l: s >= 64 * MiB)),
    ("lifetime < 1000 ops in a range of their own", lambda ev: online(ev, split=lambda s, l: l < 1000)),
    ("lifetime < 30 ops at the high end of holes", lambda ev: online(ev, short=lambda s, l: l < 30, short_high=True)),
    ("small requests in a large hole before growing", lambda ev: online(ev, small_fallback=True)),
    ("large sizes rounded to 1/16 of a power of 2", lambda ev: online(ev, round_div=16)),
    ("offline greedy placement (a plan)", offline),
]

if __name__ == "__main__":
    for path in sys.argv[1:]:
        ev = load(path)
        print(path.rsplit("/", 1)[-1])
        for name, f in EXPERIMENTS:
            print(f"  {name:46} {f(ev):.4f}", flush=True)
        reached, peak = when_reached(ev)
        print(f"  best fit reaches 99% of its reserve at {reached:.2f} of the trace, live bytes peak at {peak:.2f}")
