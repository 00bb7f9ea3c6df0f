"""The GPU-free recorder on the APIs real jobs use beyond plain tensor code: side streams and
events, value checks that model libraries make (``mask.all()``), ops with no meta kernel (CTC
loss) and ``torch.compile``."""

import pytest

import cudamem.estimate as est
from test_estimate import MIB, needs_torch


def _allocs(e):
    return [ev for ev in e.trace["device_traces"][0] if ev["action"] == "alloc"]


@needs_torch
def test_side_streams_get_their_own_pool_and_workspaces():
    import torch

    def step():
        lin = torch.nn.Linear(256, 256).cuda()
        side = torch.cuda.Stream()
        assert isinstance(side, torch.cuda.Stream) and torch.cuda.current_stream() != side
        with torch.cuda.stream(side):
            assert torch.cuda.current_stream() == side
            x = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
            y = lin(torch.randn(64, 256, device="cuda"))
        torch.cuda.current_stream().wait_stream(side)
        x.record_stream(torch.cuda.current_stream())
        ev = torch.cuda.Event()
        ev.record()
        ev.synchronize()
        z = torch.empty(5 * MIB, dtype=torch.uint8, device="cuda")
        lin(y).sum().backward()
        del x, z

    e = est.estimate(step, policies=["pytorch"])
    allocs = _allocs(e)
    streams = {ev["size"]: ev["stream"] for ev in allocs}
    assert streams[3 * MIB] != 0 and streams[5 * MIB] == 0, streams
    names = [(ev["frames"][0]["name"], ev["stream"]) for ev in allocs]
    side = streams[3 * MIB]
    # The side stream's first product gets its own cuBLAS and cuBLASLt workspaces.
    assert ("cuBLAS workspace", side) in names and ("cuBLASLt workspace", side) in names, names
    assert ("cuBLAS workspace", 0) in names and ("cuBLASLt workspace", 0) in names, names
    # Patches are undone.
    assert not torch.cuda.Stream.__module__.startswith("cudamem")
    with pytest.raises(TypeError, match="stream"):
        with est.recording():
            with torch.cuda.stream("not a stream"):
                pass


@needs_torch
def test_whole_tensor_checks_answer_as_for_ordinary_data_and_other_reads_fail_clearly():
    import torch

    seen = {}

    def step():
        mask = torch.ones(4, 16, dtype=torch.bool, device="cuda")
        seen["all"] = bool(mask.all())
        seen["any"] = (mask == 0).any().item()
        torch.empty(MIB, device="cuda")

    e = est.estimate(step, policies=["pytorch"])
    assert seen == {"all": True, "any": False}
    assert any("2 all()/any() check(s)" in n for n in e.notes), e.notes

    def reads_a_value():
        torch.ones(4, device="cuda").sum().item()

    with pytest.raises(RuntimeError, match="reads a tensor's value"):
        est.estimate(reads_a_value)


@needs_torch
def test_ctc_loss_records_its_kept_alpha_and_compile_says_it_ran_eagerly():
    import torch
    import torch.nn.functional as F

    t, n, c, s = 50, 4, 20, 10

    def step():
        logits = torch.randn(t, n, c, device="cuda", requires_grad=True)
        targets = torch.randint(1, c, (n, s), device="cuda")
        lengths = torch.full((n,), t, dtype=torch.long, device="cuda")
        F.ctc_loss(F.log_softmax(logits, -1), targets, lengths, torch.full((n,), s, device="cuda")).backward()

    e = est.estimate(step, policies=["pytorch"])
    # log_alpha (batch, time, 2 * target + 1), float32, kept for backward.
    assert n * t * (2 * s + 1) * 4 in [ev["size"] for ev in _allocs(e)]

    def compiled():
        lin = torch.compile(torch.nn.Linear(64, 64).cuda(), mode="reduce-overhead")
        lin(torch.randn(8, 64, device="cuda")).sum().backward()

    e = est.estimate(compiled, policies=["pytorch"])
    assert any("torch.compile (mode reduce-overhead)" in s and "private memory pool" in s for s in e.left_out)
    assert torch.compile.__module__.startswith("torch")
