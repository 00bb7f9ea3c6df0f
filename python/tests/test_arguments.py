"""Arguments across the Python surface: a wrong type is a TypeError naming the argument and the
type given, a wrong value a ValueError naming the argument (never a command-line flag), and a
bad configuration names the environment variable it came from."""

import os

import pytest

import cudamem
import cudamem.estimate as est

MiB = 1 << 20


class Index:
    """An int-like object (as numpy's integers are): it has ``__index__``."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


@pytest.mark.parametrize(
    "call, arg, got",
    [
        (lambda d: cudamem.malloc("10", device=d), "size", "str"),
        (lambda d: cudamem.malloc(None, device=d), "size", "NoneType"),
        (lambda d: cudamem.malloc(16, device=d, stream="x"), "stream", "str"),
        (lambda d: cudamem.free("x", device=d), "ptr", "str"),
        (lambda d: cudamem.free(1.0, device=d), "ptr", "float"),
        (lambda d: cudamem.record_stream("x", 0, device=d), "ptr", "str"),
        (lambda d: cudamem.record_stream(4096, None, device=d), "stream", "NoneType"),
    ],
)
def test_raw_calls_with_a_wrong_type_raise_type_error(call, arg, got):
    with pytest.raises(TypeError, match=f"{arg} must be an int, got {got}"):
        call(0)


def test_raw_calls_take_int_like_objects_and_refuse_ints_out_of_range():
    dev = 0  # the tests share device 0; fresh ordinals are few
    p = cudamem.malloc(Index(MiB), device=dev)
    cudamem.free(Index(p), device=dev)
    with pytest.raises(ValueError, match=r"size must be an int in \[0, 2\*\*64\), got 18446744073709551616"):
        cudamem.malloc(1 << 64, device=dev)
    with pytest.raises(ValueError, match="stream must be an int in"):
        cudamem.malloc(16, device=dev, stream=-1)


def test_a_free_on_the_wrong_device_names_that_device():
    d0, d1 = 0, 1  # any two devices: fresh ordinals are few
    p = cudamem.malloc(MiB, device=d0)
    cudamem.free(cudamem.malloc(MiB, device=d1), device=d1)
    with pytest.raises(ValueError, match=rf"invalid device pointer: {p:#x} \(device {d1}: "):
        cudamem.free(p, device=d1)
    with pytest.raises(ValueError, match=rf"device {d1}: "):
        cudamem.record_stream(p, 7, device=d1)
    cudamem.free(p, device=d0)


@pytest.mark.parametrize("bad, got", [(1.5, "float"), ([], "list"), (True, "bool")])
def test_a_device_of_a_wrong_type_is_a_type_error(bad, got):
    with pytest.raises(TypeError, match=f"device must be None, an int, 'cuda\\[:N\\]' or a torch.device, got {got}"):
        cudamem.memory_allocated(bad)
    with pytest.raises(ValueError, match="device must be a CUDA device"):
        cudamem.memory_allocated("cpu")


def test_annotate_takes_the_known_stages_only():
    dev = 0
    with pytest.raises(ValueError, match="stage must be one of 'START', 'END', got 'BOGUS'"):
        cudamem.annotate("x", stage="BOGUS", device=dev)
    with pytest.raises(ValueError, match="stage"):
        cudamem.annotate("x", stage="start", device=dev)
    with pytest.raises(TypeError, match="stage must be a str, got int"):
        cudamem.annotate("x", stage=1, device=dev)
    for stage in cudamem.ANNOTATION_STAGES:
        cudamem.annotate("x", stage=stage, device=dev)


def test_report_arguments_name_python_arguments_not_flags():
    snap = cudamem.snapshot()
    with pytest.raises(ValueError, match="at must be an event index >= 0") as e:
        cudamem.report_leaks(snap, at=-1)
    assert "--" not in str(e.value)
    with pytest.raises(ValueError, match="no annotation named 'nosuch'") as e:
        cudamem.report_leaks(snap, at="nosuch")
    assert "--at" not in str(e.value) and "at also takes an event index" in str(e.value)
    for bad in (True, 1.5):
        with pytest.raises(TypeError, match="at must be an event index"):
            cudamem.report_leaks(snap, at=bad)
    with pytest.raises(ValueError, match="top must be a non-negative int, got -1"):
        cudamem.report_leaks(snap, top=-1)
    with pytest.raises(ValueError, match="frames must be a non-negative int"):
        cudamem.report_leaks(snap, frames=-1)
    with pytest.raises(TypeError, match="top must be an int, got str"):
        cudamem.report_leaks(snap, top="x")
    with pytest.raises(ValueError, match="top must be a non-negative int"):
        cudamem.report_why(snap, top=-1)
    assert isinstance(cudamem.report_leaks(snap, top=1 << 70), str)


def test_files_are_paths_and_viz_does_not_overwrite_its_trace(tmp_path):
    trace = tmp_path / "t.pickle"
    cudamem.dump_snapshot(trace)
    before = trace.read_bytes()
    with pytest.raises(ValueError, match="is the trace itself"):
        cudamem.viz(trace, trace)
    with pytest.raises(ValueError, match="is the trace itself"):
        cudamem.viz(str(trace), tmp_path / "." / "t.pickle")
    assert trace.read_bytes() == before
    r, w = os.pipe()  # an int is not a file name, even when it is an open descriptor
    try:
        with pytest.raises(TypeError, match="filename must be a file path"):
            cudamem.dump_snapshot(w)
        with pytest.raises(TypeError, match="out_html must be a file path"):
            cudamem.viz(trace, w)
        os.write(w, b"still open")
    finally:
        os.close(r)
        os.close(w)
    assert cudamem.viz(trace, tmp_path / "v.html").endswith("v.html")


@pytest.mark.parametrize("var", ["CUDAMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
@pytest.mark.parametrize("value", ["max_split_size_mb:banana", "sharded:True"])
def test_a_bad_configuration_names_its_variable(run_python, monkeypatch, var, value):
    for other in ("CUDAMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(other, raising=False)
    code = (
        "import cudamem\n"
        "try:\n    cudamem.malloc(16)\nexcept ValueError as e:\n    print('ERR', e)\n"
        "print('INFO', cudamem.info().get('settings_error'))\n"
    )
    out = run_python(code, **{var: value}).stdout
    assert f"ERR {var}: " in out, out
    assert f"INFO {var}: " in out, out


def test_estimate_arguments(tmp_path):
    snap = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 4096, "size": MiB, "stream": 0,
                                                  "time_us": 1}]]}  # fmt: skip
    for bad in (None, 2.5, True, [1]):
        with pytest.raises(TypeError, match="device_memory: expected bytes"):
            est.capacity_bytes(bad)
    for bad in (8, "8", 1 << 70, MiB - 1):
        with pytest.raises(ValueError, match="(?i)a bare number is bytes"):
            est.capacity_bytes(bad)
    assert est.capacity_bytes(MiB) == MiB
    with pytest.raises(ValueError, match="^config: unrecognized key 'bogus'"):
        est.replay(snap, ["pytorch"], config="bogus:1")
    with pytest.raises(TypeError, match="policies: expected policy names"):
        est.replay(snap, 3)
    with pytest.raises(TypeError, match="policies: expected policy names"):
        est.replay(snap, [1])
    with pytest.raises(TypeError, match="orders: expected an int, got str"):
        est.replay(snap, orders="x")
    with pytest.raises(ValueError, match="orders: an int from 0 to 65535, got -1"):
        est.replay(snap, orders=-1)
    with pytest.raises(TypeError, match="traces: expected a list"):
        est.scale(snap, [1, 2])
    with pytest.raises(TypeError, match="batches: expected an int, got str"):
        est.scale([snap, snap], [1, "2"])
    with pytest.raises(TypeError, match="at: expected an int, got bool"):
        est.scale([snap, snap], [1, 2], at=True)
    with pytest.raises(ValueError, match="at: an int from 1"):
        est.scale([snap, snap], [1, 2], at=1 << 70)
    for arg in ("degree", "limit"):
        with pytest.raises(ValueError, match=f"{arg}: an int from"):
            est.scale([snap, snap], [1, 2], **{arg: -1})
    with pytest.raises(TypeError, match="config: expected a CUBLAS_WORKSPACE_CONFIG string"):
        est.cublas_workspace_bytes(3)
    with pytest.raises(TypeError, match="batches: expected a list"):
        est.largest_batch(lambda b: None, "h200", batches="12")
    with pytest.raises(TypeError, match="max_probes: expected an int"):
        est.largest_batch(lambda b: None, "h200", max_probes="x")
