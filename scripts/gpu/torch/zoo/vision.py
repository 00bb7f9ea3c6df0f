"""Vision jobs of the zoo, built with timm and torchvision, random weights, generated images.

* convnext_cl: timm ConvNeXt-Base, channels-last with cudnn.benchmark, bf16 autocast, AdamW,
  224x224.
* vit_frozen: timm ViT-B/16 with its backbone frozen, only the classifier head trained (a linear
  probe), 224x224.
* swin_train: timm Swin-T (windowed attention with its shift masks), full training, 224x224.
* deeplab_seg: torchvision DeepLabV3-ResNet50 semantic segmentation (21 classes), 512x512, SGD.
* resnet_streams: torchvision ResNet-50 training whose next batch is copied to the GPU on a side
  stream while the current one trains (``record_stream``), channels-last.
"""

import torch
import torch.nn.functional as F

from .harness import freeze, train


def _images(batch, size, dev, channels_last=False):
    x = torch.randn(batch, 3, size, size, device=dev)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def convnext_cl(batch, dev, dry=False):
    import timm

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    name, size = ("convnext_atto", 32) if dry else ("convnext_base", 224)
    m = timm.create_model(name, pretrained=False, num_classes=1000).to(dev, memory_format=torch.channels_last)

    def batch_of():
        return _images(batch, size, dev, channels_last=True), torch.randint(0, 1000, (batch,), device=dev)

    train(m, batch_of, lambda m, b: F.cross_entropy(m(b[0]), b[1]))


def vit_frozen(batch, dev, dry=False):
    import timm

    torch.manual_seed(0)
    name, size = ("vit_tiny_patch16_224", 32) if dry else ("vit_base_patch16_224", 224)
    m = timm.create_model(name, pretrained=False, num_classes=100, img_size=size)
    freeze(m)
    for p in m.get_classifier().parameters():
        p.requires_grad_(True)
    m.to(dev)

    def batch_of():
        return _images(batch, size, dev), torch.randint(0, 100, (batch,), device=dev)

    train(m, batch_of, lambda m, b: F.cross_entropy(m(b[0]), b[1]))


def swin_train(batch, dev, dry=False):
    import timm

    torch.manual_seed(0)
    kw = dict(img_size=64, window_size=4, embed_dim=32, depths=(1, 1), num_heads=(2, 4)) if dry else {}
    m = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=1000, **kw).to(dev)
    size = 64 if dry else 224

    def batch_of():
        return _images(batch, size, dev), torch.randint(0, 1000, (batch,), device=dev)

    train(m, batch_of, lambda m, b: F.cross_entropy(m(b[0]), b[1]))


def deeplab_seg(batch, dev, dry=False):
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large, deeplabv3_resnet50

    torch.manual_seed(0)
    build, size = (deeplabv3_mobilenet_v3_large, 64) if dry else (deeplabv3_resnet50, 512)
    m = build(weights=None, weights_backbone=None, num_classes=21).to(dev)

    def batch_of():
        return _images(batch, size, dev), torch.randint(0, 21, (batch, size, size), device=dev)

    train(m, batch_of, lambda m, b: F.cross_entropy(m(b[0])["out"], b[1]), opt="sgd", lr=0.01)


def resnet_streams(batch, dev, dry=False, steps=3):
    from torchvision.models import resnet18, resnet50

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    m, size = (resnet18(num_classes=10), 32) if dry else (resnet50(num_classes=1000), 224)
    m = m.to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    side = torch.cuda.Stream()
    host = torch.randn(batch, 3, size, size).pin_memory()

    def load():
        with torch.cuda.stream(side):
            x = host.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = torch.zeros(batch, dtype=torch.long, device=dev)
        return x, y

    nxt = load()
    for _ in range(steps):
        torch.cuda.current_stream().wait_stream(side)
        x, y = nxt
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        nxt = load()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, loss
