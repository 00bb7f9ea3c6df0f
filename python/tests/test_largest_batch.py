"""cudamem.estimate.largest_batch's three answers: the safe batch (every segment order, with a
margin of the memory to spare), the band that may fit, and the first batch expected to fail;
and the headline that names them in that order."""

import math

import pytest

import cudamem.estimate as est
from test_estimate import MIB, needs_torch, tie_job


def _linear(batch):  # three allocations of `batch` MiB: capacity alone decides, in every order
    import torch

    keep = [torch.empty(batch * MIB, dtype=torch.uint8, device="cuda") for _ in range(3)]
    del keep


def _fits(fn, b, capacity):
    return est.estimate(fn, b, device_memory=capacity, policies=["pytorch"]).fits()


@needs_torch
def test_the_safe_batch_leaves_the_margin_and_the_band_runs_up_to_the_largest():
    r = est.largest_batch(_linear, "1GiB", batches=(2, 4, 8), policies=["pytorch"])
    row = r["largest"][0]
    safe, largest = row["safe_batch"], row["largest_batch"]
    assert row["verified"] and row["safe_verified"] and safe < largest, row
    assert row["safe_capacity_bytes"] == int((1 << 30) * (1 - est.SAFE_MARGIN))
    # Seen to fit on the smaller device, and the next batch seen not to.
    smaller = row["safe_capacity_bytes"]
    assert _fits(_linear, safe, smaller) and not _fits(_linear, safe + 1, smaller)
    assert row["safe_probes"][str(safe)] is True and row["safe_probes"][str(safe + 1)] is False
    assert row["may_fit_band"] == [safe + 1, largest] and row["first_failing_batch"] == largest + 1
    assert row["safe_peak_reserved_bytes"] <= smaller
    h = r["headline"]
    assert h.index(f"batch {safe} is safe") < h.index(f"batches {safe + 1}-{largest} may fit") \
        < h.index(f"batch {largest + 1} is expected to fail"), h
    # No margin, and capacity alone decides: the safe batch is the largest, no band.
    row0 = est.largest_batch(_linear, "1GiB", batches=(2, 4, 8), policies=["pytorch"], margin=0.0)["largest"][0]
    assert row0["safe_batch"] == row0["largest_batch"] == largest and row0["may_fit_band"] is None, row0


@needs_torch
def test_a_batch_that_fits_in_some_segment_orders_only_is_never_the_safe_one():
    r = est.largest_batch(tie_job, 200 * MIB, batches=(2, 4, 8), policies=["pytorch"], margin=0.0)
    row = r["largest"][0]
    need = math.ceil(est.LIKELY_SHARE * row["orders"])
    assert row["largest_batch"] == 10 and need <= row["largest_fits_in"] < row["orders"], row
    # Batch 10 fits in enough orders to count, but not in all; nor does any smaller batch (the
    # order that fails at 10 fails at 1): no batch is safe, and the band starts at 1.
    assert row["safe_batch"] is None and row["safe_verified"], row
    assert row["may_fit_band"] == [1, 10], row
    assert r["headline"].startswith("no batch is safe") and "batch 11 is expected to fail" in r["headline"]


@needs_torch
def test_margin_is_checked():
    with pytest.raises(ValueError, match="margin"):
        est.largest_batch(_linear, "1GiB", batches=(2, 4), margin=0.5)
    with pytest.raises(TypeError, match="margin"):
        est.largest_batch(_linear, "1GiB", batches=(2, 4), margin="3%")


def test_headline_of_a_largest_batch_row_names_safe_band_and_failure():
    row = {"policy": "pytorch", "capacity_bytes": 24 << 30, "largest_batch": 404, "spare_bytes": 13 * MIB,
           "orders": 25, "largest_fits_in": 9, "safe_batch": 392, "safe_margin": 0.03,
           "safe_peak_reserved_bytes": 23 << 30, "may_fit_band": [393, 404], "first_failing_batch": 405,
           "next_batch_fits_in": 1, "verified": True, "may_fit": {"405": 1}}
    h = est.headline({"largest": [row]})
    assert h.startswith("batch 392 is safe on 24.00 GiB"), h
    assert "batches 393-404 may fit (batch 404 fits in 9 of 25 segment orders" in h, h
    assert "batch 405 is expected to fail (it fits in 1 of 25 segment orders)" in h, h
    none = est.headline({"largest": [dict(row, safe_batch=None, may_fit_band=[1, 404])]})
    assert none.startswith("no batch is safe") and "batches 1-404 may fit" in none, none
    open_ended = est.headline({"largest": [dict(row, first_failing_batch=None, verified=False)]})
    assert "stopped before it found a batch that fails" in open_ended, open_ended
