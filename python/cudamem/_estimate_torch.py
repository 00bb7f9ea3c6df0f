"""The GPU-free recorder behind :mod:`cudamem.estimate`: a PyTorch program run on the meta
device, its CUDA memory recorded as a trace.

Design. Two modes wrap the recorded code:

* a ``TorchFunctionMode`` (:class:`_Redirect`) turns every ``cuda`` device into ``meta``
  (``device=`` arguments, ``Tensor.cuda()``, ``Tensor.to("cuda")``, ``Module.cuda()`` through
  them), so tensors have shapes, dtypes and storages of the right size but no data, and
  autograd runs on the CPU. It also does what CUDA would do differently from meta above the
  dispatcher: ``torch.autocast("cuda")`` (torch disables it without a GPU) is emulated with
  CUDA's cast lists and its cache of casted weights, and ``scaled_dot_product_attention`` takes
  the fused kernel CUDA would pick (flash for half types, memory-efficient otherwise) instead of
  the math path that materialises the attention matrix; dropout keeps CUDA's one-byte mask;
  ``Module.to("cuda")`` swaps tensors, so tied parameters stay tied as on CUDA.
* a ``TorchDispatchMode`` (:class:`_Track`) sees every aten op after decomposition, in program
  order, on the calling thread (the backward pass too: on the CPU the autograd engine runs in the
  caller's thread). Each new storage an op returns is an allocation of its ``nbytes``; a
  ``weakref.finalize`` on the storage marks its free, so memory that autograd keeps (saved
  tensors, shallow copies) lives exactly as long as on the GPU. The first matrix product of a
  thread (forward) and of the backward pass each allocate a cuBLAS workspace, as torch does per
  (handle, stream), and the first of all also the stream's cuBLASLt workspace (as recorded
  traces of torch on an H200 show: 32 MiB, 1 MiB, then 32 MiB in backward).

A 2-D half-precision convolution (``convolution``, ``convolution_backward``) also allocates
cuDNN's workspace per pass and, under ``cudnn.benchmark``, at a pass's first call the trial
workspace and a cache release (:mod:`cudamem._cudnn_model`). Foreach optimizer kernels are
enabled for meta tensors, since on CUDA optimizers take them and their temporaries differ from
the per-tensor loop. Side streams are stood in for (:mod:`cudamem._estimate_streams`): each
allocation is recorded on the stream current when it is made. Ops with no meta kernel that jobs
use (CTC loss) get the outputs their CUDA kernels return. ``torch.compile`` returns the code
unchanged (dynamo stands aside under these modes anyway) and says so. What only real kernels
allocate and no rule models is listed in the estimate's ``left_out`` (other cuDNN workspaces,
kernel-internal scratch buffers, NCCL, what compiling changes).
The code may not read tensor values, with one exception: a whole-tensor ``all()`` or ``any()``
read at once (``if mask.all():``, the checks model libraries make for padding, packed sequences
or non-finite values) answers as for ordinary data, True and False, and the estimate says how
many it answered; any other read raises an error that says so. Every patch is undone on exit,
also when the code raises.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import _cudnn_model, _estimate_streams
from ._estimate_kernels import NO_META, dropout, sdpa
from ._estimate_core import TraceBuilder, cublas_workspace_bytes, cublaslt_workspace_bytes, estimate_from

META = torch.device("meta")

# aten ops (overload packet names) that call cuBLAS on CUDA. Composite ones (linear, matmul,
# einsum) reach the mode whole under inference_mode, where autograd does not decompose them first.
_CUBLAS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "_scaled_mm",
           "addmm_", "baddbmm_", "_addmm_activation", "matmul", "linear", "einsum", "bilinear", "tensordot"}
_CUDNN = {"convolution", "cudnn_convolution", "convolution_backward", "cudnn_batch_norm",
          "_cudnn_rnn", "cudnn_convolution_transpose"}
# Convolution ops whose cuDNN workspaces the recorder models (cudamem._cudnn_model).
_CONV = {"convolution", "convolution_backward"}
_SCRATCH = {"sort", "argsort", "topk", "unique", "_unique2", "nonzero", "cumsum", "embedding_dense_backward",
            "index_put", "_index_put_impl_", "scatter_reduce", "_embedding_bag", "multinomial", "kthvalue",
            "median", "nll_loss_forward", "_fused_adam", "_fused_adamw",
            "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
            "_ctc_loss_backward"}

# Reads of a tensor's value (``.item()``, ``bool(t)``), and the reductions whose value the
# recorder answers as for ordinary data (module doc).
_READS = {"_local_scalar_dense", "is_nonzero"}
_CHECKS = {"all", "any"}


_LOW = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
        torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm, torch.baddbmm,
        torch.Tensor.baddbmm, torch.addbmm, torch.einsum, torch.mv, torch.conv1d, torch.conv2d, torch.conv3d,
        torch.conv_transpose1d, torch.conv_transpose2d, torch.conv_transpose3d, torch.prelu, torch.addmv,
        torch.addr, torch.chain_matmul,
        F.scaled_dot_product_attention}
_FP32 = {F.layer_norm, torch.layer_norm, F.group_norm, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss,
         F.binary_cross_entropy_with_logits, F.kl_div, F.nll_loss, torch.exp, torch.Tensor.exp, torch.log,
         torch.Tensor.log, torch.rsqrt, torch.Tensor.rsqrt, torch.pow, torch.Tensor.pow, torch.Tensor.__pow__,
         torch.logsumexp,
         F.softplus, torch.cdist, F.cosine_similarity}
_FP32_DTYPE = {F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, torch.Tensor.softmax,
               torch.Tensor.log_softmax, torch.cumsum, torch.Tensor.cumsum, torch.prod, torch.Tensor.prod,
               torch.sum, torch.Tensor.sum, torch.cumprod}


def _fix(d: Any) -> Any:
    if isinstance(d, (str, torch.device, int)) and not isinstance(d, bool):
        try:
            if torch.device(d).type == "cuda" or isinstance(d, int):
                return META
        except (RuntimeError, TypeError):
            return d
    return d


class _Autocast:
    """One emulated ``torch.autocast("cuda")`` region."""

    def __init__(self, dtype: torch.dtype, enabled: bool, cache: bool) -> None:
        self.dtype, self.enabled, self.cache = dtype, enabled, cache


class _Redirect(TorchFunctionMode):
    def __init__(self, rec: "Recorder") -> None:
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _fix(kwargs["device"])
        if func is torch.Tensor.cuda:
            return torch.Tensor.to(args[0], META, non_blocking=kwargs.get("non_blocking", False))
        if func is torch.Tensor.to:
            args = (args[0],) + tuple(_fix(a) if not isinstance(a, torch.Tensor) else a for a in args[1:])
        elif func is torch.Tensor.pin_memory:
            return args[0]
        ac = self.rec.autocast[-1] if self.rec.autocast else None
        if ac is not None and ac.enabled:
            if func in _LOW:
                args, kwargs = self._cast(args, ac.dtype, ac), self._cast(kwargs, ac.dtype, ac)
            elif func in _FP32:
                args, kwargs = self._cast(args, torch.float32, None), self._cast(kwargs, torch.float32, None)
            elif func in _FP32_DTYPE and kwargs.get("dtype") is None and args and _eligible(args[0]):
                kwargs["dtype"] = torch.float32
            elif func is F.cross_entropy and args and _eligible(args[0]) and not kwargs.get("label_smoothing"):
                # cross_entropy is in no autocast list: its C++ body calls log_softmax with the
                # input's dtype given (so autocast leaves it in half precision), then nll_loss,
                # which autocast runs in float32 (a float32 copy of the log-probabilities, saved
                # for backward next to the half one): the same here.
                dim = 1 if args[0].dim() >= 2 else 0
                kw = {k: v for k, v in kwargs.items() if k in ("weight", "ignore_index", "reduction")}
                logp = F.log_softmax(args[0], dim, dtype=args[0].dtype)
                return F.nll_loss(logp.to(torch.float32), *args[1:], **kw)
        if func is F.scaled_dot_product_attention:
            return sdpa(*args, **kwargs)
        if func is F.dropout:
            return dropout(*args, **kwargs)
        if func is torch.Tensor.backward:
            # This mode is off while it handles a call, and the backward pass can run Python that
            # needs it (activation checkpointing's recomputation): back on for the duration, around
            # the engine call (which no mode intercepts) rather than Tensor.backward itself.
            return _backward(self.rec, *args, **kwargs)
        return func(*args, **kwargs)

    def _cast(self, x: Any, dtype: torch.dtype, ac: Optional[_Autocast]) -> Any:
        if isinstance(x, torch.Tensor):
            if not _eligible(x) or x.dtype == dtype:
                return x
            cacheable = (ac is not None and ac.cache and x.dtype == torch.float32 and x.requires_grad
                         and x.is_leaf and x._base is None)
            if cacheable:
                hit = self.rec.cast_cache.get(id(x))
                if hit is not None and hit[0] is x:
                    return hit[1]
            y = x.to(dtype)
            if cacheable:
                self.rec.cast_cache[id(x)] = (x, y)
            return y
        if isinstance(x, (list, tuple)):
            return type(x)(self._cast(v, dtype, ac) for v in x)
        if isinstance(x, dict):
            return {k: self._cast(v, dtype, ac) for k, v in x.items()}
        return x


def _backward(rec: "Recorder", tensor, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    # torch.autograd.backward would hand itself to the mode again (which turns the mode off):
    # its body, from the point where no mode is asked any more.
    ag = torch.autograd
    run = getattr(getattr(ag, "graph", None), "_engine_run_backward", None)
    if run is None or not hasattr(ag, "_make_grads") or not hasattr(ag, "_tensor_or_tensors_to_tuple"):
        rec.notes.append("this torch's backward internals differ: recomputation in backward ran without "
                         "autocast emulation")
        return ag.backward(tensor, gradient, retain_graph, create_graph, inputs=inputs)
    inputs_tuple = () if inputs is None else (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    with _Redirect(rec):
        grads = ag._make_grads((tensor,), ag._tensor_or_tensors_to_tuple(gradient, 1), is_grads_batched=False)
        run((tensor,), grads, create_graph if retain_graph is None else retain_graph, create_graph, inputs_tuple,
            allow_unreachable=True, accumulate_grad=True)


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta" and t.is_floating_point() and t.dtype != torch.float64


class _Track(TorchDispatchMode):
    def __init__(self, rec: "Recorder") -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rec = self.rec
        name = func.overloadpacket.__name__
        if name in _CUBLAS:
            rec._workspace()
        elif name in _CUDNN and name not in _CONV:
            rec.left_out.setdefault("cudnn:" + name, f"cuDNN workspaces of {name}")
        elif name in _SCRATCH:
            rec.left_out.setdefault("scratch:" + name, f"scratch memory inside {name} kernels")
        elif name in _READS and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            return rec._read(args[0], name)
        if name in NO_META and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            out = NO_META[name](*args, **(kwargs or {}))
        else:
            out = func(*args, **(kwargs or {}))
        if name in _CHECKS and isinstance(out, torch.Tensor) and out.device.type == "meta" and out.dim() == 0:
            rec.checks[id(out)] = (weakref.ref(out), name == "all")
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                rec._track(t, name)
        if name in _CONV:
            rec._convolution(name, args, out)
        return out


class Recorder:
    """Records CUDA memory of the code run inside ``with Recorder():`` (see the module doc)."""

    def __init__(self, compute_capability: int = 9) -> None:
        self.builder = TraceBuilder()
        self.workspace = cublas_workspace_bytes(major=compute_capability)
        self.lt_workspace = cublaslt_workspace_bytes()
        self.left_out: Dict[str, str] = {"nccl": "NCCL buffers and the CUDA context (never in reserved memory)"}
        self.notes: List[str] = []
        self.autocast: List[_Autocast] = []
        self.cast_cache: Dict[int, tuple] = {}
        self._ws_keys: set = set()
        self._lt_streams: set = set()
        self.stream = 0  # the current stream's number (cudamem._estimate_streams)
        self._benchmarked: set = set()
        self.conv_passes = 0
        self._sizes: Dict[int, int] = {}
        self.checks: Dict[int, tuple] = {}
        self.answered = 0
        self._open = False
        self._undo: List[Any] = []

    # -- recording ---------------------------------------------------------------------------
    def _workspace(self) -> None:
        """torch's cuBLAS workspace per (handle, stream), a handle per thread (the backward pass
        has its own), and its cuBLASLt workspace once per stream, whatever thread asks first."""
        thread = "backward" if torch._C._current_graph_task_id() != -1 else threading.get_ident()
        key = (thread, self.stream)
        if key not in self._ws_keys:
            self._ws_keys.add(key)
            self.builder.alloc(("cublas", key), self.workspace, stream=self.stream, frames=_frame("cuBLAS workspace"))
            if self.stream not in self._lt_streams:
                self._lt_streams.add(self.stream)
                self.builder.alloc(("cublaslt", self.stream), self.lt_workspace, stream=self.stream,
                                   frames=_frame("cuBLASLt workspace"))

    def _convolution(self, name: str, args: tuple, out: Any) -> None:
        """cuDNN's memory for a convolution op whose outputs are recorded: per pass, under
        ``cudnn.benchmark`` at its first call the trial workspace and the cache release, then
        the workspace (cudamem._cudnn_model)."""
        if name == "convolution":
            x, w, stride, padding, dilation, transposed, groups = args[0], args[1], *args[3:7], args[8]
            y, passes = out, ["fwd"]
        else:
            y, x, w = args[0], args[1], args[2]
            stride, padding, dilation, transposed, groups, mask = *args[4:8], args[9], args[10]
            passes = [p for p, m in (("dgrad", mask[0]), ("wgrad", mask[1])) if m]
        if not all(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in (x, w, y)):
            return
        if not torch.backends.cudnn.enabled:
            return
        dtype = str(x.dtype).replace("torch.", "")
        why = _cudnn_model.modelled(x.shape, w.shape, dtype, x.is_contiguous(), stride, padding, dilation,
                                    bool(transposed), int(groups))
        if why is not None:
            self.left_out.setdefault("cudnn:" + why, why)
            return
        benchmark = torch.backends.cudnn.benchmark
        for p in _cudnn_model.conv_passes(x.shape, w.shape, y.shape, x.element_size(), stride, padding, dtype,
                                          passes):
            self.conv_passes += 1
            if benchmark and p.key not in self._benchmarked:
                self._benchmarked.add(p.key)
                self.builder.alloc("cudnn-trial", p.trial, stream=self.stream,
                                   frames=_frame("cuDNN benchmark workspace"))
                self.builder.free("cudnn-trial")
                self.builder.empty_cache()
            self.builder.alloc("cudnn", p.workspace, stream=self.stream, frames=_frame("cuDNN workspace"))
            self.builder.free("cudnn")

    def _track(self, t: torch.Tensor, op: str) -> None:
        s = t.untyped_storage()
        k, n = s._cdata, s.nbytes()
        old = self._sizes.get(k)
        if old == n:
            return
        self._sizes[k] = n
        self.builder.alloc(k, n, stream=self.stream, frames=_frame("aten." + op))
        if old is None:
            weakref.finalize(s, self._dead, k)

    def _read(self, t: torch.Tensor, op: str) -> Any:
        """The value of a meta tensor that the code reads: a whole-tensor ``all()`` answers True
        and ``any()`` False (the checks libraries make for padding, packed sequences or
        non-finite values, which the generated data has none of); any other read is an error."""
        hit = self.checks.get(id(t))
        if hit is not None and hit[0]() is t:
            self.answered += 1
            return hit[1]
        raise RuntimeError(f"the recorded code reads a tensor's value (aten.{op}: .item(), bool(), printing, or a "
                           "data-dependent shape), which a GPU-free estimate cannot know: only whole-tensor "
                           "all()/any() checks are answered (as for ordinary data)")

    def _dead(self, k: int) -> None:
        self._sizes.pop(k, None)
        if self._open:
            self.builder.free(k)

    # -- patches -----------------------------------------------------------------------------
    def _patch(self, obj: Any, name: str, value: Any) -> None:
        self._undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def _patch_all(self) -> None:
        rec = self
        opt = sys.modules.get("torch.optim.optimizer")
        if opt is not None and hasattr(opt, "_get_foreach_kernels_supported_devices"):
            orig = opt._get_foreach_kernels_supported_devices
            self._patch(opt, "_get_foreach_kernels_supported_devices", lambda: list(orig()) + ["meta"])
        ac_cls = torch.amp.autocast_mode.autocast
        init, enter, exit_ = ac_cls.__init__, ac_cls.__enter__, ac_cls.__exit__

        def ac_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            self._cudamem = None
            if device_type in ("cuda", "meta"):  # meta: what checkpoint's recomputation asks for
                self._cudamem = _Autocast(dtype or torch.float16, bool(enabled), cache_enabled is not False)
                self.device, self.fast_dtype, self._enabled = "cuda", dtype or torch.float16, bool(enabled)
                return
            init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        def ac_enter(self):
            if getattr(self, "_cudamem", None) is None:
                return enter(self)
            rec.autocast.append(self._cudamem)
            return self

        def ac_exit(self, *exc):
            if getattr(self, "_cudamem", None) is None:
                return exit_(self, *exc)
            if rec.autocast:
                rec.autocast.pop()
            if not any(a.enabled for a in rec.autocast):
                rec.cast_cache.clear()  # torch drops its cast cache when leaving autocast
            return False

        self._patch(ac_cls, "__init__", ac_init)
        self._patch(ac_cls, "__enter__", ac_enter)
        self._patch(ac_cls, "__exit__", ac_exit)
        self._patch(torch.cuda, "synchronize", lambda device=None: None)
        for obj, name, value in _estimate_streams.patches(self):
            self._patch(obj, name, value)

        def compile_(model=None, **kwargs):
            # Dynamo stands aside under the recorder's modes: what runs is the eager code. Said
            # so, since compiled kernels keep other tensors (and reduce-overhead a graph pool).
            mode = kwargs.get("mode") or "default"
            rec.left_out.setdefault("compile:" + mode, f"torch.compile (mode {mode}): recorded as eager code; "
                                    "compiled kernels save other tensors for backward"
                                    + (", and CUDA graphs keep a private memory pool" if "overhead" in mode
                                       or "cudagraphs" in mode else ""))
            return (lambda m: m) if model is None else model

        self._patch(torch, "compile", compile_)
        # Module.to("cuda") keeps a tied parameter tied (``param.data = ...``); CPU -> meta cannot
        # set data, and its fallback makes a new Parameter per module (two weights, two grads,
        # two optimizer states). Swapping tensors keeps the Parameter objects, so ties hold.
        fut = getattr(torch, "__future__", None)
        if fut is not None and hasattr(fut, "get_swap_module_params_on_conversion"):
            swap = fut.get_swap_module_params_on_conversion
            self._patch(fut, "get_swap_module_params_on_conversion",
                        lambda: sys._getframe(1).f_code.co_name == "_apply" or swap())
        # Activation checkpointing saves the autocast state of the tensors' device (meta here)
        # and recomputes under it: answer for the emulated one.
        is_enabled, get_dtype, available = torch.is_autocast_enabled, torch.get_autocast_dtype, torch.amp.is_autocast_available

        def ac_enabled(device_type=None):
            if device_type in ("cuda", "meta"):
                return bool(rec.autocast) and rec.autocast[-1].enabled
            return is_enabled() if device_type is None else is_enabled(device_type)

        def ac_dtype(device_type):
            if device_type in ("cuda", "meta"):
                return rec.autocast[-1].dtype if rec.autocast else torch.float16
            return get_dtype(device_type)

        self._patch(torch, "is_autocast_enabled", ac_enabled)
        self._patch(torch, "get_autocast_dtype", ac_dtype)
        self._patch(torch.amp, "is_autocast_available", lambda d: d == "meta" or available(d))
        ac_mod = sys.modules.get("torch.amp.autocast_mode")
        if ac_mod is not None and getattr(ac_mod, "is_autocast_available", None) is available:
            self._patch(ac_mod, "is_autocast_available", lambda d: d == "meta" or available(d))

    def __enter__(self) -> "Recorder":
        if self._open:
            raise RuntimeError("this recorder is already recording")
        self._patch_all()
        self._modes = [_Redirect(self), _Track(self)]
        try:
            for m in self._modes:
                m.__enter__()
        except BaseException:
            self._unpatch()
            raise
        self._open = True
        return self

    def __exit__(self, *exc: Any) -> bool:
        for m in reversed(self._modes):
            m.__exit__(None, None, None)
        self._unpatch()
        self.cast_cache.clear()
        self.checks.clear()
        self._open = False
        return False

    def _unpatch(self) -> None:
        while self._undo:
            obj, name, value = self._undo.pop()
            setattr(obj, name, value)

    # -- result ------------------------------------------------------------------------------
    def estimate(self, device_memory: Any = None, policies: Any = ("pytorch", "cudamem"),
                 config: Optional[str] = None):
        """The recorded trace replayed (see :func:`cudamem.estimate.estimate`)."""
        if self._open:
            raise RuntimeError("estimate() after the recorded block, not inside it")
        notes = list(self.notes)
        if self.answered:
            notes.append(f"{self.answered} all()/any() check(s) of tensor values answered as for ordinary data "
                         "(all() true, any() false)")
        if self._ws_keys:
            notes.append(f"{len(self._ws_keys)} cuBLAS workspace(s) of {self.workspace} bytes and "
                         f"{len(self._lt_streams)} cuBLASLt workspace(s) of {self.lt_workspace} bytes modelled")
        if self.conv_passes:
            notes.append(f"cuDNN workspaces of {self.conv_passes} convolution passes modelled"
                         + (f", {len(self._benchmarked)} of them benchmarked (trial workspace and cache release)"
                            if self._benchmarked else ""))
        return estimate_from(self.builder, sorted(self.left_out.values()), notes, device_memory, policies, config)


# The frame names of modelled cuDNN workspaces are a contract: estimate replays shrink the
# allocations so named when they do not fit (cudamem-estimate's SHRINKING_FRAMES).
def _frame(name: str) -> list:
    return [{"name": name, "filename": "<cudamem.estimate>", "line": 0}]
