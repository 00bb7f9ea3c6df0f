"""The torch-free half of :mod:`cudamem.estimate`, shared by the estimate, the largest-batch
search (:mod:`cudamem._largest_batch`) and the recorder (:mod:`cudamem._estimate_torch`): the
trace the recorder writes, the cuBLAS workspace rule, the replays on the simulated GPU, the
result object and its table, the scaling of traces and the one-line answers, and the checks of
arguments. :mod:`cudamem.estimate` re-exports the public ones.

Guarantees: a recorded trace is a PyTorch snapshot dict that every cudamem reader accepts; an
argument of the wrong type raises ``TypeError`` and a bad value ``ValueError``, each naming the
argument.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from typing import Any, Dict, Iterator, List, Optional, Sequence

from . import _cudamem

#: Policies an estimate replays by default: PyTorch's allocator, then cudamem's default.
DEFAULT_POLICIES = ("pytorch", "cudamem")


#: The smallest capacity taken: less is surely a size given in bytes where GiB were meant.
MIN_CAPACITY = 1 << 20


def capacity_bytes(capacity: Any, name: str = "device_memory") -> int:
    """Bytes of a capacity given as an int (bytes), a size string (``"24GiB"``; a bare number
    is bytes) or a GPU name (``"h100-80gb"``, ``"a100-40gb"``, ``"h200"``). Under
    :data:`MIN_CAPACITY` or over 2**64 - 1 bytes is a ValueError."""
    if isinstance(capacity, bool) or not isinstance(capacity, (int, str)):
        raise TypeError(f"{name}: expected bytes, a size string or a GPU name, got {type(capacity).__name__}")
    if isinstance(capacity, str):
        try:
            capacity = _cudamem._estimate_capacity(capacity)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    if not MIN_CAPACITY <= capacity < 1 << 64:
        raise ValueError(f"{name}: a capacity from 1 MiB to 2**64 - 1 bytes, got {capacity} bytes "
                         "(a bare number is bytes: write e.g. '24GiB')")
    return capacity


def int_arg(value: Any, name: str, low: int, high: int = (1 << 64) - 1) -> int:
    """An int argument in [low, high]: TypeError naming it when not an int, ValueError when
    outside."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name}: an int from {low} to {high}, got {value}")
    return value


def human(n: float) -> str:
    """Bytes in binary units, as cudamem's CLI prints them."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, i = float(n), 0
    while v >= 1024 and i < len(units) - 1:
        v, i = v / 1024, i + 1
    return f"{int(v)} {units[i]}" if i == 0 else f"{v:.2f} {units[i]}"


def cublas_workspace_bytes(config: Optional[str] = None, major: int = 9) -> int:
    """The cuBLAS workspace torch allocates per (handle, stream) at its first matrix product:
    from ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KIB:COUNT`` pairs), else torch's default for the
    compute capability ``major`` (32 MiB from Hopper on, 8 MiB + 128 KiB before)."""
    if config is None:
        config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if not isinstance(config, (str, type(None))):
        raise TypeError(f"config: expected a CUBLAS_WORKSPACE_CONFIG string, got {type(config).__name__}")
    if config:
        parts = config.split(":")
        if parts[0] != "" or len(parts) % 2 != 1:
            raise ValueError(f"CUBLAS_WORKSPACE_CONFIG={config!r}: expected ':SIZE_KIB:COUNT[:SIZE_KIB:COUNT...]'")
        try:
            nums = [int(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"CUBLAS_WORKSPACE_CONFIG={config!r}: sizes and counts are integers") from None
        return sum(nums[i] * 1024 * nums[i + 1] for i in range(0, len(nums), 2))
    return 4096 * 1024 * 8 if major >= 9 else 4096 * 1024 * 2 + 16 * 1024 * 8


def cublaslt_workspace_bytes(config: Optional[str] = None) -> int:
    """The cuBLASLt workspace torch allocates once per stream, next to the first cuBLAS
    workspace: ``CUBLASLT_WORKSPACE_SIZE`` KiB, 1024 by default."""
    if config is None:
        config = os.environ.get("CUBLASLT_WORKSPACE_SIZE")
    if not config:
        return 1024 * 1024
    try:
        kib = int(config)
    except ValueError:
        raise ValueError(f"CUBLASLT_WORKSPACE_SIZE={config!r}: expected a size in KiB") from None
    if kib < 0:
        raise ValueError(f"CUBLASLT_WORKSPACE_SIZE={config!r}: a size cannot be negative")
    return kib * 1024


class TraceBuilder:
    """Allocation events in program order, written as a PyTorch memory snapshot.

    ``alloc(key, size)`` and ``free(key)`` take any hashable key (the recorder uses a storage's
    identity); each live allocation gets an address of its own, so a key reused after its free
    is a new allocation. Frees are immediate (``free_requested`` then ``free_completed``): no
    kernel runs, so no stream can still be using the memory."""

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self.events: List[dict] = []
        self._live: Dict[Any, tuple] = {}
        self._next = 0x7F0000000000
        self.peak_live = 0
        self._live_bytes = 0

    def alloc(self, key: Any, size: int, stream: int = 0, frames: Optional[list] = None) -> None:
        if size <= 0:
            return  # PyTorch's allocator hands out no memory (and records nothing) for 0 bytes
        if key in self._live:
            self.free(key)
        addr = self._next
        self._next += (size + 511) // 512 * 512 + 512
        self._live[key] = (addr, size, stream)
        self._live_bytes += size
        self.peak_live = max(self.peak_live, self._live_bytes)
        self._event("alloc", addr, size, stream, frames)

    def free(self, key: Any) -> None:
        got = self._live.pop(key, None)
        if got is None:
            return
        addr, size, stream = got
        self._live_bytes -= size
        self._event("free_requested", addr, size, stream)
        self._event("free_completed", addr, size, stream)

    def empty_cache(self) -> None:
        """The allocator releases its cached blocks here (``emptyCache()``): written as one
        ``segment_free``, which replays as ``empty_cache()`` whatever it releases."""
        self._event("segment_free", 0, 0, 0)

    def live(self, key: Any) -> bool:
        return key in self._live

    def _event(self, action: str, addr: int, size: int, stream: int, frames: Optional[list] = None) -> None:
        self.events.append(
            {"action": action, "addr": addr, "size": size, "stream": stream,
             "time_us": len(self.events), "frames": frames or []}
        )

    def snapshot(self) -> dict:
        """The events as ``torch.cuda.memory._snapshot()`` lays them out (no segments: the
        replay decides those)."""
        traces: List[list] = [[] for _ in range(self.device + 1)]
        traces[self.device] = list(self.events)
        return {"segments": [], "device_traces": traces}

    def pickle(self) -> bytes:
        return pickle.dumps(self.snapshot(), protocol=4)


class Estimate:
    """What a GPU-free estimate found: per policy, the peak reserved (and whether it fits
    ``device_memory``: in at least :data:`LIKELY_SHARE` of the segment orders it is replayed
    in, as :func:`largest_batch` counts), the peak of live tensor bytes, and what the estimate
    leaves out."""

    def __init__(self, rows: List[dict], peak_live: int, left_out: List[str], notes: List[str],
                 trace: dict, device_memory: Optional[int]) -> None:
        self.rows = rows
        self.peak_requested = peak_live
        self.left_out = left_out
        self.notes = notes
        self.trace = trace
        self.device_memory = device_memory

    @property
    def peak_reserved(self) -> Dict[str, int]:
        """Peak reserved bytes by policy (on ``device_memory``: where the job fits, the most
        among the segment orders it fits in)."""
        return {r["policy"]: fitting_peak(r) for r in self.rows}

    def fits(self, policy: str = "pytorch") -> Optional[bool]:
        """Whether the job fits ``device_memory`` with ``policy`` (None: no memory given)."""
        for r in self.rows:
            if r["policy"] == policy:
                return None if self.device_memory is None else likely(r)
        raise ValueError(f"policy {policy!r} was not estimated (estimated: {[r['policy'] for r in self.rows]})")

    def save(self, path: str) -> str:
        """Writes the recorded trace as a snapshot pickle (for ``cudamem replay``/``why``/``viz``)."""
        with open(path, "wb") as f:
            pickle.dump(self.trace, f, protocol=4)
        return path

    def as_dict(self) -> dict:
        return {"policies": self.rows, "peak_requested_bytes": self.peak_requested,
                "device_memory_bytes": self.device_memory, "left_out": self.left_out, "notes": self.notes}

    def __str__(self) -> str:
        lines = [f"{'policy':<20} {'peak reserved':>14} {'peak requested':>15}" +
                 ("   fits" if self.device_memory is not None else "")]
        for r in self.rows:
            fit = ""
            if self.device_memory is not None:
                fit = "   yes" if likely(r) else "   no"
                if "orders_fit" in r and r["orders_fit"] < r["orders"]:
                    fit += f" (in {r['orders_fit']} of {r['orders']} segment orders)"
                elif not likely(r):
                    fit += f" ({r['ooms']} allocations fail)"
            lines.append(f"{r['policy']:<20} {human(fitting_peak(r)):>14} "
                         f"{human(r['peak_requested_bytes']):>15}{fit}")
        if self.device_memory is not None:
            lines.append(f"on a GPU of {human(self.device_memory)}")
        for n in self.notes:
            lines.append(f"note: {n}")
        for n in self.left_out:
            lines.append(f"not counted: {n}")
        return "\n".join(lines)

    __repr__ = __str__


def replay(trace: Any, policies: Sequence[str] = DEFAULT_POLICIES, capacity: Any = "h200",
           config: Optional[str] = None, orders: int = 0) -> List[dict]:
    """A snapshot (dict, bytes or path) replayed with each policy on a simulated GPU. With
    ``orders`` > 0 each row also has ``orders_fit`` of ``orders`` + 1 segment orders (the
    simulator's own and seeded shuffles) in which it ran without a failed allocation,
    ``orders_fit_peak_reserved_bytes``, the highest peak among those (None if none), and
    ``orders_likely``: whether that is enough to count as fitting (:data:`LIKELY_SHARE`)."""
    from . import _trace_bytes

    int_arg(orders, "orders", 0, (1 << 16) - 1)
    data, source = _trace_bytes(trace)
    pols = policy_list(policies)
    return json.loads(_cudamem._estimate_replay(data, source, pols, capacity_bytes(capacity, "capacity"), config,
                                                orders))


def policy_list(policies: Any) -> List[str]:
    if isinstance(policies, str):
        policies = [p.strip() for p in policies.split(",") if p.strip()]
    if isinstance(policies, (bytes, dict)) or not hasattr(policies, "__iter__"):
        raise TypeError(f"policies: expected policy names, got {type(policies).__name__}")
    pols = list(policies)
    for p in pols:
        if not isinstance(p, str):
            raise TypeError(f"policies: expected policy names (str), got {type(p).__name__} {p!r}")
    if not pols:
        raise ValueError("policies: expected policy names, got none")
    return pols


def scale(traces: Sequence[Any], batches: Sequence[int], at: Optional[int] = None,
          capacity: Any = None, policies: Sequence[str] = ("pytorch", "pytorch-expandable", "cudamem"),
          config: Optional[str] = None, degree: int = 1, limit: int = 1 << 20) -> dict:
    """Traces of one job at ``batches`` scaled to batch ``at`` and searched for the largest batch
    that fits ``capacity``: ``cudamem scale --json``'s object plus a ``headline``."""
    from . import _trace_bytes

    for arg, seq in (("traces", traces), ("batches", batches)):
        if not isinstance(seq, (list, tuple)):
            raise TypeError(f"{arg}: expected a list, one per batch size, got {type(seq).__name__}")
    if len(traces) != len(batches):
        raise ValueError(f"{len(traces)} traces but {len(batches)} batch sizes: give one batch size per trace")
    for b in batches:
        int_arg(b, "batches", 1)
    if at is not None:
        int_arg(at, "at", 1)
    int_arg(degree, "degree", 0, 1 << 16)
    int_arg(limit, "limit", 1)
    data = [_trace_bytes(t) for t in traces]
    cap = None if capacity is None else capacity_bytes(capacity, "capacity")
    out = json.loads(_cudamem._estimate_scale(data, list(batches), at, cap, policy_list(policies), config,
                                              degree, limit))
    out["headline"] = headline(out)
    return out


def headline(result: dict) -> str:
    """The one-line answer of a :func:`scale` or :func:`largest_batch` result, for the first
    policy: where the result has a safe batch, that batch first, then the band that may fit and
    the first batch expected to fail."""
    parts = []
    if result.get("at"):
        p = result["at"][0]
        parts.append(f"at batch {p['batch']} this job needs {human(p['peak_reserved_bytes'])} reserved")
    if result.get("largest"):
        lg = result["largest"][0]
        if lg["largest_batch"] is None:
            parts.append(f"not even batch 1 fits {human(lg['capacity_bytes'])}")
        elif "safe_batch" in lg:
            parts.extend(_safe_headline(lg))
        else:
            parts.append(f"{lg['largest_batch']} fits with {human(lg['spare_bytes'])} to spare")
            may = {int(b): f for b, f in (lg.get("may_fit") or {}).items() if int(b) > lg["largest_batch"]}
            if may:
                n = lg["orders"]
                shares = ", ".join(f"{b} in {f} of {n}" for b, f in sorted(may.items()))
                parts.append(f"{'batches' if len(may) > 1 else 'batch'} {min(may)}"
                             f"{'-' + str(max(may)) if len(may) > 1 else ''} may fit, as the driver places "
                             f"segments (segment orders that fit: {shares})")
    pol = (result.get("at") or result.get("largest") or [{"policy": ""}])[0]["policy"]
    return "; ".join(parts) + f" ({pol})"


def _safe_headline(lg: dict) -> List[str]:
    """The safe batch, the may-fit band and the first expected failure of a largest-batch row."""
    parts = []
    pct = f"{100 * lg['safe_margin']:g}%"
    if lg["safe_batch"] is None:
        parts.append(f"no batch is safe on {human(lg['capacity_bytes'])} (none fits in every segment order "
                     f"with {pct} of the memory to spare)")
    else:
        parts.append(f"batch {lg['safe_batch']} is safe on {human(lg['capacity_bytes'])} (it fits in every "
                     f"segment order with {pct} of the memory to spare; it reserves "
                     f"{human(lg['safe_peak_reserved_bytes'])})")
    band = lg.get("may_fit_band")
    if band:
        lo, hi = band
        parts.append(f"{'batch ' + str(lo) if lo == hi else f'batches {lo}-{hi}'} may fit (batch {hi} fits in "
                     f"{lg['largest_fits_in']} of {lg['orders']} segment orders, "
                     f"{human(lg['spare_bytes'])} to spare)")
    if lg.get("first_failing_batch"):
        nb = lg["first_failing_batch"]
        fits_in = lg.get("next_batch_fits_in")
        parts.append(f"batch {nb} is expected to fail" + (f" (it fits in {fits_in} of {lg['orders']} segment "
                                                          "orders)" if fits_in else ""))
    elif not lg.get("verified"):
        parts.append(f"the search stopped before it found a batch that fails (largest seen to fit: "
                     f"{lg['largest_batch']})")
    return parts


#: Shuffled segment orders each candidate batch is replayed in, beside the simulator's own, and
#: the share of all orders a batch must fit in to count as fitting (cudamem-estimate's
#: ``orders`` module, which ``cudamem scale`` uses too). Near the cap, whether PyTorch's
#: out-of-memory retry can release enough depends on which segments hold the live blocks, and
#: PyTorch picks between equal free blocks by address, which the driver chooses (its order
#: differs between two runs of one program). The share is set from H200 runs
#: (docs/guide/will-it-fit.md).
ORDERS, LIKELY_SHARE = _cudamem._estimate_orders()


@contextlib.contextmanager
def recording(compute_capability: int = 9) -> Iterator[Any]:
    """``with recording() as rec:`` records the block as :func:`estimate` records ``fn``; then
    ``rec.estimate(device_memory=...)``."""
    try:
        from . import _estimate_torch
    except ImportError as e:  # torch missing or too old
        raise RuntimeError(f"cudamem.estimate needs torch: {e}") from None
    rec = _estimate_torch.Recorder(compute_capability=compute_capability)
    with rec:
        yield rec


def likely(row: dict) -> bool:
    """A replay row fits: in enough segment orders where they were counted (the replay says),
    else with no failed allocation."""
    return row["orders_likely"] if "orders_likely" in row else row["ooms"] == 0


def fitting_peak(row: dict) -> int:
    """A row's peak reserved; where orders were counted and the row fits, the most among the
    orders it fits in (as cudamem scale reports its largest batch)."""
    if likely(row) and row.get("orders_fit_peak_reserved_bytes"):
        return row["orders_fit_peak_reserved_bytes"]
    return row["peak_reserved_bytes"]


def estimate_from(builder: TraceBuilder, left_out: List[str], notes: List[str], device_memory: Any,
                   policies: Sequence[str], config: Optional[str]) -> Estimate:
    """The replay half of an estimate (the recorder calls it with what it recorded)."""
    cap = None if device_memory is None else capacity_bytes(device_memory)
    snap = builder.snapshot()
    if not builder.events:
        raise ValueError("the recorded code allocated no CUDA memory: nothing to estimate")
    rows = replay(snap, policy_list(policies), cap if cap is not None else "h200", config,
                  ORDERS if cap is not None else 0)
    return Estimate(rows, builder.peak_live, left_out, notes, snap, cap)

