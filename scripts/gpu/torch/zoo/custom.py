"""Jobs of the zoo written in plain torch: models no allowed library ships, and the ways of
running a model that are not a model (torch.compile).

* unet_diffusion: a diffusion UNet (residual blocks with timestep embedding, self-attention at
  the two lowest resolutions, skip connections) trained to predict noise on 4x64x64 latents,
  bf16 autocast, AdamW.
* moe_switch: a decoder whose feed-forward layers are mixtures of 8 experts with top-2 routing
  and a fixed capacity per expert and sequence (dispatch and combine by one-hot einsum, as
  GShard does, so that no shape depends on the data), plus the load-balancing loss.
* compile_default / compile_reduce_overhead: a GPT-style decoder under ``torch.compile``,
  default mode and ``mode="reduce-overhead"`` (CUDA graphs, with their private memory pool).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import Block, TinyLM, lm_loss, timestep_embedding, train


class ResBlock(nn.Module):
    def __init__(self, cin, cout, temb):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(32 if cin % 32 == 0 else 8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(temb, cout)
        self.n2, self.c2 = nn.GroupNorm(32 if cout % 32 == 0 else 8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, t):
        h = self.c1(F.silu(self.n1(x))) + self.t(t)[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class Attn2d(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.norm, self.block = nn.GroupNorm(32 if c % 32 == 0 else 8, c), Block(c, heads, causal=False)

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.norm(x).flatten(2).transpose(1, 2)
        return x + self.block(y).transpose(1, 2).reshape(b, c, h, w)


class UNet(nn.Module):
    def __init__(self, chans=(128, 256, 512), attn=(False, True, True), heads=8, cin=4):
        super().__init__()
        temb = chans[0] * 4
        self.temb = nn.Sequential(nn.Linear(chans[0], temb), nn.SiLU(), nn.Linear(temb, temb))
        self.inp = nn.Conv2d(cin, chans[0], 3, padding=1)
        self.down, self.up, c = nn.ModuleList(), nn.ModuleList(), chans[0]
        skips = [c]
        for i, (ch, a) in enumerate(zip(chans, attn)):
            for _ in range(2):
                self.down.append(nn.ModuleList([ResBlock(c, ch, temb), Attn2d(ch, heads) if a else nn.Identity()]))
                c = ch
                skips.append(c)
            if i < len(chans) - 1:
                self.down.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
                skips.append(c)
        self.mid = nn.ModuleList([ResBlock(c, c, temb), Attn2d(c, heads), ResBlock(c, c, temb)])
        for i, (ch, a) in reversed(list(enumerate(zip(chans, attn)))):
            for _ in range(3):
                self.up.append(nn.ModuleList([ResBlock(c + skips.pop(), ch, temb),
                                              Attn2d(ch, heads) if a else nn.Identity()]))
                c = ch
            if i > 0:
                self.up.append(nn.Upsample(scale_factor=2, mode="nearest"))
        self.out = nn.Sequential(nn.GroupNorm(32 if c % 32 == 0 else 8, c), nn.SiLU(), nn.Conv2d(c, cin, 3, padding=1))
        self.c0 = chans[0]

    def forward(self, x, t):
        t = self.temb(timestep_embedding(t, self.c0))
        h = self.inp(x)
        hs = [h]
        for layer in self.down:
            h = layer[1](layer[0](h, t)) if isinstance(layer, nn.ModuleList) else layer(h)
            hs.append(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, t)), t)
        for layer in self.up:
            if isinstance(layer, nn.ModuleList):
                h = layer[1](layer[0](torch.cat([h, hs.pop()], dim=1), t))
            else:
                h = layer(h)
        return self.out(h)


def unet_diffusion(batch, dev, dry=False):
    torch.manual_seed(0)
    m = (UNet(chans=(32, 64), attn=(False, True), heads=4) if dry else UNet()).to(dev)
    size = 16 if dry else 64

    def batch_of():
        x0 = torch.randn(batch, 4, size, size, device=dev)
        noise = torch.randn_like(x0)
        t = torch.randint(0, 1000, (batch,), device=dev)
        a = (1 - t.float() / 1000)[:, None, None, None]
        return a.sqrt() * x0 + (1 - a).sqrt() * noise, t, noise

    train(m, batch_of, lambda m, b: F.mse_loss(m(b[0], b[1]).float(), b[2]))


class MoE(nn.Module):
    """Top-2 routing over ``experts`` feed-forward experts, GShard-style: each sequence is a group
    whose tokens fill each expert up to a fixed capacity (the rest are dropped), so that every
    shape follows the batch linearly and none depends on the data."""

    def __init__(self, d, experts=8, ff=4, capacity_factor=1.25):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, ff * d) * d ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, ff * d, d) * (ff * d) ** -0.5)
        self.experts, self.cf = experts, capacity_factor

    def forward(self, x):
        g, s, d = x.shape  # groups (sequences) of s tokens
        e = self.experts
        cap = max(1, int(self.cf * 2 * s / e))
        probs = F.softmax(self.router(x).float(), dim=-1)  # (g, s, e)
        gate, idx = probs.topk(2, dim=-1)
        onehot = F.one_hot(idx, e).float()  # (g, s, 2, e)
        # Position of each token in its expert's queue, within its group; past the capacity it is dropped.
        pos = (onehot.reshape(g, 2 * s, e).cumsum(1).reshape(g, s, 2, e) - 1) * onehot
        keep = onehot * (pos < cap).float()
        slot = F.one_hot(pos.long().clamp(0, cap - 1), cap).float() * keep[..., None]  # (g, s, 2, e, cap)
        dispatch = slot.sum(2)  # (g, s, e, cap)
        combine = (slot * gate[..., None, None]).sum(2)
        xin = torch.einsum("gsec,gsd->egcd", dispatch.to(x.dtype), x).reshape(e, g * cap, d)
        h = F.gelu(torch.bmm(xin, self.w1.to(xin.dtype)))
        out = torch.bmm(h, self.w2.to(h.dtype)).reshape(e, g, cap, d)
        self.aux = (probs.mean((0, 1)) * onehot[:, :, 0].mean((0, 1))).sum() * e
        return torch.einsum("gsec,egcd->gsd", combine.to(out.dtype), out)


class MoEBlock(Block):
    def __init__(self, d, heads):
        super().__init__(d, heads)
        self.moe = MoE(d)

    def forward(self, x):
        x = x + self.attend(x)
        return x + self.moe(self.ln2(x))


def moe_switch(batch, dev, dry=False):
    torch.manual_seed(0)
    vocab, d, heads, layers, seq = (512, 64, 4, 2, 32) if dry else (32000, 768, 12, 8, 1024)
    m = TinyLM(vocab, d, heads, layers, seq)
    m.blocks = nn.ModuleList(MoEBlock(d, heads) for _ in range(layers))
    m.to(dev)

    def loss_of(m, ids):
        return lm_loss(m(ids), ids) + 0.01 * sum(blk.moe.aux for blk in m.blocks)

    train(m, lambda: torch.randint(0, vocab, (batch, seq), device=dev), loss_of)


def _compiled(batch, dev, dry, mode):
    torch.manual_seed(0)
    vocab, d, heads, layers, seq = (512, 64, 4, 2, 32) if dry else (50304, 768, 12, 12, 1024)
    m = TinyLM(vocab, d, heads, layers, seq).to(dev)
    step = torch.compile(m, mode=mode)
    train(m, lambda: torch.randint(0, vocab, (batch, seq), device=dev), lambda _, ids: lm_loss(step(ids), ids))


def compile_default(batch, dev, dry=False):
    _compiled(batch, dev, dry, None)


def compile_reduce_overhead(batch, dev, dry=False):
    _compiled(batch, dev, dry, "reduce-overhead")
