"""cudamem._cudnn_model: the workspace sizes it gives against those PyTorch's traces show on an
H200 (ResNet-50, bf16, cudnn.benchmark), what it declines to model, and the cache release a
benchmark makes, replayed (no torch needed)."""

import pytest

import cudamem.estimate as est
from cudamem import _cudnn_model as cm

MIB = 1 << 20


def passes(x, w, stride, padding, kinds):
    y = cm.output_shape(x, w, stride, padding)
    return {p.kind: p for p in cm.conv_passes(x, w, y, 2, stride, padding, "bfloat16", kinds)}


def test_a_3x3_convolution_keeps_its_operands_transposed():
    # 64 x 64 x 56 x 56 bf16 in and out: 24.5 MiB each, the filter 72 KiB (traced: 49.07 MiB).
    p = passes([64, 64, 56, 56], [64, 64, 3, 3], [1, 1], [1, 1], ["fwd", "dgrad", "wgrad"])
    io = 2 * 64 * 64 * 56 * 56 * 2 + 64 * 64 * 9 * 2
    assert p["fwd"].workspace == p["fwd"].trial == io
    assert p["dgrad"].workspace == io
    assert p["wgrad"].workspace == io + cm.WGRAD_EXTRA  # operands over 20 MiB: a split reduction
    assert p["wgrad"].trial == p["wgrad"].workspace + cm.WGRAD_EXTRA


def test_a_pointwise_convolution_over_a_large_map_is_a_gemm():
    p = passes([64, 64, 56, 56], [256, 64, 1, 1], [1, 1], [0, 0], ["fwd", "dgrad", "wgrad"])
    x, y = 64 * 64 * 56 * 56 * 2, 64 * 256 * 56 * 56 * 2
    assert p["fwd"].workspace == 0 and p["fwd"].trial == x + y  # traced: 0 and 122.5 MiB
    assert p["dgrad"].workspace == 0
    assert p["wgrad"].workspace == 64 * 256 * 64 * 4  # one float32 partial per sample: 4 MiB
    # Over 7 x 7 the same filter shape takes the transposing engine (traced: 15.31 MiB).
    small = passes([64, 512, 7, 7], [2048, 512, 1, 1], [1, 1], [0, 0], ["fwd"])
    assert small["fwd"].workspace == 64 * 512 * 49 * 2 + 64 * 2048 * 49 * 2


def test_an_rgb_stem_is_padded_to_eight_channels():
    p = passes([64, 3, 224, 224], [64, 3, 7, 7], [2, 2], [3, 3], ["fwd"])
    xp, y = 64 * 8 * 224 * 224 * 2, 64 * 64 * 112 * 112 * 2
    assert p["fwd"].workspace == xp + 2 * y  # traced: 245.05 MiB
    assert p["fwd"].trial == xp + 3 * y  # traced: 343.24 MiB
    assert abs(p["fwd"].workspace - 245.05 * MIB) < 0.1 * MIB


def test_passes_of_one_convolution_share_its_shapes_in_their_keys():
    p = passes([8, 64, 56, 56], [64, 64, 3, 3], [1, 1], [1, 1], ["dgrad", "wgrad"])
    assert p["dgrad"].key[:-1] == p["wgrad"].key[:-1] and p["dgrad"].key != p["wgrad"].key
    with pytest.raises(ValueError, match="unknown convolution pass"):
        passes([8, 64, 56, 56], [64, 64, 3, 3], [1, 1], [1, 1], ["bwd"])


@pytest.mark.parametrize("args,why", [
    (([8, 64, 56], [64, 64, 3], "bfloat16", True, [1], [1], [1], False, 1), "not 2-D"),
    (([8, 64, 56, 56], [64, 8, 3, 3], "bfloat16", True, [1, 1], [1, 1], [1, 1], False, 8), "grouped"),
    (([8, 64, 56, 56], [64, 64, 3, 3], "float32", True, [1, 1], [1, 1], [1, 1], False, 1), "float32"),
    (([8, 64, 56, 56], [64, 64, 3, 3], "float16", False, [1, 1], [1, 1], [1, 1], False, 1), "channels-last"),
])
def test_what_is_not_modelled_says_why(args, why):
    assert why in cm.modelled(*args)
    assert cm.modelled([8, 64, 56, 56], [64, 64, 3, 3], "float16", True, [1, 1], [1, 1], [1, 1], False, 1) is None


def test_a_benchmark_cache_release_replays_as_empty_cache():
    # A 100 MiB trial freed, then a 60 MiB workspace: without the release, the workspace is cut
    # from the cached trial; with it, the trial's segment is gone and the peak is the larger one.
    def trace(release):
        b = est.TraceBuilder()
        b.alloc("trial", 100 * MIB)
        b.free("trial")
        if release:
            b.empty_cache()
        b.alloc("ws", 60 * MIB)
        b.free("ws")
        b.alloc("act", 80 * MIB)
        return b.snapshot()

    kept = est.replay(trace(False), ["pytorch"])[0]
    released = est.replay(trace(True), ["pytorch"])[0]
    assert kept["peak_reserved_bytes"] == 100 * MIB
    assert released["peak_reserved_bytes"] == 140 * MIB  # 60 MiB, then 80 MiB beside it
