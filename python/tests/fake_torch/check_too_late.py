"""install() after CUDA was initialised must say so (run by test_torch_install.py)."""

import torch

import cudamem.torch as ct

torch.cuda.init()
try:
    ct.install()
except RuntimeError as e:
    assert "must run before the first CUDA tensor" in str(e), e
    assert not ct.is_installed()
    print("OK")
