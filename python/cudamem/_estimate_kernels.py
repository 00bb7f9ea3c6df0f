"""What CUDA's kernels are and return where the meta device differs, for the GPU-free recorder
(:mod:`cudamem._estimate_torch`): the attention kernel ``scaled_dot_product_attention`` picks,
dropout's fused kernel with its one-byte mask, and the outputs of ops that have no meta kernel.
Guarantees: each function returns tensors of the shapes and dtypes the CUDA kernel returns, so
that what autograd keeps of them is what it keeps on the GPU; inputs these rules do not cover go
to torch's own function, which raises what it raises.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dropout(input, p=0.5, training=True, inplace=False):
    """CUDA's dropout: native_dropout, whose mask (kept for backward) is one byte an element;
    elsewhere dropout multiplies by a noise tensor of the input's dtype."""
    if not training or p == 0.0 or inplace or input.device.type != "meta":
        return F.dropout(input, p, training, inplace)
    return torch.ops.aten.native_dropout(input, p, True)[0]


def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The attention kernel CUDA's dispatcher would choose, on meta tensors: flash for half types
    without a mask, grouped-query attention included (``enable_gqa`` with key/value heads
    dividing the query heads: flash reads the shared heads in place, as transformers' models
    ask for with ``enable_gqa=True`` even when the heads agree); memory-efficient otherwise, when
    the heads agree; else the math path, whose fp32 attention matrix is what CUDA's math kernel
    keeps too."""
    dense = (q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and q.size(-1) <= 256 and q.device.type == "meta")
    if dense:
        hq, hk, hv = q.size(1), k.size(1), v.size(1)
        same_heads = hq == hk == hv
        grouped = bool(enable_gqa) and hk == hv and 0 < hk and hq % hk == 0
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        if attn_mask is None and q.dtype in (torch.float16, torch.bfloat16) and (same_heads or grouped):
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False,
                                                                      scale=scale)[0]
        if same_heads:
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(attn_mask.logical_not(),
                                                                                  float("-inf"))
            return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, needs_grad, dropout_p,
                                                                          is_causal, scale=scale)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                          scale=scale, enable_gqa=enable_gqa)


def _ctc_loss(log_probs, targets, *rest, **kw):
    """CUDA's ``_ctc_loss`` outputs: the per-sample loss and ``log_alpha`` (batch, time,
    2 * longest target + 1), kept for backward; padded 2-D targets bound the longest target."""
    t, n = log_probs.shape[0], log_probs.shape[1]
    longest = targets.shape[1] if targets.dim() == 2 else targets.shape[0]
    return (log_probs.new_empty((n,)), log_probs.new_empty((n, t, 2 * longest + 1)))


def _ctc_loss_backward(grad, log_probs, *rest, **kw):
    return torch.empty_like(log_probs)


#: Ops with no meta kernel, given the outputs their CUDA kernels return.
NO_META = {"_ctc_loss": _ctc_loss, "_ctc_loss_backward": _ctc_loss_backward}
