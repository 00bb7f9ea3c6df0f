"""The largest batch that fits a GPU, without a GPU (:func:`largest_batch`).

The job is recorded at a few small batches as :func:`cudamem.estimate.estimate` records it, the
recordings are scaled to a first guess (:func:`cudamem.estimate.scale`), and the guess is
verified: the job is recorded again at candidate batches and each recording replayed at the
capacity in every segment order of :data:`ORDERS`, searching outwards from the guess and then by
bisection until batch ``b`` fits and ``b + 1`` does not.

Three answers come out, because one batch cannot be both safe and the largest that may run:

* the *safe* batch: the largest that fits in every segment order on a device
  :data:`SAFE_MARGIN` smaller than the one asked for (the margin is the estimate's own error on
  jobs it was not developed on; the segment orders are where the driver may put the segments);
* the *may fit* band: the batches above it up to the largest that fits in at least
  :data:`LIKELY_SHARE` of the orders on the full device (``largest_batch``): on the GPU they run
  in some processes and not in others, or run only if the estimate erred on the safe side;
* the first batch *expected to fail*: the next one, which fits in fewer orders than that share.

Guarantees: each answer is a batch whose own recording was replayed (the safe one and the
largest one with their successors, when ``verified``); the safe batch is never above the
largest; an argument of the wrong type raises ``TypeError`` and a bad value ``ValueError``,
each naming the argument.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence

from ._estimate_core import (DEFAULT_POLICIES, ORDERS, TraceBuilder, capacity_bytes, fitting_peak, headline,
                             int_arg, likely, policy_list, recording, replay, scale)

#: Batches past the largest one tried for ``may_fit``, at most.
MAY_FIT_SPAN = 4

#: The share of the capacity a safe batch leaves unused: it absorbs an estimate that comes out
#: low by up to this much (docs/guide/will-it-fit.md gives the errors it is set from).
SAFE_MARGIN = 0.03


def largest_batch(fn: Callable, device_memory: Any, *args: Any, batches: Sequence[int] = (1, 2, 3),
                  at: Optional[int] = None, policies: Sequence[str] = DEFAULT_POLICIES, degree: int = 1,
                  compute_capability: int = 9, verify: bool = True, max_probes: int = 24,
                  margin: float = SAFE_MARGIN, **kwargs: Any) -> dict:
    """The batches that fit ``device_memory``, without a GPU: ``fn(batch, *args, **kwargs)``
    recorded as :func:`estimate` records it at each of ``batches``, then scaled as
    :func:`scale` scales real traces (``at``: also the peak at that batch).

    With ``verify`` (the default) the scaled answer is only a first guess: ``fn`` is recorded
    again at candidate batches and each recording replayed at ``device_memory`` in ``orders``
    segment orders (the simulator's own and :data:`ORDERS` seeded shuffles). Each ``largest``
    row then carries:

    * ``safe_batch``: the largest batch that fits in every order on a device ``margin`` (a
      share) smaller, with ``safe_peak_reserved_bytes``, ``safe_verified`` and ``safe_probes``;
    * ``largest_batch``: the largest that fits in at least :data:`LIKELY_SHARE` of the orders
      on the full device, with ``largest_fits_in`` (in how many), ``scaled_batch`` (the guess),
      ``probes`` (batch -> fits) and ``verified`` (False when ``max_probes`` recordings did not
      settle it; ``largest_batch`` is then the largest batch seen to fit);
    * ``may_fit_band``: ``[safe_batch + 1, largest_batch]`` when that is not empty, else None;
    * ``first_failing_batch``: ``largest_batch + 1``, expected to fail (when verified), with
      ``next_batch_fits_in`` and ``next_batch_needs_bytes``; ``may_fit`` maps it and each later
      batch that still fits in some order to how many (up to :data:`MAY_FIT_SPAN` batches on,
      stopping at the first that fits in none), ``next_batch_borderline`` whether it is one.

    The headline names the safe batch first, then the band and the first expected failure."""
    if not callable(fn):
        raise TypeError(f"fn: expected the function to record, got {type(fn).__name__}")
    if not isinstance(batches, (list, tuple)):
        raise TypeError(f"batches: expected a list of batch sizes, got {type(batches).__name__}")
    if len(batches) < 2:
        raise ValueError(f"batches: two or more sizes to scale from, got {list(batches)!r}")
    for b in batches:
        int_arg(b, "batches", 1)
    int_arg(max_probes, "max_probes", 2)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)):
        raise TypeError(f"margin: expected a share of the capacity (a float), got {type(margin).__name__}")
    if not 0 <= margin < 0.5:
        raise ValueError(f"margin: a share of the capacity from 0 to under 0.5, got {margin}")

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
    if not verify:
        return out
    cap = capacity_bytes(device_memory)
    safe_cap = max(1, int(cap * (1 - margin)))
    pols = policy_list(policies)
    recorded: Dict[int, dict] = {}
    replays: Dict[tuple, Dict[str, dict]] = {}

    def replayed(b: int, capacity: int = cap) -> Dict[str, dict]:
        # One recording at b answers for every policy and both capacities.
        if b not in recorded:
            recorded[b] = record(b).snapshot()
        if (b, capacity) not in replays:
            replays[(b, capacity)] = {r["policy"]: r for r in replay(recorded[b], pols, capacity, None, ORDERS)}
        return replays[(b, capacity)]

    for row in out.get("largest", []):
        pol = row["policy"]
        _verify_largest(row, lambda b, p=pol: likely(replayed(b)[p]), max_probes)
        b = row["largest_batch"]
        row["orders"] = ORDERS + 1
        # The figures of the verified batch and its successor, from their own replays.
        if b is not None:
            at_b = replayed(b)[pol]
            row["peak_reserved_bytes"] = fitting_peak(at_b)
            row["spare_bytes"] = cap - row["peak_reserved_bytes"]
            row["largest_fits_in"] = at_b["orders_fit"]
        if b is not None and str(b + 1) in row["probes"]:
            row["next_batch"] = b + 1
            row["next_batch_fits_in"] = replayed(b + 1)[pol]["orders_fit"]
            # Replayed on a device with room to spare: what it would reserve, not where it failed.
            row["next_batch_needs_bytes"] = replay(recorded[b + 1], [pol], 8 * cap, None)[0]["peak_reserved_bytes"]
        if b is not None and row["verified"]:
            row["first_failing_batch"] = b + 1
            row["may_fit"] = {}
            for nb in range(b + 1, b + 1 + MAY_FIT_SPAN):
                fit = replayed(nb)[pol]["orders_fit"]
                if fit == 0:
                    break
                row["may_fit"][str(nb)] = fit
            row["next_batch_borderline"] = str(b + 1) in row["may_fit"]
        _safe(row, lambda x, p=pol: replayed(x, safe_cap)[p], lambda x, p=pol: replayed(x)[p], margin, safe_cap,
              max_probes)
    out["headline"] = headline(out)
    return out


def _safe(row: dict, at_safe_cap: Callable[[int], dict], at_cap: Callable[[int], dict], margin: float,
          safe_cap: int, max_probes: int) -> None:
    """Adds the safe batch and the may-fit band to a verified ``largest`` row: the largest batch
    that fits in every segment order on ``safe_cap`` bytes, searched from the largest batch
    shrunk by ``margin``, and never above the largest batch."""
    largest = row["largest_batch"]
    row["safe_margin"] = margin
    row["safe_capacity_bytes"] = safe_cap
    if largest is None:
        row.update(safe_batch=None, safe_verified=row["verified"], safe_probes={}, may_fit_band=None)
        return
    every = row["orders"]
    srow = {"largest_batch": max(1, min(largest, int(largest * (1 - margin))))}
    _verify_largest(srow, lambda b: b <= largest and at_safe_cap(b)["orders_fit"] == every, max_probes)
    safe = srow["largest_batch"]
    row["safe_batch"] = safe
    row["safe_verified"] = srow["verified"]
    row["safe_probes"] = srow["probes"]
    row["safe_peak_reserved_bytes"] = None if safe is None else fitting_peak(at_cap(safe))
    low = 1 if safe is None else safe + 1
    row["may_fit_band"] = [low, largest] if low <= largest else None


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
