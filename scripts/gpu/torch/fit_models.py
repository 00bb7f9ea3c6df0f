"""The five workloads of fit_check.py, in plain torch (no downloads, no torchvision).

Each workload is `run(batch, dev)`: it builds its model on `dev`, then runs its steps at that
batch size, and reads no tensor value, so that the same function runs on the GPU, under
`torch.cuda.memory._record_memory_history`, and under `cudamem.estimate` (meta tensors, no GPU).

* gpt2: a GPT-2-small-shaped decoder (12 layers, 768 wide, 12 heads, vocabulary 50257, 1024
  tokens), bf16 autocast, AdamW, 3 steps.
* resnet50: ResNet-50 (bottleneck blocks 3-4-6-3) on 224x224 images, cudnn.benchmark, bf16
  autocast, SGD with momentum, 3 steps.
* bert: a BERT-base-shaped encoder in fp16, inference on 8 batches of different sequence lengths.
* generate: the GPT-2-small decoder in fp16, a 128-token prompt and 64 new tokens, greedy, with a
  key/value cache grown by torch.cat at every token.
* ckpt: the GPT-2-small decoder trained with activation checkpointing of every block.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d, heads, causal):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.causal = heads, causal

    def forward(self, x, cache=None):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            if cache:  # grow the cache by this step's keys and values
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal and t > 1)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Transformer(nn.Module):
    def __init__(self, vocab, d=768, heads=12, layers=12, seq=1024, causal=True, ckpt=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, causal) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2
        self.ckpt = ckpt

    def forward(self, ids, caches=None, start=0):
        pos = torch.arange(start, start + ids.size(1), device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for i, blk in enumerate(self.blocks):
            if self.ckpt and self.training:
                x = checkpoint(blk, x, use_reentrant=False, preserve_rng_state=False)
            else:
                x = blk(x, None if caches is None else caches[i])
        return self.head(self.ln_f(x))


def gpt2(batch, dev, steps=3, ckpt=False):
    torch.manual_seed(0)
    m = Transformer(50257, ckpt=ckpt).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(steps):
        ids = torch.randint(0, 50257, (batch, 1024), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = m(ids)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), ids.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del logits, loss


def ckpt(batch, dev):
    gpt2(batch, dev, ckpt=True)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.c1, self.b1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.c2, self.b2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.c3, self.b3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(n):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def resnet50(batch, dev, steps=3):
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    m = ResNet50().to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        x = torch.randn(batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss


BERT_LENGTHS = (128, 512, 64, 384, 256, 32, 512, 192)


def bert(batch, dev):
    torch.manual_seed(0)
    m = Transformer(30522, seq=512, causal=False).to(dev).half().eval()
    with torch.inference_mode():
        for n in BERT_LENGTHS:
            ids = torch.randint(0, 30522, (batch, n), device=dev)
            out = m(ids)
            del out


def generate(batch, dev, prompt=128, new=64):
    torch.manual_seed(0)
    m = Transformer(50257).to(dev).half().eval()
    caches = [[] for _ in m.blocks]
    with torch.inference_mode():
        ids = torch.randint(0, 50257, (batch, prompt), device=dev)
        logits = m(ids, caches)
        for i in range(new):
            nxt = logits[:, -1:].argmax(-1)
            logits = m(nxt, caches, start=prompt + i)


# name: (function, batches recorded for scaling, batch the estimates are checked at)
WORKLOADS = {
    "gpt2": (gpt2, (1, 2, 3), 8),
    "resnet50": (resnet50, (8, 16, 24), 64),
    "bert": (bert, (4, 8, 12), 32),
    "generate": (generate, (2, 4, 6), 16),
    "ckpt": (ckpt, (1, 2, 3), 8),
}
