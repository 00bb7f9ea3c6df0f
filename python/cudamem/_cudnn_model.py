"""The memory cuDNN's convolutions take from PyTorch's allocator, for the GPU-free recorder.

A cuDNN convolution allocates through torch's caching allocator in two ways, neither of which a
meta tensor shows:

* the **workspace** of the engine that runs it, allocated and freed around every call;
* with ``torch.backends.cudnn.benchmark``, at the first call of each (pass, shapes, strides,
  dtype): a **trial** workspace big enough for the candidate engines being timed, freed, then
  ``emptyCache()`` before the chosen engine's workspace is allocated. The cache release matters
  as much as the sizes: it returns every wholly free segment, so the cached blocks that later
  activations would have split are gone.

:func:`conv_passes` gives, for one convolution op, the passes cuDNN runs (forward; or the data
and the weight gradient of ``convolution_backward``) with their trial and workspace sizes. The
rules follow the engine families cuDNN picks for NCHW half-precision convolutions on tensor
cores, read from traces of PyTorch on an H200 (sm90, cuDNN 9, torch 2.11, batches 8 to 564 of
ResNet-50 with ``cudnn.benchmark``):

* an implicit GEMM that transposes its operands to NHWC keeps those copies in its workspace:
  input + output, and the filter when it is larger than 1x1;
* a pointwise (1x1, stride 1) convolution over at least 28x28 outputs runs as a plain GEMM with
  no workspace, forward and for the data gradient, and its weight gradient is split over the
  batch, one float32 partial gradient per sample (at 14x14 cuDNN picks either engine, by
  batch: the transposing one is modelled, the larger);
* an input whose channels are not a multiple of 8 (an RGB stem) is padded to 8 channels, and
  its forward engine keeps two output-sized buffers (three while timing);
* a weight gradient whose operands take at least 20 MiB needs 8 MiB beyond them (its split
  reduction), and timing the candidates 8 MiB more; a batch-split one is timed with its
  operands and 16 MiB.

Sizes have to be right relative to each other, not only in sum: PyTorch's best fit reuses a
just-freed workspace for the next one when it is no larger, so a weight gradient's workspace
that is a little larger than the data gradient's before it makes a new segment where an equal
one would not.

Other convolutions (3-D, grouped, dilated, transposed, channels-last, float32) are not
modelled: :func:`modelled` says so, and the recorder lists them in the estimate's ``left_out``.
The sizes are cuDNN's choice on that GPU; another GPU or cuDNN version may pick other engines.
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Sequence

MIB = 1 << 20
HALF = ("float16", "bfloat16")

#: Output positions (H x W) from which a pointwise convolution runs as a GEMM without workspace
#: and its weight gradient is split over the batch.
GEMM_MIN_POSITIONS = 28 * 28
#: What a weight gradient's engine needs beyond its transposed operands (and timing one, beyond
#: that): its split reduction.
WGRAD_EXTRA = 8 * MIB
#: The operand bytes from which a weight gradient's engine splits its reduction.
WGRAD_EXTRA_FROM = 20 * MIB


class Pass(NamedTuple):
    """One cuDNN call of a convolution op: ``kind`` is ``fwd``, ``dgrad`` or ``wgrad``; ``key``
    identifies it as torch's cache of benchmarked plans does; ``trial`` is the workspace of its
    benchmark, ``workspace`` the chosen engine's (bytes; 0 allocates nothing)."""

    kind: str
    key: tuple
    trial: int
    workspace: int


def _bytes(shape: Sequence[int], itemsize: int) -> int:
    return math.prod(shape) * itemsize


def modelled(x_shape: Sequence[int], w_shape: Sequence[int], dtype: str, contiguous: bool,
             stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool,
             groups: int) -> Optional[str]:
    """None when the rules above cover this convolution, else why not (for ``left_out``)."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        return "cuDNN workspaces of convolutions that are not 2-D"
    if transposed or groups != 1 or any(d != 1 for d in dilation):
        return "cuDNN workspaces of transposed, grouped or dilated convolutions"
    if dtype not in HALF:
        return "cuDNN workspaces of float32 convolutions"
    if not contiguous:
        return "cuDNN workspaces of channels-last convolutions"
    return None


def conv_passes(x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int], itemsize: int,
                stride: Sequence[int], padding: Sequence[int], dtype: str, passes: Sequence[str]) -> List[Pass]:
    """The passes ``passes`` (of ``fwd``, ``dgrad``, ``wgrad``) of the convolution of input
    ``x_shape`` with filter ``w_shape`` giving ``y_shape`` (NCHW). Requires that
    :func:`modelled` returned None for it."""
    x, y, w = _bytes(x_shape, itemsize), _bytes(y_shape, itemsize), _bytes(w_shape, itemsize)
    batch, cin = x_shape[0], x_shape[1]
    pointwise = w_shape[2] == 1 and w_shape[3] == 1
    unit_stride = all(s == 1 for s in stride)
    positions = y_shape[2] * y_shape[3]
    wt = 0 if pointwise else w
    padded = cin % 8 != 0
    xp = x // cin * (-(-cin // 8) * 8) if padded else x
    gemm = pointwise and unit_stride and positions >= GEMM_MIN_POSITIONS
    key = (tuple(x_shape), tuple(w_shape), tuple(stride), tuple(padding), dtype)
    out = []
    for kind in passes:
        if kind == "fwd":
            if padded:
                trial, ws = xp + 3 * y, xp + 2 * y
            else:
                trial = x + y + wt
                ws = 0 if gemm else trial
        elif kind == "dgrad":
            trial = x + y + wt
            ws = 0 if gemm else trial
        elif kind == "wgrad":
            if gemm:
                ws = batch * _bytes(w_shape, 4)
                trial = x + y + WGRAD_EXTRA * 2
            else:
                operands = xp + y if padded else x + y + wt
                extra = WGRAD_EXTRA if operands >= WGRAD_EXTRA_FROM else 0
                ws = operands + extra
                trial = ws + extra
        else:
            raise ValueError(f"unknown convolution pass {kind!r}: expected fwd, dgrad or wgrad")
        out.append(Pass(kind, key + (kind,), trial, ws))
    return out


def output_shape(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int]) -> List[int]:
    """NCHW output of a 2-D convolution (dilation 1)."""
    return [x_shape[0], w_shape[0]] + [(x_shape[2 + i] + 2 * padding[i] - w_shape[2 + i]) // stride[i] + 1
                                       for i in range(2)]
