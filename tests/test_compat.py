"""Tokenizer compatibility checks, on tiny tokenizers and models built offline."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from pyramid_demo.models.compat import IncompatibleModels, check_compatible, check_tokenizers, logit_width
from pyramid_demo.models.errors import LoadError
from pyramid_demo.models.tiny import tiny_config

NAMES = ("org/draft", "org/qualifier", "org/target")


def make_tok(specials=("<s>", "</s>", "<|end|>"), eos="</s>", reverse=False, pad=None):
    """A byte-level tokenizer; `reverse` permutes the byte ids (a 'different family')."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), reverse=reverse)
    vocab = {s: i for i, s in enumerate(list(specials) + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    kw = {"pad_token": pad} if pad else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token=eos, **kw)


def tiny_model(vocab_size):
    return LlamaForCausalLM(tiny_config(vocab_size)).eval()


@pytest.fixture(scope="module")
def model_258():
    return tiny_model(len(make_tok(specials=("<s>", "</s>"))))


def test_same_family_accepted(model_258):
    toks = [make_tok(specials=("<s>", "</s>")) for _ in range(3)]  # three separately built, identical tokenizers
    check_compatible(NAMES, toks, [model_258] * 3)


def test_padded_vocab_accepted():
    tok = make_tok(specials=("<s>", "</s>"))
    padded = tiny_model(len(tok) + 14)  # e.g. Qwen2.5-7B: 152064 logits, 151665 tokens
    check_compatible(NAMES, [tok] * 3, [tiny_model(len(tok)), padded, padded])
    assert logit_width(padded) == len(tok) + 14
    assert logit_width(padded.config) == len(tok) + 14


def test_narrow_logits_rejected():
    tok = make_tok(specials=("<s>", "</s>"))
    with pytest.raises(IncompatibleModels) as e:
        check_compatible(NAMES, [tok] * 3, [tiny_model(len(tok)), tiny_model(len(tok) - 2), tiny_model(len(tok))])
    assert "org/qualifier" in str(e.value) and "256 logits" in str(e.value)


def test_different_ids_rejected():
    a, b = make_tok(), make_tok(reverse=True)
    assert len(a) == len(b)
    with pytest.raises(IncompatibleModels) as e:
        check_tokenizers(NAMES, [b, a, a])
    msg = str(e.value)
    assert "'org/draft' and 'org/target'" in msg and "different ids" in msg


def test_base_and_instruct_mixed_rejected():
    base, instruct = make_tok(eos="</s>"), make_tok(eos="<|end|>")
    with pytest.raises(LoadError) as e:  # IncompatibleModels is a LoadError: the CLI catches it
        check_tokenizers(NAMES, [instruct, base, instruct])
    msg = str(e.value)
    assert "'org/qualifier' and 'org/target'" in msg
    assert "end-of-sequence" in msg and "'</s>' = id 1" in msg and "'<|end|>' = id 2" in msg
    assert "base" in msg and "instruct" in msg


def test_bos_and_length_mismatch_rejected():
    a = make_tok()
    other_bos = make_tok()
    other_bos.bos_token = "<|end|>"
    with pytest.raises(IncompatibleModels, match="bos tokens differ"):
        check_tokenizers(NAMES, [a, a, other_bos])
    longer = make_tok(specials=("<s>", "</s>", "<|end|>", "<|extra|>"))
    with pytest.raises(IncompatibleModels, match="260 and 259 tokens"):
        check_tokenizers(NAMES, [longer, a, a])


def test_pad_set_on_one_side_only_tolerated_but_conflict_rejected():
    check_tokenizers(NAMES, [make_tok(pad="<|end|>"), make_tok(), make_tok()])
    with pytest.raises(IncompatibleModels, match="pad tokens differ"):
        check_tokenizers(NAMES, [make_tok(pad="<|end|>"), make_tok(pad="<s>"), make_tok(pad="<s>")])
