"""cudamem.estimate: the trace the recorder writes, the scaling prediction, the error messages
(no torch needed), and the GPU-free recorder itself when torch is importable (skipped with the
reason otherwise)."""

import importlib.util
import json
import math
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import cudamem
import cudamem.estimate as est
from cudamem import _estimate_core, _largest_batch

MIB = 1 << 20
HAVE_TORCH = importlib.util.find_spec("torch") is not None and "fake_torch" not in str(
    importlib.util.find_spec("torch").origin or "")
SKIP_REASON = "torch is not installed: the recorder's torch tests of test_estimate.py skip"
# The test command installs torch and sets this: there, a missing torch is a failure, not a skip.
if not HAVE_TORCH and os.environ.get("CUDAMEM_TORCH_REQUIRED") == "1":
    raise RuntimeError("CUDAMEM_TORCH_REQUIRED=1 but torch is not importable: the recorder's tests cannot run")
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason=SKIP_REASON)
if not HAVE_TORCH:
    # Shown in pytest's warnings summary, which -q keeps (skip reasons need -rs).
    warnings.warn(SKIP_REASON, stacklevel=1)


def job(batch, steps=2):
    """A training-like trace at `batch`: constant weights, activations growing with the batch."""
    b = est.TraceBuilder()
    for w in range(4):
        b.alloc(("w", w), 30 * MIB + 512 * w)
    for s in range(steps):
        for layer in range(5):
            b.alloc(("a", s, layer), batch * (3 + layer) * MIB)
            b.alloc(("ws", s, layer), 8 * MIB)
            b.free(("ws", s, layer))
        for layer in reversed(range(5)):
            b.free(("a", s, layer))
    return b


def test_cublas_workspace_follows_the_config_and_the_architecture():
    assert est.cublas_workspace_bytes(":4096:8") == 32 * MIB
    assert est.cublas_workspace_bytes(":4096:2:16:8") == 8 * MIB + 128 * 1024
    assert est.cublas_workspace_bytes("", major=9) == 32 * MIB
    assert est.cublas_workspace_bytes("", major=8) == 8 * MIB + 128 * 1024
    for bad in ("4096:8", ":4096", ":a:b"):
        with pytest.raises(ValueError, match="CUBLAS_WORKSPACE_CONFIG"):
            est.cublas_workspace_bytes(bad)


def test_cublaslt_workspace_follows_its_variable():
    assert est.cublaslt_workspace_bytes("") == MIB
    assert est.cublaslt_workspace_bytes("4096") == 4 * MIB
    for bad in ("x", "-1"):
        with pytest.raises(ValueError, match="CUBLASLT_WORKSPACE_SIZE"):
            est.cublaslt_workspace_bytes(bad)


def test_capacities_by_size_or_name_and_their_errors():
    assert est.capacity_bytes("24GiB") == 24 << 30
    assert est.capacity_bytes("h200") == 150_109_880_320
    assert est.capacity_bytes(1 << 30) == 1 << 30
    with pytest.raises(ValueError, match="device_memory.*known GPUs"):
        est.capacity_bytes("h300")
    with pytest.raises(ValueError, match="from 1 MiB"):
        est.capacity_bytes(0)
    with pytest.raises(TypeError, match="expected"):
        est.capacity_bytes(2.5)


def test_builder_writes_a_snapshot_the_replay_reads():
    b = est.TraceBuilder()
    b.alloc("x", 5 * MIB)
    b.alloc("zero", 0)  # nothing: PyTorch records no allocation of 0 bytes
    b.free("x")
    b.free("never")
    snap = b.snapshot()
    assert [e["action"] for e in snap["device_traces"][0]] == ["alloc", "free_requested", "free_completed"]
    assert b.peak_live == 5 * MIB
    # PyTorch's allocator serves 1-10 MiB requests from a 20 MiB segment.
    rows = {r["policy"]: r for r in est.replay(snap, ["pytorch", "cudamem"])}
    assert rows["pytorch"]["peak_reserved_bytes"] == 20 * MIB
    assert rows["cudamem"]["peak_reserved_bytes"] < 20 * MIB
    assert pickle.loads(b.pickle()) == snap


def test_estimate_result_reports_fit_and_what_it_leaves_out():
    e = _estimate_core.estimate_from(job(4), ["cuDNN workspaces"], ["a note"], "1GiB", ["pytorch", "cudamem"], None)
    assert set(e.peak_reserved) == {"pytorch", "cudamem"}
    assert e.peak_requested == 4 * 30 * MIB + (0 + 1 + 2 + 3) * 512 + 4 * 25 * MIB + 8 * MIB
    assert e.fits("pytorch") is True
    text = str(e)
    assert "not counted: cuDNN workspaces" in text and "note: a note" in text and "on a GPU of 1.00 GiB" in text
    small = _estimate_core.estimate_from(job(4), [], [], 128 * MIB, ["pytorch"], None)
    assert small.fits("pytorch") is False
    with pytest.raises(ValueError, match="not estimated"):
        small.fits("cudamem")
    with pytest.raises(ValueError, match="no CUDA memory"):
        _estimate_core.estimate_from(est.TraceBuilder(), [], [], None, ["pytorch"], None)


def test_scale_predicts_a_larger_batch_as_its_own_trace_replays():
    traces = [job(b).snapshot() for b in (2, 4, 8)]
    r = est.scale(traces, [2, 4, 8], at=32, capacity="4GiB", policies=["pytorch"])
    q = r["quality"]
    assert q["exact_alignment"] and q["confidence"] == "high" and q["holdout_error"] == 0.0
    truth = est.replay(job(32).snapshot(), ["pytorch"])[0]["peak_reserved_bytes"]
    assert r["at"][0]["peak_reserved_bytes"] == truth
    lg = r["largest"][0]
    b = lg["largest_batch"]
    cap = 4 << 30
    assert est.replay(job(b).snapshot(), ["pytorch"], cap)[0]["ooms"] == 0
    assert est.replay(job(b + 1).snapshot(), ["pytorch"], cap)[0]["ooms"] > 0
    assert r["headline"].startswith(f"at batch 32 this job needs ") and f"; {b} fits with" in r["headline"]


def test_scale_errors_name_the_problem():
    t = job(2).snapshot()
    with pytest.raises(ValueError, match="one batch size per trace"):
        est.scale([t, t], [2])
    with pytest.raises(ValueError, match="batches: an int from 1"):
        est.scale([t, t], [0, 2], at=4)
    with pytest.raises(ValueError, match="nothing to predict"):
        est.scale([t, job(4).snapshot()], [2, 4])
    with pytest.raises(ValueError, match="a batch size of its own"):
        est.scale([t, t], [2, 2], at=4)
    with pytest.raises(ValueError, match="policies"):
        est.scale([t, t], [2, 4], at=4, policies=[])


def test_scale_reads_trace_files(tmp_path):
    # A shipped H200 trace given as two batch sizes: nothing scales, so every batch needs what
    # the trace itself does, and the search stops at its limit.
    path = Path(__file__).resolve().parents[2] / "tests" / "data" / "seed_example.pickle.gz"
    r = est.scale([str(path), path], [1, 2], at=16, capacity="h200", policies=["pytorch"], limit=64)
    assert r["quality"]["exact_alignment"] and r["quality"]["scaling"] == 0
    own = est.replay(str(path), ["pytorch"])[0]["peak_reserved_bytes"]
    assert r["at"][0]["peak_reserved_bytes"] == own
    assert r["largest"][0]["largest_batch"] == 64 and r["largest"][0]["limit_reached"]


def test_command_line_errors(capsys):
    assert est.main(["no_such_module_here:fn"]) == 2
    assert "no_such_module_here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        est.main(["missing-colon"])


def test_wrong_functions_and_policies_are_named():
    with pytest.raises(TypeError, match="fn: expected the function"):
        cudamem.estimate(42)
    with pytest.raises(TypeError, match="fn: expected the function"):
        est.largest_batch("job", "24GiB")
    with pytest.raises(ValueError, match="nope"):
        est.replay(job(1).snapshot(), ["nope"])


def test_the_module_is_callable_and_needs_torch_only_to_record():
    assert callable(cudamem.estimate) and cudamem.estimate is est
    # Reached from the package alone, in a fresh interpreter, too.
    code = "import cudamem; import sys; assert callable(cudamem.estimate) and cudamem.torch.__name__ == 'cudamem.torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
    if not HAVE_TORCH:
        with pytest.raises(RuntimeError, match="needs torch"):
            cudamem.estimate(lambda: None)


# --- with torch ---------------------------------------------------------------------------------


@needs_torch
def test_recorder_sees_allocations_frees_and_saved_tensors():
    import torch

    def step():
        lin = torch.nn.Linear(256, 256).cuda()
        x = torch.randn(64, 256, device="cuda")
        y = torch.sigmoid(lin(x))  # sigmoid saves its output for backward
        y.sum().backward()
        return lin

    e = est.estimate(step, policies=["pytorch"])
    events = e.trace["device_traces"][0]
    sizes = [ev["size"] for ev in events if ev["action"] == "alloc"]
    assert 256 * 256 * 4 in sizes and 64 * 256 * 4 in sizes
    names = [ev["frames"][0]["name"] for ev in events if ev["action"] == "alloc"]
    # Forward and backward each get a cuBLAS workspace, as torch's per-thread handles do.
    assert names.count("cuBLAS workspace") == 2
    # As in torch's traces: cuBLAS, then cuBLASLt once, at the first product.
    first = names.index("cuBLAS workspace")
    assert names[first + 1] == "cuBLASLt workspace" and names.count("cuBLASLt workspace") == 1
    frees = sum(ev["action"] == "free_requested" for ev in events)
    assert 0 < frees < len(sizes)
    assert e.peak_reserved["pytorch"] >= e.peak_requested > 0


@needs_torch
def test_recorder_emulates_cuda_autocast_and_fused_attention():
    import torch
    import torch.nn.functional as F

    seen = {}

    def step():
        lin = torch.nn.Linear(64, 64).cuda()
        x = torch.randn(8, 64, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = lin(x)
            h2 = lin(h)
            q = h2.view(2, 4, 1, 64).expand(2, 4, 16, 64)
            a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            seen["dtypes"] = (h.dtype, a.dtype, F.softmax(h, -1).dtype)
            loss = F.cross_entropy(h2, torch.zeros(8, dtype=torch.long, device="cuda"))
        seen["loss"] = loss.dtype
        loss.backward()

    e = est.estimate(step, policies=["pytorch"])
    assert seen["dtypes"] == (torch.bfloat16, torch.bfloat16, torch.float32)
    assert seen["loss"] == torch.float32
    # The weight's bf16 copy is made once per autocast region, not once per use.
    casts = [ev for ev in e.trace["device_traces"][0]
             if ev["action"] == "alloc" and ev["size"] == 64 * 64 * 2 and ev["frames"][0]["name"] == "aten._to_copy"]
    assert len(casts) == 1
    # Patches are undone: autocast("cuda") is torch's own again.
    assert torch.amp.autocast_mode.autocast.__init__.__name__ == "__init__"


@needs_torch
def test_recorder_models_cudnn_convolutions_and_their_benchmark():
    import torch

    def step(steps):
        conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).cuda()
        for _ in range(steps):
            x = torch.randn(8, 64, 56, 56, device="cuda", requires_grad=True)  # data gradient too
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = conv(x)
            y.float().sum().backward()

    old = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        e = est.estimate(step, 2, policies=["pytorch"])
    finally:
        torch.backends.cudnn.benchmark = old
    ev = e.trace["device_traces"][0]
    names = [x["frames"][0]["name"] for x in ev if x["action"] == "alloc" and x["frames"]]
    # Three passes (forward, data and weight gradient), each timed once then run each step.
    assert names.count("cuDNN benchmark workspace") == 3
    assert names.count("cuDNN workspace") == 6
    assert sum(x["action"] == "segment_free" for x in ev) == 3  # the cache release after each timing
    assert any("cuDNN workspaces of 6 convolution passes modelled, 3 of them benchmarked" in n for n in e.notes)
    assert not any("cudnn" in s.lower() and "convolution" in s for s in e.left_out)


@needs_torch
def test_recorder_errors_and_cleanup():
    import torch

    def boom():
        torch.empty(10, device="cuda")
        raise KeyError("inside")

    with pytest.raises(KeyError):
        est.estimate(boom)
    assert torch.cuda.synchronize.__name__ == "synchronize"
    with pytest.raises(ValueError, match="no CUDA memory"):
        est.estimate(lambda: torch.empty(3))


@needs_torch
def test_recording_block_command_line_and_saved_trace(tmp_path, capsys):
    import torch

    with est.recording() as rec:
        a = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        b = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
        del a, b
    e = rec.estimate(device_memory="1GiB", policies="pytorch")
    assert e.peak_requested == 8 << 20 and e.fits() is True
    saved = e.save(str(tmp_path / "t.pickle"))
    assert est.replay(saved, ["pytorch"])[0]["peak_reserved_bytes"] == e.peak_reserved["pytorch"]
    script = tmp_path / "job.py"
    script.write_text("import torch\ndef run():\n    torch.zeros(1 << 20, device='cuda')\n")
    assert est.main([f"{script}:run", "--device-memory", "24GiB", "--json", "--policy", "pytorch"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policies"][0]["policy"] == "pytorch" and out["peak_requested_bytes"] == 4 << 20


@needs_torch
def test_largest_batch_without_a_gpu():
    import torch

    def job(batch):
        keep = [torch.empty(batch << 20, dtype=torch.uint8, device="cuda") for _ in range(3)]
        del keep

    r = est.largest_batch(job, "1GiB", batches=(2, 4, 8), at=16, policies=["pytorch"])
    assert r["quality"]["exact_alignment"] and r["at"][0]["batch"] == 16
    b = r["largest"][0]["largest_batch"]
    assert 300 < b < 342, b  # three allocations of b MiB, rounded up to 2 MiB, in 1 GiB
    with pytest.raises(ValueError, match="two or more"):
        est.largest_batch(job, "1GiB", batches=(2,))

    def coarse(batch):  # one batch more is 32 MiB more: more than one large segment
        x = torch.empty(batch << 25, dtype=torch.uint8, device="cuda")
        del x

    row = est.largest_batch(coarse, "1GiB", batches=(2, 4, 8), policies=["pytorch"])["largest"][0]
    assert row["verified"] and row["next_batch_borderline"] is False, row


@needs_torch
def test_largest_batch_is_verified_where_scaling_guesses_wrong():
    import torch

    def job(batch):  # quadratic in the batch: a straight-line fit from 2, 4, 8 guesses too high
        x = torch.empty(batch * batch << 10, dtype=torch.uint8, device="cuda")
        y = torch.empty(batch << 20, dtype=torch.uint8, device="cuda")
        del x, y

    r = est.largest_batch(job, "1GiB", batches=(2, 4, 8), policies=["pytorch"])
    row = r["largest"][0]
    b = row["largest_batch"]
    assert row["verified"] and row["scaled_batch"] != b, row
    assert est.estimate(job, b, device_memory="1GiB", policies=["pytorch"]).fits()
    assert not est.estimate(job, b + 1, device_memory="1GiB", policies=["pytorch"]).fits()
    assert row["probes"][str(b)] is True and row["probes"][str(b + 1)] is False
    assert row["spare_bytes"] == (1 << 30) - row["peak_reserved_bytes"] >= 0
    assert row["next_batch"] == b + 1 and row["next_batch_needs_bytes"] > 1 << 30
    # No ties between equal free blocks here: capacity alone decides, in every segment order.
    assert row["largest_fits_in"] == row["orders"] == est.ORDERS + 1, row
    assert row["may_fit"] == {} and row["next_batch_borderline"] is False, row
    assert row["first_failing_batch"] == b + 1 and row["safe_batch"] < b, row
    unverified = est.largest_batch(job, "1GiB", batches=(2, 4, 8), policies=["pytorch"], verify=False)
    assert unverified["largest"][0]["largest_batch"] == row["scaled_batch"]
    with pytest.raises(ValueError, match="max_probes"):
        est.largest_batch(job, "1GiB", batches=(2, 4), max_probes=1)


@needs_torch
def test_inference_mode_gets_one_cublas_workspace():
    import torch

    def infer():
        lin = torch.nn.Linear(32, 32).cuda().half()
        with torch.inference_mode():
            lin(torch.randn(2, 5, 32, device="cuda", dtype=torch.half))

    e = est.estimate(infer, policies=["pytorch"])
    names = [ev["frames"][0]["name"] for ev in e.trace["device_traces"][0] if ev["action"] == "alloc"]
    assert names.count("cuBLAS workspace") == 1


@needs_torch
def test_dropout_keeps_cudas_one_byte_mask():
    import torch
    import torch.nn.functional as F

    def step():
        x = torch.randn(1000, 64, device="cuda", requires_grad=True)
        F.dropout(x, 0.1, training=True).sum().backward()

    e = est.estimate(step, policies=["pytorch"])
    sizes = [ev["size"] for ev in e.trace["device_traces"][0] if ev["action"] == "alloc"]
    assert 1000 * 64 in sizes  # the bool mask
    assert sizes.count(1000 * 64 * 4) == 3  # x, the output, x's gradient: no fp32 noise tensor


@needs_torch
def test_tied_weights_stay_tied_on_the_simulated_gpu():
    import torch

    def step():
        emb = torch.nn.Embedding(1000, 64)
        head = torch.nn.Linear(64, 1000, bias=False)
        head.weight = emb.weight  # tied, as GPT-2
        m = torch.nn.ModuleDict({"emb": emb, "head": head}).cuda()
        assert m["head"].weight is m["emb"].weight
        assert len(list(m.parameters())) == 1

    e = est.estimate(step, policies=["pytorch"])
    sizes = [ev["size"] for ev in e.trace["device_traces"][0] if ev["action"] == "alloc"]
    assert sizes.count(1000 * 64 * 4) == 1  # one weight on the GPU, not one per module


@needs_torch
def test_autocast_cross_entropy_keeps_half_and_float_log_probabilities():
    import torch
    import torch.nn.functional as F

    def step():
        x = torch.randn(32, 500, device="cuda", requires_grad=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = x.to(torch.bfloat16)
            loss = F.cross_entropy(h, torch.zeros(32, dtype=torch.long, device="cuda"))
        loss.backward()

    e = est.estimate(step, policies=["pytorch"])
    names = [(ev["frames"][0]["name"], ev["size"]) for ev in e.trace["device_traces"][0] if ev["action"] == "alloc"]
    # As torch's CUDA traces show: log_softmax in bf16, then nll_loss's float32 copy of it.
    assert ("aten._log_softmax", 32 * 500 * 2) in names
    assert names.index(("aten._log_softmax", 32 * 500 * 2)) < names.index(("aten._to_copy", 32 * 500 * 4))


@pytest.mark.parametrize("guess,edge", [(10, 37), (37, 37), (38, 37), (500, 37), (1, 37), (5, 1), (3, 0), (None, 4)])
def test_the_largest_batch_search_ends_where_b_fits_and_b_plus_1_does_not(guess, edge):
    calls = []

    def fits(b):
        calls.append(b)
        return b <= edge

    row = {"largest_batch": guess}
    _largest_batch._verify_largest(row, fits, max_probes=24)
    assert row["scaled_batch"] == guess and len(calls) == len(set(calls)) <= 24
    if edge == 0:
        assert row["largest_batch"] is None and row["probes"]["1"] is False and row["verified"]
    else:
        assert row["largest_batch"] == edge and row["verified"], row
        assert row["probes"][str(edge)] is True and row["probes"][str(edge + 1)] is False


def test_the_largest_batch_search_says_when_it_ran_out_of_probes():
    row = {"largest_batch": 1}
    _largest_batch._verify_largest(row, lambda b: b <= 100_000, max_probes=4)
    assert not row["verified"] and len(row["probes"]) == 4
    assert row["largest_batch"] == max(int(b) for b, ok in row["probes"].items() if ok)


def tie_trace(final: int) -> dict:
    """Two cached 40 MiB blocks, one splitting a 100 MiB segment whose rest is live and one a
    whole segment; a 40 MiB request takes the one at the lower address. Then ``final`` MiB
    under a 200 MiB cap fits only if the whole segment stayed free for the retry to release."""
    b = est.TraceBuilder()
    b.alloc("p", 100 * MIB)
    b.alloc("r", 40 * MIB)
    b.free("p")
    b.free("r")
    b.alloc("a", 60 * MIB)
    b.alloc("q", 40 * MIB)
    b.alloc("z", final * MIB)
    return b.snapshot()


def test_replay_in_shuffled_segment_orders():
    # Lowest first, the 100 MiB segment lies below the 40 MiB one, q splits it, and the retry
    # releases the free 40 MiB segment: z fits. In a shuffled order either may lie lower.
    row = est.replay(tie_trace(100), ["pytorch"], 200 * MIB, None, orders=24)[0]
    assert row["ooms"] == 0 and row["orders"] == 25, row
    assert 1 < row["orders_fit"] < 25, row  # some orders fit, some do not
    assert row["orders_fit_peak_reserved_bytes"] == 200 * MIB, row
    assert row["orders_likely"] is (row["orders_fit"] >= math.ceil(est.LIKELY_SHARE * 25)), row
    again = est.replay(tie_trace(100), ["pytorch"], 200 * MIB, None, orders=24)[0]
    assert again["orders_fit"] == row["orders_fit"]  # seeded: the same orders each time
    # Too large for any order: nothing fits.
    none = est.replay(tie_trace(102), ["pytorch"], 200 * MIB, None, orders=24)[0]
    assert none["ooms"] == 1 and none["orders_fit"] == 0, none
    assert none["orders_fit_peak_reserved_bytes"] is None and none["orders_likely"] is False
    assert "orders" not in est.replay(tie_trace(100), ["pytorch"], 200 * MIB)[0]
    for bad in (-1, 1 << 16):
        with pytest.raises(ValueError, match="orders"):
            est.replay(tie_trace(100), ["pytorch"], 200 * MIB, None, orders=bad)
    for bad in (1.5, True):
        with pytest.raises(TypeError, match="orders"):
            est.replay(tie_trace(100), ["pytorch"], 200 * MIB, None, orders=bad)


def tie_job(batch):
    """tie_trace as a job, the whole 40 MiB segment made first: lowest address first, z fails at
    every batch; up to batch 10 it fits in most other segment orders."""
    import torch

    r = torch.empty(40 * MIB, dtype=torch.uint8, device="cuda")
    p = torch.empty(100 * MIB, dtype=torch.uint8, device="cuda")
    del r, p
    a = torch.empty(60 * MIB, dtype=torch.uint8, device="cuda")
    q = torch.empty(40 * MIB, dtype=torch.uint8, device="cuda")
    z = torch.empty((90 + batch) * MIB, dtype=torch.uint8, device="cuda")
    del a, q, z


@needs_torch
def test_largest_batch_counts_a_batch_that_fits_in_enough_segment_orders():
    job = tie_job
    e = est.estimate(job, 10, device_memory=200 * MIB, policies=["pytorch"])
    row = e.rows[0]
    assert row["ooms"] > 0 and e.fits() is True, row  # lowest first it fails; in enough orders it fits
    assert e.peak_reserved["pytorch"] == 200 * MIB and "segment orders" in str(e), str(e)
    assert est.estimate(job, 11, device_memory=200 * MIB, policies=["pytorch"]).fits() is False
    r = est.largest_batch(job, 200 * MIB, batches=(2, 4, 8), policies=["pytorch"])
    row = r["largest"][0]
    need = math.ceil(est.LIKELY_SHARE * row["orders"])
    assert row["verified"] and row["largest_batch"] == 10, row
    assert need <= row["largest_fits_in"] < row["orders"], row
    assert row["spare_bytes"] == 0 and row["may_fit"] == {} and not row["next_batch_borderline"], row


def test_headline_names_the_batches_that_may_fit():
    row = {"policy": "pytorch", "capacity_bytes": 24 << 30, "largest_batch": 635, "spare_bytes": 13 * MIB,
           "orders": 25, "may_fit": {"636": 6, "637": 1}}
    h = est.headline({"largest": [row]})
    assert "635 fits with 13.00 MiB to spare" in h and "batches 636-637 may fit" in h, h
    assert "636 in 6 of 25, 637 in 1 of 25" in h, h
    assert "may fit" not in est.headline({"largest": [dict(row, may_fit={})]})
