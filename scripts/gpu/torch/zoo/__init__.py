"""A zoo of GPU jobs for checking cudamem's will-it-fit answers on jobs it was not tuned on.

Each job is ``run(batch, dev, dry=False)`` (see :mod:`zoo.harness`): it builds its model with
random weights, makes its data and runs its steps, and reads no tensor value, so that the same
function runs on the GPU and under ``cudamem.estimate`` without one. ``JOBS`` maps each name to
its :class:`Job`: the function, its family, what it exercises, the batches a scaling estimate
records, the batch the estimate is checked at, and the same two at the ``dry`` (tiny) size.

The jobs are split in two, and the split is part of the contract:

* :data:`VALIDATION`: jobs the estimator must never be developed on. A change to the recorder or
  the replay is judged on these only after it is made; a fix for one of them must be found on a
  development job (or a new one) that shows the same cause. It holds the four jobs measured on
  an H200 before the zoo existed (a diffusion UNet, a speech encoder-decoder, a channels-last
  ConvNeXt, a LoRA fine-tune of a decoder LM) and a windowed-attention vision transformer.
* :data:`DEVELOPMENT`: every other job; free to look at while changing the estimator.

Libraries: torch with torchvision, timm, transformers, peft and torchaudio, imported inside the
jobs that need them (:data:`Job.needs`), so that this registry imports with torch alone.
"""

from dataclasses import dataclass
from typing import Callable, Tuple

from . import custom, speech, text, vision


@dataclass(frozen=True)
class Job:
    run: Callable
    family: str
    exercises: Tuple[str, ...]
    batches: Tuple[int, ...]  # recorded for scaling, at full size
    at: int  # the batch the estimate is checked at, at full size
    dry_batches: Tuple[int, ...] = (1, 2, 3)
    dry_at: int = 4
    needs: Tuple[str, ...] = ()  # libraries beyond torch


JOBS = {
    # development
    "gpt2_train": Job(text.gpt2_train, "decoder LM", ("full training",), (1, 2, 3), 8, needs=("transformers",)),
    "bert_partial_freeze": Job(text.bert_partial_freeze, "encoder", ("partially frozen layers",), (4, 8, 12), 32,
                               needs=("transformers",)),
    "roberta_grad_accum": Job(text.roberta_grad_accum, "encoder", ("gradient accumulation",), (2, 4, 6), 16,
                              needs=("transformers",)),
    "llama_ckpt": Job(text.llama_ckpt, "decoder LM", ("activation checkpointing", "grouped-query attention"),
                      (1, 2, 3), 8, needs=("transformers",)),
    "t5_translation": Job(text.t5_translation, "encoder-decoder", ("translation",), (8, 16, 24), 64,
                          needs=("transformers",)),
    "llama_generate": Job(text.llama_generate, "decoder LM", ("inference", "KV-cache generation"), (4, 8, 12), 32,
                          needs=("transformers",)),
    "bert_varlen": Job(text.bert_varlen, "encoder", ("inference", "variable-length batches"), (8, 16, 24), 64,
                       needs=("transformers",)),
    "vit_frozen": Job(vision.vit_frozen, "vision transformer", ("frozen backbone",), (16, 32, 48), 128,
                      needs=("timm",)),
    # Batch norm in training needs 2 or more samples where pooling leaves one value per channel.
    "deeplab_seg": Job(vision.deeplab_seg, "convnet", ("segmentation",), (2, 4, 6), 16, (2, 3, 4),
                       needs=("torchvision",)),
    "resnet_streams": Job(vision.resnet_streams, "convnet", ("several streams", "channels-last"), (16, 32, 48), 128,
                          (2, 3, 4), needs=("torchvision",)),
    "wav2vec2_ctc": Job(speech.wav2vec2_ctc, "speech encoder", ("partially frozen layers", "CTC"), (2, 4, 6), 16,
                        needs=("torchaudio",)),
    "moe_switch": Job(custom.moe_switch, "decoder LM", ("MoE routing",), (1, 2, 3), 8),
    "compile_default": Job(custom.compile_default, "decoder LM", ("torch.compile",), (1, 2, 3), 8),
    "compile_reduce_overhead": Job(custom.compile_reduce_overhead, "decoder LM",
                                   ("torch.compile reduce-overhead", "CUDA graphs"), (1, 2, 3), 8),
    # validation
    "unet_diffusion": Job(custom.unet_diffusion, "diffusion UNet", ("full training",), (4, 8, 12), 32),
    "whisper_speech": Job(speech.whisper_speech, "encoder-decoder", ("speech",), (4, 8, 12), 32,
                          needs=("transformers",)),
    "convnext_cl": Job(vision.convnext_cl, "convnet", ("channels-last", "cudnn.benchmark"), (16, 32, 48), 128,
                       needs=("timm",)),
    "llama_lora": Job(text.llama_lora, "decoder LM", ("LoRA adapters", "frozen bf16 base", "grouped-query attention"),
                      (1, 2, 3), 4, needs=("transformers", "peft")),
    "swin_train": Job(vision.swin_train, "vision transformer", ("windowed attention",), (16, 32, 48), 128,
                      needs=("timm",)),
}

#: Jobs the estimator is never developed on (module doc).
VALIDATION = ("unet_diffusion", "whisper_speech", "convnext_cl", "llama_lora", "swin_train")
#: Every other job.
DEVELOPMENT = tuple(n for n in JOBS if n not in VALIDATION)
