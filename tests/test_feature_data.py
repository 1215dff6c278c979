"""The feature draft's data and training: varied prompts, deep passes, top-k measurement and a run continued
from a saved file."""

import random

import pytest
import torch
from transformers import LlamaForCausalLM

from pyramid_demo.models.feature_draft import FeatureDraft
from pyramid_demo.models.tiny import tiny_config
from training import data as dd
from training import feature_train as ft
from training import features as fe

pytestmark = pytest.mark.usefixtures("one_thread")


def _text(item) -> str:
    return repr(item)


def test_varied_prompts_are_seeded_of_every_shape_and_never_name_a_heldout_topic():
    a, b = fe.varied_prompts(400, 5), fe.varied_prompts(400, 5)
    assert a == b and a != fe.varied_prompts(400, 6)
    kinds = {type(x).__name__ for x in a}
    assert kinds == {"str", "list", "dict"}
    assert any(isinstance(x, list) and x[0]["role"] == "system" for x in a)
    assert any(isinstance(x, list) and [m["role"] for m in x] == ["user", "assistant", "user"] for x in a)
    everything = " ".join(map(_text, fe.feature_prompts("train", 5, mix=1.0)))
    for t in dd.HELDOUT_TOPICS:
        assert f" {t}" not in everything and f"{t}?" not in everything, t
    assert fe.feature_prompts("heldout", 0) == dd.prompts("heldout", 0)  # the held-out set is unchanged


def test_followups_continue_an_earlier_answer_and_fall_back_without_one():
    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(str(int(i)) for i in ids)

    earlier = [{"ids": torch.tensor([1, 2, 3, 7, 8]), "n_prompt": 3, "prompt": "Tell me about bees."}]
    r = random.Random(0)
    m = fe.resolve({"followup": "Why?"}, earlier, Tok(), r)
    assert m == [
        {"role": "user", "content": "Tell me about bees."},
        {"role": "assistant", "content": "7 8"},
        {"role": "user", "content": "Why?"},
    ]
    m = fe.resolve({"passage": "Summarize:\n\n{p}"}, earlier, Tok(), r)
    assert m == [{"role": "user", "content": "Summarize:\n\n7 8"}]
    assert fe.resolve({"followup": "Why?"}, [], Tok(), r) == [{"role": "user", "content": "Why?"}]
    assert fe.resolve("hi", earlier, Tok(), r) == [{"role": "user", "content": "hi"}]


def _recs(target, n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(3, target.config.vocab_size, (14,), generator=g)
        with torch.no_grad():
            hs = target.model(input_ids=ids[None])
        f = hs.last_hidden_state[0, :-1].clone()
        out.append({"ids": ids, "n_prompt": 5, "f": f})
    return out


def test_a_run_continued_from_a_saved_file_starts_where_its_curve_ended(tmp_path):
    """`init_from` loads a saved feature draft and reads where its learning curve ended (positions seen,
    minutes), so a continued run's curve reads end to end; the model then computes what the file holds."""
    torch.manual_seed(0)
    target = LlamaForCausalLM(tiny_config(32)).eval()
    plain = FeatureDraft(target, torch.arange(32))
    with torch.no_grad():
        plain.fc_b.normal_()
    path = tmp_path / "fd.safetensors"
    plain.save(path, {"curve": '[{"seen": 1000, "minutes": 2.5}]'})
    model = FeatureDraft(target, torch.arange(32))
    info = ft.init_from(model, path)
    assert info["seen"] == 1000 and info["minutes"] == 2.5
    b = ft.collate(_recs(target, 3))
    same = FeatureDraft(target, torch.arange(32)).load(path)  # as the fp16 file holds it
    with torch.no_grad():
        want = same.forward_train(b["f_prev"], b["tokens"], 2)
        got = model.forward_train(b["f_prev"], b["tokens"], 2)
    for w, g in zip(want, got):
        assert torch.allclose(w, g, atol=1e-5)


def test_deep_passes_train_and_topk_is_monotone():
    torch.manual_seed(0)
    target = LlamaForCausalLM(tiny_config(32)).eval()
    fd = FeatureDraft(target, torch.arange(32))
    recs = _recs(target, 4)
    b = ft.collate(recs)
    loss, accs = ft.loss_fn(fd, b, passes=5, gen=torch.Generator().manual_seed(0), deep_frac=0.5)
    loss.backward()
    assert len(accs) == 5 and torch.isfinite(loss)
    res = ft.measure(fd, recs, target.lm_head.weight.detach().float(), passes=5)
    assert len(res["top1_by_position"]) == 5 and len(res["topk_pos1"]) == 4
    assert res["topk_pos1"][0] == pytest.approx(res["top1_by_position"][0])
    assert all(a <= b + 1e-9 for a, b in zip(res["topk_pos1"], res["topk_pos1"][1:]))
