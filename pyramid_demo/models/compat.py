"""Tokenizer checks: speculative decoding passes token ids between the models, so they must share one tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.trace import first_divergence
from ..forward.lm import ModelTriplet
from .errors import LoadError

# Mixed scripts, digits, code, whitespace runs and an emoji: different tokenizers
# almost never agree on all of it, while one family's tokenizers always do.
PROBE_TEXT = (
    "Speculative decoding, 3 models: draft→qualifier→target.\n"
    "  def f(x):\n\treturn x**2 + 1_000  # naïve café, Ünïcödé, 東京, Привет, 🚀!\n"
    "Why is the sky blue? Rayleigh scattering (λ⁻⁴)."
)
SPECIALS = ("eos", "bos", "pad")
ONE_TOKENIZER = "Speculative decoding needs one shared tokenizer; pick three models from the same family."


class IncompatibleModels(LoadError):
    """The three models cannot be run together: names the two models and what differs."""


def logit_width(model: Any) -> int:
    """Rows of the model's output layer (its logit vector length); a config also works."""
    head = getattr(model, "get_output_embeddings", None)
    if callable(head):
        weight = getattr(head(), "weight", None)
        if weight is not None and weight.ndim == 2:
            return int(weight.shape[0])
    config = getattr(model, "config", model).get_text_config()  # a multimodal config: its text model's
    size = getattr(config, "vocab_size", None)
    if size is None:
        raise IncompatibleModels(f"cannot tell the logit width of {type(model).__name__}")
    return int(size)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _special(tokenizer: Any, kind: str) -> tuple[str | None, int | None]:
    return getattr(tokenizer, f"{kind}_token", None), getattr(tokenizer, f"{kind}_token_id", None)


def check_tokenizers(names: Sequence[str], tokenizers: Sequence[Any]) -> None:
    """Raise `IncompatibleModels` unless each tokenizer matches the target's: length, a probe's ids, eos/bos/pad."""
    ref_name, ref = names[-1], tokenizers[-1]
    ref_ids = _ids(ref, PROBE_TEXT)
    for name, tok in zip(names[:-1], tokenizers[:-1], strict=True):
        if tok is ref:
            continue
        pair = f"'{name}' and '{ref_name}' cannot be used together"
        eos, ref_eos = _special(tok, "eos"), _special(ref, "eos")
        if eos[1] != ref_eos[1]:
            raise IncompatibleModels(
                f"{pair}: their end-of-sequence tokens differ ({eos[0]!r} = id {eos[1]} vs {ref_eos[0]!r} = id "
                f"{ref_eos[1]}). This usually means a base checkpoint is mixed with an instruct (chat) one, or the "
                "models come from different families; pick all three from the same family and kind (e.g. all "
                "'-Instruct')."
            )
        for kind in ("bos", "pad"):
            tv, rv = _special(tok, kind), _special(ref, kind)
            if tv[1] != rv[1] and not (kind == "pad" and None in (tv[1], rv[1])):
                raise IncompatibleModels(
                    f"{pair}: their {kind} tokens differ ({tv[0]!r} = id {tv[1]} vs {rv[0]!r} "
                    f"= id {rv[1]}). {ONE_TOKENIZER}"
                )
        if len(tok) != len(ref):
            raise IncompatibleModels(f"{pair}: their tokenizers have {len(tok)} and {len(ref)} tokens. {ONE_TOKENIZER}")
        ids = _ids(tok, PROBE_TEXT)
        if ids != ref_ids:
            i = first_divergence(ids, ref_ids)
            raise IncompatibleModels(
                f"{pair}: their tokenizers split the same text into different ids (first "
                f"difference at token {i}: {ids[i : i + 3]} vs {ref_ids[i : i + 3]}). {ONE_TOKENIZER}"
            )


def check_compatible(names: Sequence[str], tokenizers: Sequence[Any], models: Sequence[Any]) -> None:
    """Raise `IncompatibleModels` unless each model's logits cover its tokenizer (`check_tokenizers` compares those)."""
    for name, tok, model in zip(names, tokenizers, models, strict=True):
        width, n = logit_width(model), len(tok)
        if width < n:
            raise IncompatibleModels(
                f"'{name}' produces {width} logits per position but its tokenizer has {n} "
                "tokens, so some token ids have no score. The checkpoint and tokenizer do not "
                "belong together; use the tokenizer shipped with that model."
            )


def family(draft: Any, qualifier: Any, target: Any, tokenizer: Any, **kw: Any) -> ModelTriplet:
    """The three as one family on the target's tokenizer: its length is the shared vocabulary, and a run stops at its
    eos, then at any extra stop id in the target's generation config."""
    extra = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    ids = [tokenizer.eos_token_id, *(extra if isinstance(extra, (list, tuple)) else [extra])]
    eos = tuple(dict.fromkeys(int(i) for i in ids if i is not None and int(i) < len(tokenizer)))
    return ModelTriplet(draft, qualifier, target, tokenizer, vocab_size=len(tokenizer), eos_ids=eos, **kw)
