"""Language jobs of the zoo, built with transformers (and peft) from configs, random weights.

* gpt2_train: GPT-2 small (124M), full training, bf16 autocast, AdamW, 1024 tokens.
* bert_partial_freeze: BERT-base classifier with the embeddings and the lower half of the layers
  frozen, 512 tokens.
* roberta_grad_accum: RoBERTa-base masked LM, gradient accumulation over 4 micro-batches.
* llama_ckpt: a Llama-shaped decoder (grouped-query attention) with activation checkpointing of
  every layer (``gradient_checkpointing_enable``), 2048 tokens.
* llama_lora: the same family at about 1B parameters, base frozen in bf16, peft LoRA adapters on
  the attention projections, 1024 tokens.
* t5_translation: a T5-small-shaped encoder-decoder, 256 source and 128 target tokens.
* llama_generate: greedy generation with transformers' key/value cache (``DynamicCache``), fp16,
  a 512-token prompt and 128 new tokens, inference mode.
* bert_varlen: BERT-base inference in fp16 over batches of different sequence lengths.
"""

import torch

from .harness import freeze, train


def _llama(dry, *, hidden, layers, heads, kv, ff, vocab, seq, dtype=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    if dry:
        hidden, layers, heads, kv, ff, vocab, seq = 64, 2, 4, 2, 160, 512, 32
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=seq,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg)
    return (m.to(dtype) if dtype is not None else m), vocab, seq


def _ids(batch, seq, vocab, dev):
    return torch.randint(0, vocab, (batch, seq), device=dev)


def gpt2_train(batch, dev, dry=False):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = (GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=32, bos_token_id=0, eos_token_id=0)
           if dry else GPT2Config())
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = GPT2LMHeadModel(cfg).to(dev)
    seq = cfg.n_positions
    train(m, lambda: _ids(batch, seq, cfg.vocab_size, dev), lambda m, ids: m(input_ids=ids, labels=ids).loss)


def bert_partial_freeze(batch, dev, dry=False):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = (BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                      vocab_size=512, max_position_embeddings=32) if dry else BertConfig())
    cfg.num_labels, cfg._attn_implementation = 4, "sdpa"
    torch.manual_seed(0)
    m = BertForSequenceClassification(cfg)
    freeze(m.bert.embeddings)
    for layer in m.bert.encoder.layer[: cfg.num_hidden_layers // 2]:
        freeze(layer)
    m.to(dev)
    seq = cfg.max_position_embeddings

    def batch_of():
        return _ids(batch, seq, cfg.vocab_size, dev), torch.randint(0, 4, (batch,), device=dev)

    train(m, batch_of, lambda m, b: m(input_ids=b[0], labels=b[1]).loss)


def roberta_grad_accum(batch, dev, dry=False):
    from transformers import RobertaConfig, RobertaForMaskedLM

    cfg = (RobertaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         vocab_size=512, max_position_embeddings=34) if dry
           else RobertaConfig(vocab_size=50265, max_position_embeddings=514))
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = RobertaForMaskedLM(cfg).to(dev)
    seq = cfg.max_position_embeddings - 2
    train(m, lambda: _ids(batch, seq, cfg.vocab_size, dev), lambda m, ids: m(input_ids=ids, labels=ids).loss,
          accumulate=4, steps=2)


def llama_ckpt(batch, dev, dry=False):
    m, vocab, seq = _llama(dry, hidden=1024, layers=16, heads=16, kv=4, ff=2816, vocab=32000, seq=2048)
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.to(dev).train()
    train(m, lambda: _ids(batch, seq, vocab, dev), lambda m, ids: m(input_ids=ids, labels=ids).loss)


def llama_lora(batch, dev, dry=False):
    from peft import LoraConfig, get_peft_model

    m, vocab, seq = _llama(dry, hidden=2048, layers=16, heads=32, kv=8, ff=5632, vocab=32000, seq=1024,
                           dtype=torch.bfloat16)
    m = get_peft_model(m, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    m.to(dev).train()
    train(m, lambda: _ids(batch, seq, vocab, dev), lambda m, ids: m(input_ids=ids, labels=ids).loss)


def t5_translation(batch, dev, dry=False):
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = (T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=512) if dry
           else T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128))
    cfg.decoder_start_token_id, cfg.pad_token_id = 0, 0
    src, tgt = (32, 16) if dry else (256, 128)
    torch.manual_seed(0)
    m = T5ForConditionalGeneration(cfg).to(dev)

    def batch_of():
        return _ids(batch, src, cfg.vocab_size, dev), _ids(batch, tgt, cfg.vocab_size, dev)

    train(m, batch_of, lambda m, b: m(input_ids=b[0], labels=b[1]).loss)


def llama_generate(batch, dev, dry=False):
    from transformers import DynamicCache

    m, vocab, _ = _llama(dry, hidden=1024, layers=16, heads=16, kv=4, ff=2816, vocab=32000, seq=2048,
                         dtype=torch.float16)
    m.to(dev).eval()
    prompt, new = (16, 8) if dry else (512, 128)
    with torch.inference_mode():
        ids = _ids(batch, prompt, vocab, dev)
        cache = DynamicCache()
        logits = m(input_ids=ids, past_key_values=cache, use_cache=True).logits
        for _ in range(new):
            nxt = logits[:, -1:].argmax(-1)
            logits = m(input_ids=nxt, past_key_values=cache, use_cache=True).logits


BERT_LENGTHS = (128, 512, 64, 384, 256, 32, 512, 192)


def bert_varlen(batch, dev, dry=False):
    from transformers import BertConfig, BertModel

    cfg = (BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                      vocab_size=512, max_position_embeddings=64) if dry else BertConfig())
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = BertModel(cfg, add_pooling_layer=False).to(dev).half().eval()
    lengths = [max(4, n // 16) for n in BERT_LENGTHS] if dry else BERT_LENGTHS
    with torch.inference_mode():
        for n in lengths:
            out = m(input_ids=_ids(batch, n, cfg.vocab_size, dev)).last_hidden_state
            del out

