"""Installs cudamem's native allocator outside pytest and allocates one CUDA tensor, so that a
build or install failure shows its own error before any test runs (pytorch_tests.sh, step 1)."""

import torch

import cudamem.torch

cudamem.torch.install(native=True)
x = torch.ones(1 << 20, device="cuda")
print("install_mode():", cudamem.torch.install_mode(), " a CUDA tensor:", x.sum().item(),
      "allocated:", torch.cuda.memory_allocated())
