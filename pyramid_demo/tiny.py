"""`tiny-random`: three tiny Llama models built from configs, offline and seeded.

The qualifier and draft are the target with seeded noise added to every weight (less
for the qualifier), so acceptance is partial and the qualifier sits closer to the
target than the draft, as in a real family. Runs every method in seconds on a CPU.
"""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from .lm import ModelTriplet

SPECIALS = ["<s>", "</s>"]
NOISE = {"draft": 0.05, "qualifier": 0.02}  # weight noise relative to each tensor's std


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with no merges: 256 byte tokens plus <s> and </s>."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(SPECIALS + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def tiny_config(vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.5, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )


def _noisy_copy(target: LlamaForCausalLM, scale: float, gen: torch.Generator) -> LlamaForCausalLM:
    model = LlamaForCausalLM(target.config)
    sd = {}
    for name, w in target.state_dict().items():
        std = w.float().std().clamp_min(1e-3) if w.numel() > 1 else torch.tensor(1e-3)
        sd[name] = w + scale * std * torch.randn(w.shape, generator=gen)
    model.load_state_dict(sd)
    return model.eval()


def tiny_random_triplet(seed: int = 0) -> ModelTriplet:
    tokenizer = byte_tokenizer()
    config = tiny_config(len(tokenizer))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        target = LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    qualifier = _noisy_copy(target, NOISE["qualifier"], gen)
    draft = _noisy_copy(target, NOISE["draft"], gen)
    return ModelTriplet(
        draft=draft, qualifier=qualifier, target=target, tokenizer=tokenizer,
        vocab_size=len(tokenizer), eos_ids=(tokenizer.eos_token_id,),
        names=("tiny-random/draft", "tiny-random/qualifier", "tiny-random/target"),
        preset="tiny-random",
        note="three tiny random Llama models: the draft and qualifier are noisy copies of the target",
    )
