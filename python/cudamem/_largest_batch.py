"""The largest batch that fits a GPU, without a GPU (:func:`largest_batch`).

The job is recorded at a few small batches as :func:`cudamem.estimate.estimate` records it, the
recordings are scaled to a first guess (:func:`cudamem.estimate.scale`), and the guess is
verified: the job is recorded again at candidate batches and each recording replayed at the
capacity in every segment order of :data:`cudamem.estimate.ORDERS`, searching outwards from the
guess and then by bisection until batch ``b`` fits and ``b + 1`` does not. Guarantees: the
answer is a batch whose own recording was seen to fit, and (when ``verified``) whose successor
was seen not to; an argument of the wrong type raises ``TypeError`` and a bad value
``ValueError``, each naming the argument.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence

from .estimate import (DEFAULT_POLICIES, ORDERS, TraceBuilder, _fitting_peak, _int_arg, _likely, _policies,
                       capacity_bytes, headline, recording, replay, scale)

#: Batches past the largest one tried for ``may_fit``, at most.
MAY_FIT_SPAN = 4


def largest_batch(fn: Callable, device_memory: Any, *args: Any, batches: Sequence[int] = (1, 2, 3),
                  at: Optional[int] = None, policies: Sequence[str] = DEFAULT_POLICIES, degree: int = 1,
                  compute_capability: int = 9, verify: bool = True, max_probes: int = 24,
                  **kwargs: Any) -> dict:
    """The largest batch that fits ``device_memory``, without a GPU: ``fn(batch, *args,
    **kwargs)`` recorded as :func:`estimate` records it at each of ``batches``, then scaled as
    :func:`scale` scales real traces (``at``: also the peak at that batch).

    With ``verify`` (the default) the scaled answer is only a first guess: ``fn`` is recorded
    again at candidate batches and each recording replayed at ``device_memory``, searching
    outwards from the guess and then by bisection until batch ``b`` fits and ``b + 1`` does not.
    Each ``largest`` row then carries ``scaled_batch`` (the guess), ``largest_batch`` (the
    verified answer), ``probes`` (batch -> fits) and ``verified`` (False when ``max_probes``
    recordings did not settle it; ``largest_batch`` is then the largest batch seen to fit).

    Each recording is replayed in ``orders`` segment orders (the simulator's own and
    :data:`ORDERS` seeded shuffles), and a batch fits when it runs without a failed allocation
    in at least :data:`LIKELY_SHARE` of them: ``largest_fits_in`` says in how many the answer
    does, ``may_fit`` maps each later batch that fits in fewer (but some) orders to how many (up
    to :data:`MAY_FIT_SPAN` batches on, stopping at the first that fits in none), and
    ``next_batch_borderline`` says whether the next batch is one of them."""
    if not callable(fn):
        raise TypeError(f"fn: expected the function to record, got {type(fn).__name__}")
    if not isinstance(batches, (list, tuple)):
        raise TypeError(f"batches: expected a list of batch sizes, got {type(batches).__name__}")
    if len(batches) < 2:
        raise ValueError(f"batches: two or more sizes to scale from, got {list(batches)!r}")
    for b in batches:
        _int_arg(b, "batches", 1)
    _int_arg(max_probes, "max_probes", 2)

    def record(b: int) -> TraceBuilder:
        with recording(compute_capability=compute_capability) as rec:
            fn(b, *args, **kwargs)
        return rec.builder

    traces = []
    for b in batches:
        builder = record(b)
        if not builder.events:
            raise ValueError(f"at batch {b} the recorded code allocated no CUDA memory: nothing to scale")
        traces.append(builder.snapshot())
    out = scale(traces, list(batches), at=at, capacity=device_memory, policies=policies, degree=degree)
    if verify:
        cap = capacity_bytes(device_memory)
        seen: Dict[int, tuple] = {}

        def replayed(b: int) -> Dict[str, dict]:
            # One recording at b answers for every policy.
            if b not in seen:
                snap = record(b).snapshot()
                seen[b] = (snap, {r["policy"]: r for r in replay(snap, _policies(policies), cap, None, ORDERS)})
            return seen[b][1]

        for row in out.get("largest", []):
            pol = row["policy"]
            _verify_largest(row, lambda b, p=pol: _likely(replayed(b)[p]), max_probes)
            b = row["largest_batch"]
            row["orders"] = ORDERS + 1
            # The figures of the verified batch and its successor, from their own replays.
            if b is not None:
                at_b = replayed(b)[pol]
                row["peak_reserved_bytes"] = _fitting_peak(at_b)
                row["spare_bytes"] = cap - row["peak_reserved_bytes"]
                row["largest_fits_in"] = at_b["orders_fit"]
            if b is not None and str(b + 1) in row["probes"]:
                row["next_batch"] = b + 1
                # Replayed on a device with room to spare: what it would reserve, not where it failed.
                row["next_batch_needs_bytes"] = replay(seen[b + 1][0], [pol], 8 * cap, None)[0]["peak_reserved_bytes"]
            if b is not None and row["verified"]:
                row["may_fit"] = {}
                for nb in range(b + 1, b + 1 + MAY_FIT_SPAN):
                    fit = replayed(nb)[pol]["orders_fit"]
                    if fit == 0:
                        break
                    row["may_fit"][str(nb)] = fit
                row["next_batch_borderline"] = str(b + 1) in row["may_fit"]
        out["headline"] = headline(out)
    return out


def _verify_largest(row: dict, fits: Callable[[int], bool], max_probes: int) -> None:
    """Replaces ``row["largest_batch"]`` (a guess) by the batch b with fits(b) and not
    fits(b + 1), found by galloping from the guess and bisecting; records what it probed.
    Assumes memory grows with the batch (fits is monotone); where it is not, the answer is still
    a batch seen to fit whose successor was seen to fail."""
    guess = row["largest_batch"] or 1
    probes: Dict[int, bool] = {}

    def probe(b: int) -> bool:
        if b not in probes:
            probes[b] = fits(b)
        return probes[b]

    lo, hi = None, None  # lo: largest batch seen to fit; hi: smallest seen to fail above lo
    if probe(guess):
        lo, step = guess, 1
        while hi is None and len(probes) < max_probes:
            if probe(lo + step):
                lo, step = lo + step, step * 2
            else:
                hi = lo + step
    else:
        hi, step = guess, 1
        while lo is None and hi > 1 and len(probes) < max_probes:
            b = max(1, hi - step)
            if probe(b):
                lo = b
            else:
                hi, step = b, step * 2
        if lo is None and hi == 1:
            lo = 0  # not even batch 1 fits
    while lo is not None and hi is not None and hi - lo > 1 and len(probes) < max_probes:
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    row["scaled_batch"] = row["largest_batch"]
    row["probes"] = {str(b): ok for b, ok in sorted(probes.items())}
    row["verified"] = lo is not None and hi is not None and hi - lo == 1
    row["largest_batch"] = None if not lo else lo
