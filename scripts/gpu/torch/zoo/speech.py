"""Speech jobs of the zoo, random weights, generated audio.

* whisper_speech: a Whisper-base-shaped encoder-decoder (transformers), 30 s of 80-bin log-mel
  features in, 128 label tokens out, full training.
* wav2vec2_ctc: torchaudio's wav2vec 2.0 base with a CTC head, its convolutional feature
  extractor frozen (fine-tuning as in the paper), 10 s of 16 kHz audio.
"""

import torch
import torch.nn.functional as F

from .harness import freeze, train


def whisper_speech(batch, dev, dry=False):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    if dry:
        cfg = WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=512,
                            num_mel_bins=16, max_source_positions=50, max_target_positions=32,
                            decoder_start_token_id=0, pad_token_id=0, bos_token_id=0, eos_token_id=0)
        frames, labels = 100, 16
    else:
        cfg = WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                            decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, vocab_size=51865)
        frames, labels = 3000, 128
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = WhisperForConditionalGeneration(cfg).to(dev)

    def batch_of():
        feats = torch.randn(batch, cfg.num_mel_bins, frames, device=dev)
        return feats, torch.randint(1, cfg.vocab_size, (batch, labels), device=dev)

    train(m, batch_of, lambda m, b: m(input_features=b[0], labels=b[1]).loss)


def wav2vec2_ctc(batch, dev, dry=False):
    import torchaudio

    torch.manual_seed(0)
    if dry:
        m = torchaudio.models.wav2vec2_model(
            extractor_mode="group_norm", extractor_conv_layer_config=[(32, 10, 5), (32, 3, 2), (32, 2, 2)],
            extractor_conv_bias=False, encoder_embed_dim=64, encoder_projection_dropout=0.1,
            encoder_pos_conv_kernel=16, encoder_pos_conv_groups=4, encoder_num_layers=2, encoder_num_heads=4,
            encoder_attention_dropout=0.1, encoder_ff_interm_features=128, encoder_ff_interm_dropout=0.0,
            encoder_dropout=0.1, encoder_layer_norm_first=False, encoder_layer_drop=0.0, aux_num_out=32)
        samples, labels = 4000, 10
    else:
        m = torchaudio.models.wav2vec2_base(aux_num_out=32, encoder_layer_drop=0.0)
        samples, labels = 160_000, 150
    freeze(m.feature_extractor)
    m.to(dev)

    def batch_of():
        return torch.randn(batch, samples, device=dev), torch.randint(1, 32, (batch, labels), device=dev)

    def loss_of(m, b):
        logits, _ = m(b[0])
        logp = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)
        t = torch.full((batch,), logp.size(0), dtype=torch.long, device=dev)
        n = torch.full((batch,), labels, dtype=torch.long, device=dev)
        return F.ctc_loss(logp, b[1], t, n)

    train(m, batch_of, loss_of)
