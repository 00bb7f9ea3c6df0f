"""pytest plugin for running PyTorch's own test files against cudamem (scripts/gpu/torch/pytorch_tests.sh).

Load it with ``-p cudamem_pytest_plugin`` (scripts/gpu/torch on PYTHONPATH). Both runs of
pytorch_tests.sh load it, so they differ only in the allocator:

* ``CUDAMEM_PYTEST_INSTALL=1``: ``pytest_configure`` makes cudamem torch's CUDA allocator
  (``cudamem.torch.install(native=True)``). That hook runs before collection, which matters:
  importing test_cuda.py creates CUDA tensors. If the install fails, pytest stops with a usage
  error and no test runs. Otherwise torch keeps its own allocator.
* A stored test file may come from another torch release than the installed one and import
  names this torch lacks. Missing ones are filled in the same way in both runs: known renames
  and removals (torch._six, test_torch.AbstractTestCases, the tri*_indices helpers of
  common_methods_invocations, torch.cuda._Graph and _graph_pool_handle), and a placeholder for
  any other name a ``from torch... import`` asks for. Placeholders raise when used (a missing
  decorator leaves its function as it is; a missing flag is false), so the tests that need them
  fail or skip in both runs.
* ``CUDAMEM_PYTEST_TEST_TIMEOUT`` (seconds, default 60): a test running longer makes faulthandler
  dump every thread's stack and exit the process, so a hang costs one test; the driver starts
  pytest again on the tests left.
* ``CUDAMEM_PYTEST_SLOW_TESTS``: test function names, comma-separated, that get
  ``CUDAMEM_PYTEST_BUILD_TIMEOUT`` seconds (default 300) instead: those that build a C++
  extension with ``load_inline``, which on a cold cache outlasts the usual watchdog.
* ``CUDAMEM_PYTEST_EVENTS``: a file that gets one JSON line per event (configure, collected ids,
  test start, test result). A file, because pytest captures stdout and stderr.
* ``CUDAMEM_PYTEST_SEGMENTS=1``: also the allocator's segments (``memory_snapshot()``: pool,
  size, allocated bytes, expandable, stream) as each test starts, as a ``segments`` event.
"""

import faulthandler
import importlib.util
import json
import math
import os
import sys
import time
import traceback
import types

import pytest

_events_path = os.environ.get("CUDAMEM_PYTEST_EVENTS")
_timeout = float(os.environ.get("CUDAMEM_PYTEST_TEST_TIMEOUT", "60"))
_build_timeout = float(os.environ.get("CUDAMEM_PYTEST_BUILD_TIMEOUT", "300"))
_slow = {n for n in os.environ.get("CUDAMEM_PYTEST_SLOW_TESTS", "").split(",") if n}
_header = []
_reports = {}  # nodeid -> {when: report}
_stacks = None  # kept open: faulthandler writes to its descriptor when a test times out


def _event(**fields):
    if not _events_path:
        return
    fields.setdefault("t", time.time())
    with open(_events_path, "a") as f:
        f.write(json.dumps(fields) + "\n")
        f.flush()
        os.fsync(f.fileno())


class _Missing:
    """Stands in for a name the stored test file imports but this torch lacks; any use raises."""

    def __init__(self, name):
        self._name = name

    def _fail(self, *_args, **_kwargs):
        raise RuntimeError(f"{self._name} does not exist in torch {_torch_version()}; "
                           "cudamem_pytest_plugin put this placeholder in its place")

    __iter__ = __len__ = _fail

    def __bool__(self):  # a missing feature flag reads as "not supported"
        return False

    def __call__(self, *args, **kwargs):
        # A missing decorator (or decorator factory) leaves what it decorates as it is; any
        # other call raises.
        if len(args) == 1 and not kwargs and (isinstance(args[0], type) or callable(args[0])):
            return args[0]
        if not args and not kwargs:
            return lambda f: f
        self._fail()

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise AttributeError(f"{self._name}.{attr}: {self._name} does not exist in torch "
                             f"{_torch_version()} (placeholder from cudamem_pytest_plugin)")


def _torch_version():
    mod = sys.modules.get("torch")
    return getattr(mod, "__version__", "?")


def _install_cudamem():
    import torch

    try:
        import cudamem.torch as ct

        ct.install(native=True)
        mode = ct.install_mode()
    except Exception as e:  # every failure must stop the run, whatever its type
        traceback.print_exc()
        _event(ev="configure", install_mode=None, error=repr(e))
        raise pytest.UsageError(f"cudamem_pytest_plugin: cudamem.torch.install(native=True) failed: {e!r}") from e
    if mode != "native":
        _event(ev="configure", install_mode=mode, error="not native")
        raise pytest.UsageError(f"cudamem_pytest_plugin: install_mode() is {mode!r}, expected 'native'")
    line = f"cudamem_pytest_plugin: cudamem installed, cudamem.torch.install_mode() = {mode!r}, torch {torch.__version__}"
    print(line, file=sys.stderr, flush=True)
    _header.append(line)
    return mode


def _compat(config):
    """Fills in what the stored test_cuda.py imports and torch 2.11 lacks; returns what it filled."""
    import torch

    applied = []
    try:
        import torch._six  # noqa: F401
    except ImportError:
        six = types.ModuleType("torch._six")
        six.inf, six.nan = math.inf, math.nan
        six.string_classes, six.int_classes = (str, bytes), int
        sys.modules["torch._six"] = six
        torch._six = six
        applied.append("torch._six")

    # test_torch.py is a test-directory file; a real one beside the test file wins.
    beside = {os.path.dirname(os.path.abspath(str(a).split("::")[0])) for a in config.args}
    if not any(os.path.exists(os.path.join(d, "test_torch.py")) for d in beside) \
            and importlib.util.find_spec("test_torch") is None:
        tt = types.ModuleType("test_torch")
        tt.AbstractTestCases = _Missing("test_torch.AbstractTestCases")
        sys.modules["test_torch"] = tt
        applied.append("test_torch.AbstractTestCases")

    try:
        import torch.testing._internal.common_methods_invocations as cmi

        for name in ("tri_tests_args", "tri_large_tests_args", "_compare_trilu_indices",
                     "_compare_large_trilu_indices"):
            if not hasattr(cmi, name):
                setattr(cmi, name, _Missing(f"common_methods_invocations.{name}"))
                applied.append(f"common_methods_invocations.{name}")
    except Exception as e:  # the test file's own import will then show the real error
        applied.append(f"(common_methods_invocations not importable: {e!r})")

    # Any other name a test file imports from torch that this torch lacks (a file newer than it).
    for path in {str(a).split("::")[0] for a in config.args}:
        applied += _fill_missing_imports(path)

    # Renamed, same object: torch.cuda._Graph became CUDAGraph, _graph_pool_handle graph_pool_handle.
    if not hasattr(torch.cuda, "_Graph") and hasattr(torch.cuda, "CUDAGraph"):
        torch.cuda._Graph = torch.cuda.CUDAGraph
        applied.append("torch.cuda._Graph = CUDAGraph")
    if not hasattr(torch.cuda, "_graph_pool_handle") and hasattr(torch.cuda, "graph_pool_handle"):
        torch.cuda._graph_pool_handle = torch.cuda.graph_pool_handle
        applied.append("torch.cuda._graph_pool_handle = graph_pool_handle")
    return applied


def _fill_missing_imports(path):
    """Placeholders for the names ``from torch... import`` statements of ``path`` ask for that
    the installed torch lacks; returns what was filled."""
    import ast

    if not (path.endswith(".py") and os.path.isfile(path)):
        return []
    filled = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):  # a third-party module this machine lacks (psutil, ...)
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top not in sys.modules and importlib.util.find_spec(top) is None:
                    stub = types.ModuleType(top)
                    stub.__getattr__ = lambda attr, top=top: _Missing(f"{top}.{attr}")
                    sys.modules[top] = stub
                    filled.append(f"module {top}")
            continue
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch")):
            continue
        try:
            mod = importlib.import_module(node.module)
        except Exception as e:  # the test file's own import shows the real error
            filled.append(f"({node.module} not importable: {e!r})")
            continue
        for alias in node.names:
            if alias.name != "*" and not hasattr(mod, alias.name):
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule
                except Exception:
                    setattr(mod, alias.name, _Missing(f"{node.module}.{alias.name}"))
                    filled.append(f"{node.module}.{alias.name}")
    return filled


def pytest_configure(config):
    global _stacks
    mode = None
    # cudamem first: the compat imports below load torch's test helpers, which must not get to
    # CUDA before install() does.
    if os.environ.get("CUDAMEM_PYTEST_INSTALL") == "1":
        mode = _install_cudamem()
    else:
        _header.append("cudamem_pytest_plugin: torch's own CUDA allocator (cudamem not installed)")
    applied = _compat(config)
    _header.append("cudamem_pytest_plugin: filled in for this torch: " + (", ".join(applied) or "nothing"))
    _event(ev="configure", install_mode=mode, compat=applied, pid=os.getpid())
    if _events_path:
        _stacks = open(_events_path + ".stacks", "a")


def pytest_report_header(config):
    return list(_header)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(items):
    _event(ev="collected", ids=[item.nodeid for item in items])


def _segments():
    """The allocator's segments as torch's memory_snapshot() reports them, in brief."""
    import torch

    return [{"pool": list(s["segment_pool_id"]), "size": s["total_size"], "allocated": s["allocated_size"],
             "expandable": s.get("is_expandable"), "stream": s["stream"]} for s in torch.cuda.memory_snapshot()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _event(ev="start", id=item.nodeid)
    if os.environ.get("CUDAMEM_PYTEST_SEGMENTS") == "1":  # what the allocator holds as the test starts
        _event(ev="segments", id=item.nodeid, segments=_segments())
    limit = _build_timeout if item.nodeid.split("::")[-1] in _slow else _timeout
    if limit > 0:
        if _stacks is not None:
            _stacks.write(f"\n--- {item.nodeid}: stacks if it runs past {limit:g} s\n")
            _stacks.flush()
        faulthandler.dump_traceback_later(limit, exit=True, file=_stacks or sys.__stderr__)
    try:
        yield
    finally:
        if limit > 0:
            faulthandler.cancel_dump_traceback_later()


def pytest_runtest_logreport(report):
    _reports.setdefault(report.nodeid, {})[report.when] = report


def _message(report):
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple) and len(lr) == 3:  # a skip: (file, line, reason)
        return str(lr[2])
    crash = getattr(lr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return crash.message
    lines = [ln for ln in str(lr).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _outcome(reps):
    setup, call, teardown = reps.get("setup"), reps.get("call"), reps.get("teardown")
    if setup is not None and setup.failed:
        return "error", _message(setup)
    if setup is not None and setup.skipped:
        return "skipped", _message(setup)
    if call is None:
        return "error", "no call phase"
    if hasattr(call, "wasxfail"):
        return ("xfailed" if call.skipped else "xpassed"), str(call.wasxfail)
    if call.failed:
        return "failed", _message(call)
    if call.skipped:
        return "skipped", _message(call)
    if teardown is not None and teardown.failed:
        return "error", "teardown: " + _message(teardown)
    return "passed", ""


def pytest_runtest_logfinish(nodeid, location):
    outcome, msg = _outcome(_reports.pop(nodeid, {}))
    _event(ev="result", id=nodeid, outcome=outcome, msg=msg[:300])
