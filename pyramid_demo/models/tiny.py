"""`tiny-random`: three tiny seeded Llama models built offline; the draft and qualifier are the target plus noise."""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ..forward.lm import ModelTriplet

NOISE = {"draft": 0.05, "qualifier": 0.02}  # weight noise relative to each tensor's std
SPECIALS = ["<s>", "</s>", "<unk>"]
PUNCTUATION = [".", ",", "?", "!", "\n"]
# common English words, so that random models write readable word salad in the demo lanes
WORDS = """the of and to in is it that was for on are with as his they be at one have this from or had by word but what
some we can out other were all there when up use your how said an each she which do their time if will way about many
then them write would like so these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work part take get place made
live where after back little only round man year came show every good me give our under name very through just form
sentence great think say help low line turn cause much mean before move right boy old too same tell does set three want
air well also play small end put home read hand large spell add even land here must big high such follow act why ask
men change went light kind off need house picture try us again animal point mother world near build earth father head
stand own page should country found answer school grow study still learn plant cover food sun four between state keep
eye never last let thought city tree cross farm hard start might story saw far sea draw left late run while close night
real life few north open seem together next white children begin got walk example paper group always music those both
often letter until river car feet book carry took science eat room friend idea fish mountain stop once hear horse cut
sure watch color face wood main enough girl young ready above red list feel talk bird soon body dog family leave song
door black short class wind question happen ship half rock order fire south problem piece told knew pass since top
whole king space best hour better true remember step early hold west ground fast sing listen table travel less morning
simple toward love person money road map rain cold voice power town fine fly fall dark machine note wait plan star box
field rest able teach week green quick ocean warm free strong special mind clear fact street nothing course stay full
blue moon island system test boat gold plane dry laugh game shape hot snow yes east paint sky""".split()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over a few hundred common English words (unknown words → <unk>)."""
    vocab = {t: i for i, t in enumerate(SPECIALS + PUNCTUATION + [" " + w for w in WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Prepend(" ")])
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r" ?[^\s.,?!]+|[.,?!\n]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def tiny_config(vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.5,
        bos_token_id=0,
        eos_token_id=None,
        tie_word_embeddings=False,
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
    tokenizer = tiny_tokenizer()
    config = tiny_config(len(tokenizer))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        target = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # special tokens get zero output rows: random models rarely emit them
        target.lm_head.weight[: len(SPECIALS)] = 0.0
    gen = torch.Generator().manual_seed(seed + 1)
    qualifier = _noisy_copy(target, NOISE["qualifier"], gen)
    draft = _noisy_copy(target, NOISE["draft"], gen)
    return ModelTriplet(
        draft=draft,
        qualifier=qualifier,
        target=target,
        tokenizer=tokenizer,
        preset="tiny-random",
        vocab_size=len(tokenizer),
        eos_ids=(),  # random models run to max_new_tokens
        names=("tiny-random/draft", "tiny-random/qualifier", "tiny-random/target"),
        note="three tiny random Llama models (word salad; they never stop early): the draft and "
        "qualifier are noisy copies of the target",
    )
