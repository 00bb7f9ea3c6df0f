"""The GPU-free recorder on a fine-tuning job: a frozen half-precision base with a trainable
adapter (as peft's LoRA builds one) and grouped-query attention called the way transformers'
models call it (``enable_gqa=True``). What the recorder keeps alive must be what torch keeps:
its live bytes are compared with the same job run on real CPU tensors (CPU autocast, whose cast
rules agree with CUDA's for the ops used here), and the attention must take the fused kernel
CUDA takes, not the math path's fp32 attention matrix."""

import weakref

import pytest

import cudamem.estimate as est
from test_estimate import needs_torch

B, T, HQ, HKV, D = 2, 256, 4, 2, 32  # attention matrix: B*HQ*T*T fp32 = 2 MiB, larger than any tensor here


def _job(device, autocast_device, enable_gqa=True, kv_heads=HKV):
    """Two attention layers over a frozen bf16 base; LoRA adapters (fp32, trainable) on the
    query and value projections; AdamW over the adapters only."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Lora(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base
            self.a = nn.Linear(base.in_features, 8, bias=False)
            self.b = nn.Linear(8, base.out_features, bias=False)

        def forward(self, x):
            return self.base(x) + self.b(self.a(x.to(self.a.weight.dtype))) * 2.0

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            w = HQ * D
            self.q, self.k = nn.Linear(w, w, bias=False), nn.Linear(w, kv_heads * D, bias=False)
            self.v, self.o = nn.Linear(w, kv_heads * D, bias=False), nn.Linear(w, w, bias=False)

        def forward(self, x):
            q = self.q(x).view(B, T, HQ, D).transpose(1, 2)
            k = self.k(x).view(B, T, kv_heads, D).transpose(1, 2)
            v = self.v(x).view(B, T, kv_heads, D).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)
            return x + self.o(y.transpose(1, 2).reshape(B, T, HQ * D))

    torch.manual_seed(0)
    layers = nn.Sequential(Layer(), Layer()).to(torch.bfloat16)
    for p in layers.parameters():
        p.requires_grad_(False)
    for layer in layers:
        layer.q, layer.v = Lora(layer.q), Lora(layer.v)
    layers.to(device)
    opt = torch.optim.AdamW([p for p in layers.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(2):
        x = torch.randn(B, T, HQ * D, device=device, dtype=torch.bfloat16)
        with torch.autocast(autocast_device, dtype=torch.bfloat16):
            loss = layers(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _live_peak_on_cpu(fn):
    """The peak of live tensor bytes of ``fn`` on real CPU tensors, counted as the recorder
    counts meta ones (each new storage from its op until its finalizer)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sizes, self.live, self.peak = {}, 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    s = t.untyped_storage()
                    if s._cdata not in self.sizes and s.nbytes():
                        self.sizes[s._cdata] = s.nbytes()
                        self.live += s.nbytes()
                        self.peak = max(self.peak, self.live)
                        weakref.finalize(s, self.dead, s._cdata)
            return out

        def dead(self, k):
            self.live -= self.sizes.pop(k, 0)

    with Live() as live:
        fn()
    return live.peak


def _alloc_ops(e):
    return [(ev["frames"][0]["name"], ev["size"]) for ev in e.trace["device_traces"][0]
            if ev["action"] == "alloc" and ev["frames"]]


@needs_torch
@pytest.mark.parametrize("kv_heads", [HKV, HQ], ids=["grouped", "heads-agree"])
def test_grouped_query_attention_takes_the_fused_kernel_and_keeps_what_torch_keeps(kv_heads):
    import torch

    e = est.estimate(_job, "cuda", "cuda", kv_heads=kv_heads, policies=["pytorch"])
    ops = _alloc_ops(e)
    # CUDA's flash kernel serves enable_gqa (heads dividing the query heads): no attention matrix.
    assert any(name == "aten._scaled_dot_product_flash_attention" for name, _ in ops), ops
    assert not any(name == "aten._safe_softmax" for name, _ in ops), ops
    assert max(size for name, size in ops if not name_is_workspace(name)) < B * HQ * T * T * 4
    # The live bytes (workspaces aside) are those of the same job on real tensors: nothing
    # frozen gets a gradient, an optimizer state or a cached cast, and what autograd saves has
    # the dtype it has under autocast.
    workspaces = sum(size for name, size in ops if name_is_workspace(name))
    cpu = _live_peak_on_cpu(lambda: _job("cpu", "cpu", kv_heads=kv_heads))
    assert abs((e.peak_requested - workspaces) - cpu) <= 4096, (e.peak_requested, workspaces, cpu)
    assert torch.amp.autocast_mode.autocast.__init__.__name__ == "__init__"


def name_is_workspace(name):
    return name in ("cuBLAS workspace", "cuBLASLt workspace")


@needs_torch
def test_attention_without_a_fused_kernel_takes_the_math_path():
    # Grouped heads without enable_gqa are an error on CUDA too; with a float32 input (no flash)
    # and grouped heads, the memory-efficient kernel does not serve them: CUDA runs the math path.
    import torch
    import torch.nn.functional as F

    def step(dtype):
        q = torch.randn(B, HQ, T, D, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(B, HKV, T, D, device="cuda", dtype=dtype, requires_grad=True)
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True).float().sum().backward()

    ops = [name for name, _ in _alloc_ops(est.estimate(step, torch.float32, policies=["pytorch"]))]
    assert "aten._safe_softmax" in ops and "aten._scaled_dot_product_flash_attention" not in ops
    ops = [name for name, _ in _alloc_ops(est.estimate(step, torch.bfloat16, policies=["pytorch"]))]
    assert "aten._scaled_dot_product_flash_attention" in ops and "aten._safe_softmax" not in ops
