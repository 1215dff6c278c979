"""The token-id corpus: shards round-trip, the manifest matches them, the batched lean forward is the target's
own forward, generation writes correct shards, and training reads every shard with recomputed states."""

import json
import os
import signal
import time

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from pyramid_demo.models import background
from pyramid_demo.models.tiny import tiny_random_triplet
from training import corpus, corpus_cli, corpus_gen, feature_train
from training.lean_batch import BatchedLean, states

pytestmark = pytest.mark.usefixtures("one_thread")
CHAT = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _seqs(n: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    g = torch.Generator().manual_seed(seed)
    seqs = [
        torch.randint(0, 49152, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]
    return seqs, [int(torch.randint(1, len(s), (1,), generator=g)) for s in seqs]


def test_ids_round_trip_through_a_shard_and_the_manifest_counts_them(tmp_path):
    seqs, npr = _seqs(20)
    seqs[0][0] = 65535  # the largest id uint16 holds
    entry = corpus.write_shard(tmp_path, "a", seqs, npr, {"source": "on-policy", "seed": 3})
    got, got_p, meta = corpus.read_shard(tmp_path / "a.npz")
    assert got == seqs and got_p == npr
    assert meta == entry and meta["seed"] == 3
    assert entry["answer_tokens"] == sum(len(s) - p for s, p in zip(seqs, npr))
    assert entry["prompt_tokens"] == sum(npr) and entry["sequences"] == 20
    s2, p2 = _seqs(5, seed=1)
    corpus.write_shard(tmp_path, "b", s2, p2, {"source": "text:x", "seed": 0})
    man = corpus.check(tmp_path)
    assert [e["file"] for e in man["shards"]] == ["a.npz", "b.npz"]
    assert man["total"]["sequences"] == 25
    assert man["answer_tokens_by_source"]["text:x"] == sum(len(s) - p for s, p in zip(s2, p2))
    with np.load(tmp_path / "a.npz") as z:
        assert z["ids"].dtype == np.uint16


def test_a_manifest_that_disagrees_with_its_shards_is_refused(tmp_path):
    seqs, npr = _seqs(4)
    corpus.write_shard(tmp_path, "a", seqs, npr, {"source": "on-policy", "seed": 0})
    path = tmp_path / corpus.MANIFEST
    good = path.read_text()
    man = json.loads(good)
    man["shards"][0]["answer_tokens"] += 1
    path.write_text(json.dumps(man))
    with pytest.raises(ValueError):
        corpus.check(tmp_path)
    path.write_text(good)
    corpus.check(tmp_path)
    (tmp_path / "stray.npz").write_bytes((tmp_path / "a.npz").read_bytes())  # a shard the manifest lacks
    with pytest.raises(ValueError):
        corpus.check(tmp_path)


def test_ids_that_do_not_fit_and_overwrites_are_refused(tmp_path):
    with pytest.raises(ValueError):
        corpus.pack([[65536]], [1])
    with pytest.raises(ValueError):
        corpus.pack([[1, 2]], [0])  # no prompt
    corpus.write_shard(tmp_path, "a", [[1, 2]], [1], {"source": "on-policy", "seed": 0})
    with pytest.raises(FileExistsError):
        corpus.write_shard(tmp_path, "a", [[1, 2]], [1], {"source": "on-policy", "seed": 0})


def test_a_restart_takes_a_seed_no_shard_used(tmp_path):
    assert corpus_gen.next_seed(tmp_path, 10) == 10
    for s in (10, 11, 13):
        corpus.write_shard(tmp_path, f"s{s}", [[1, 2]], [1], {"source": corpus_gen.SOURCE, "seed": s})
    corpus.write_shard(tmp_path, "t", [[1, 2]], [1], {"source": "text:x", "seed": 12})
    assert corpus_gen.next_seed(tmp_path, 10) == 12


@pytest.fixture(scope="module")
def tiny():
    fam = tiny_random_triplet(0)
    fam.tokenizer.chat_template = CHAT
    return fam.target, fam.tokenizer


@torch.inference_mode()
@pytest.mark.parametrize("rowwise,prefix", [(False, False), (True, False), (False, True)])
def test_the_batched_forward_is_the_target_forward_across_refills(tiny, rowwise, prefix):
    target, _ = tiny
    g = torch.Generator().manual_seed(0)
    V = target.config.vocab_size
    ps = [torch.randint(3, V, (n,), generator=g).tolist() for n in (3, 9, 5)]
    lm = BatchedLean(target, 3, 32, rowwise=rowwise)
    if prefix:  # rows 1 and 2 start with it (their keys copied), row 0 is as long as it (computed)
        lm.set_prefix(ps[1][:3])
        ps[2][:3] = ps[1][:3]
        ps[0] = ps[1][:3]
    seqs = [p[:] for p in ps]

    def ref(s: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return target(torch.tensor([s])).logits[0, -1]

    lg = lm.prefill([0, 1, 2], ps)
    for b in range(3):
        assert torch.allclose(lg[b], ref(seqs[b]), atol=1e-4)
    for step in range(4):
        nxt = lg.argmax(-1)
        for b in range(3):
            seqs[b].append(int(nxt[b]))
        lg = lm.step(nxt)
        if step == 1:  # row 1 is refilled with a new prompt mid-way (continuous batching)
            seqs[1] = torch.randint(3, V, (7,), generator=g).tolist()
            if prefix:  # a refill that starts with the prefix: its keys are copied over the row's old ones
                seqs[1][:3] = ps[1][:3]
            lg[1] = lm.prefill([1], [seqs[1]])[0]
        for b in range(3):
            assert torch.allclose(lg[b], ref(seqs[b]), atol=1e-4), (step, b)
    got = states(target, seqs, max_tokens=12)  # several groups
    for s, f in zip(seqs, got):
        with torch.no_grad():
            want = target(torch.tensor([s]), output_hidden_states=True).hidden_states[-1][0]
        assert f.shape == want.shape and torch.allclose(f, want, atol=1e-4)


def test_grow_writes_the_target_s_own_answers_as_shards(tiny, tmp_path):
    target, tok = tiny
    out = corpus_gen.grow(
        target,
        tok,
        tmp_path,
        seed=4,
        rows=4,
        max_new=6,
        temperature=1e-4,
        shard_seqs=5,
        max_shards=2,
        capacity=96,
        target={"name": "tiny"},
        log=lambda s: None,
    )
    assert out["shards"] == 2
    man = corpus.check(tmp_path)
    assert man["total"]["sequences"] == out["sequences"] >= 10
    for entry in man["shards"]:
        assert entry["seed"] == 4 and entry["sampling"]["max_new_tokens"] == 6 and entry["target"] == {"name": "tiny"}
        assert sum(entry["prompts"]["kinds"].values()) == entry["sequences"]
    for p in corpus.shards(tmp_path):
        seqs, npr, _ = corpus.read_shard(p)
        for s, n in zip(seqs, npr):
            assert len(s) - n == 6  # the tiny target never says EOS: max_new tokens each
            cur = s[:n]
            for t in s[n:]:  # near-zero temperature: each answer token is the target's argmax
                with torch.no_grad():
                    assert t == int(target(torch.tensor([cur])).logits[0, -1].argmax())
                cur = cur + [t]


def test_training_reads_every_shard_with_recomputed_states(tiny, tmp_path):
    target, _ = tiny
    folder = tmp_path / "corpus"
    for k in range(3):
        seqs, npr = _seqs(4, seed=k)
        seqs = [[t % target.config.vocab_size for t in s] for s in seqs]
        corpus.write_shard(folder, f"s{k}", seqs, npr, {"source": "on-policy", "seed": k})
    work = corpus_cli.materialize(target, folder, tmp_path / "work", log=lambda s: None)
    found = feature_train._shards([work])
    assert len(found) == 3  # one training shard per corpus shard
    recs = [r for p in found for r in torch.load(p, weights_only=False)]
    want = {tuple(s) for p in corpus.shards(folder) for s in corpus.read_shard(p)[0]}
    assert {tuple(r["ids"].tolist()) for r in recs} == want
    r = recs[0]
    with torch.no_grad():
        f = target(r["ids"][None].long(), output_hidden_states=True).hidden_states[-1][0, :-1]
    assert r["f"].shape == f.shape and torch.allclose(r["f"].float(), f, atol=1e-2)
    b = feature_train.collate(recs)
    assert int(b["mask"].sum()) == sum(len(x["ids"]) - x["n_prompt"] for x in recs)
    st = feature_train.train(
        target,
        torch.arange(target.config.vocab_size),
        [work],
        recs[:2],
        tmp_path / "ckpt" / "fd.pt",
        minutes=0.002,
        batch=4,
        passes=2,
        eval_every=10_000,
        log=lambda s: None,
    )
    assert st["curve"][-1]["unique"] == len(want) == 12  # the run loaded every sequence of every shard
    mtime = found[0].stat().st_mtime
    corpus_cli.materialize(target, folder, tmp_path / "work", log=lambda s: None)  # cached: not recomputed
    assert found[0].stat().st_mtime == mtime


def test_paused_stops_a_registered_job_and_continues_it(tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.setenv("PYRAMID_DEMO_CACHE", str(tmp_path))
    code = (
        "import time;"
        "from pyramid_demo.models import background as b; b.register('job');"
        "[time.sleep(0.05) for _ in range(400)]"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "pyramid_demo"], cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()}
    )
    try:
        for _ in range(200):
            if background.live_pids():
                break
            time.sleep(0.05)
        assert background.live_pids() == [proc.pid]

        def state() -> str:
            return open(f"/proc/{proc.pid}/stat").read().split(")")[1].split()[0]

        with background.paused() as pids:
            assert pids == [proc.pid]
            time.sleep(0.1)
            assert state() == "T"  # stopped while the block runs
        time.sleep(0.1)
        assert state() in ("S", "R")
        (tmp_path / "background" / "gone.pid").write_text("999999999")  # a stale file is ignored
        assert background.live_pids() == [proc.pid]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_target_identity_changes_with_any_weight():
    a = LlamaForCausalLM(tiny_random_triplet(0).target.config).eval()
    h = corpus.target_identity(a)["weights_sha256"]
    with torch.no_grad():
        a.model.norm.weight[0] += 1e-3
    assert corpus.target_identity(a)["weights_sha256"] != h


def test_licences_are_read_from_a_distribution_s_metadata():
    from email.message import Message

    from training import text_corpus as tc

    m = Message()
    m["License-Expression"] = "MIT"
    assert tc.licence(m) == "MIT"
    m = Message()
    m["Classifier"] = "License :: OSI Approved :: BSD License"
    m["Classifier"] = "Programming Language :: Python"
    assert tc.licence(m) == "BSD License"
    assert tc.licence(Message()) == ""

    class Dist:
        def __init__(self, name, lic):
            self.metadata = Message()
            self.metadata["Name"], self.metadata["Version"] = name, "1.0"
            if lic:
                self.metadata["License-Expression"] = lic
            self.metadata.set_payload("word " * 60)

    fake = [Dist("b", "Apache-2.0"), Dist("nolicence", ""), Dist("a", "MIT"), Dist("A", "MIT")]
    import importlib.metadata as im

    orig = im.distributions
    im.distributions = lambda: fake
    try:
        got = tc.package_pieces()
    finally:
        im.distributions = orig
    assert [(p["name"], p["licence"]) for p in got] == [("a", "MIT"), ("b", "Apache-2.0")]  # unlicensed, twins out


def test_stdlib_docstrings_are_read_without_importing_and_private_names_skipped(tmp_path):
    from training import text_corpus as tc

    long = "x " * 80
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        f'"""{long}module"""\nraise SystemExit("imported")\n'
        f'def f():\n    """{long}f"""\n'
        f'def _g():\n    """{long}g"""\n'
        f'class C:\n    """{long}C"""\n    def m(self):\n        """{long}m"""\n'
        f'def short():\n    """too short"""\n'
    )
    (tmp_path / "_private.py").write_text(f'"""{long}"""\n')
    got = {p["name"]: p["text"] for p in tc.stdlib_pieces(tmp_path)}
    assert set(got) == {"pkg.mod", "pkg.mod.f", "pkg.mod.C", "pkg.mod.C.m"}
    assert got["pkg.mod.C.m"].endswith("m")


def test_text_chunks_keep_every_paragraph_in_order_within_the_budget():
    from training import text_corpus as tc

    def count(s):
        return len(s.split())

    paras = [" ".join(f"w{i}_{j}" for j in range(n)) for i, n in enumerate([3, 5, 2, 7, 1, 4, 6])]
    out = tc.chunks("\n\n".join(paras), count, max_tokens=8)
    assert all(count(c) <= 8 for c in out)
    assert "\n\n".join(out).split("\n\n") == paras


def test_text_shards_hold_the_text_as_the_answer_and_list_their_pieces(tiny, tmp_path, monkeypatch):
    from training import text_corpus as tc

    _, tok = tiny
    pieces = [
        {
            "source": tc.PKG,
            "name": "alpha",
            "version": "1",
            "licence": "MIT",
            "text": "the sun is hot.\n\nthe sea is blue.\n\nthe moon is cold.",
        },
        {"source": tc.PKG, "name": "beta", "version": "2", "licence": "BSD-3-Clause", "text": "a dog can run."},
    ]
    monkeypatch.setattr(tc, "package_pieces", lambda: pieces)
    entries = tc.build(tok, tmp_path, tc.PKG, max_tokens=5, shard_seqs=3, log=lambda s: None)
    assert [e["sequences"] for e in entries] == [3, 1]
    assert entries[0]["pieces"] == [{"name": "alpha", "version": "1", "licence": "MIT", "sequences": 3}]
    assert entries[1]["pieces"][0]["licence"] == "BSD-3-Clause"
    seqs, npr, _ = corpus.read_shard(tmp_path / entries[0]["file"])
    assert seqs[1][npr[1] :] == tok("the sea is blue.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tc.build(tok, tmp_path, tc.PKG, log=lambda s: None) == []  # a source is added once
    corpus.check(tmp_path)


def test_reference_topics_are_read_as_literals(tmp_path):
    from training import text_corpus as tc

    (tmp_path / "pydoc_data").mkdir()
    long = "word " * 40
    (tmp_path / "pydoc_data" / "topics.py").write_text(
        f"# header\ntopics = {{'for': {long!r}, 'with-stmt': {(long + 'w')!r}, 'tiny': 'short'}}\n"
    )
    got = tc.reference_pieces(tmp_path)
    assert [(p["name"], p["licence"], p["source"]) for p in got] == [
        ("for", "PSF-2.0", tc.REF),
        ("with stmt", "PSF-2.0", tc.REF),
    ]
    assert got[1]["text"].endswith("w")


def test_the_held_out_set_travels_as_ids_and_training_never_reads_it(tiny, tmp_path, monkeypatch):
    target, _ = tiny
    monkeypatch.setattr(corpus_cli, "bundled_identity", lambda: {"name": "tiny"})
    work, folder = tmp_path / "work", tmp_path / "corpus"
    (work / "features" / "heldout").mkdir(parents=True)
    seqs, npr = _seqs(3, seed=5)
    seqs = [[t % target.config.vocab_size for t in s] for s in seqs]
    recs = [
        {"ids": torch.tensor(s, dtype=torch.int32), "n_prompt": n, "f": torch.zeros(len(s) - 1, 64)}
        for s, n in zip(seqs, npr)
    ]
    torch.save(recs, work / "features" / "heldout" / "shard_00000.pt")
    corpus.write_shard(folder, "train", [[1, 2, 3]], [1], {"source": "on-policy", "seed": 0})
    assert corpus_cli.save_heldout(work, folder)["sequences"] == 3
    assert corpus_cli.save_heldout(work, folder) is None  # saved once
    assert [p.name for p in corpus.shards(folder)] == ["train.npz"]  # training's shards: not the held-out set
    got = corpus_cli.heldout(target, tmp_path / "elsewhere", folder)  # a machine without WORK's held-out set
    assert [r["ids"].tolist() for r in got] == seqs and [r["n_prompt"] for r in got] == npr
    with torch.no_grad():
        f = target(torch.tensor([seqs[0]]), output_hidden_states=True).hidden_states[-1][0, :-1]
    assert torch.allclose(got[0]["f"].float(), f, atol=1e-2)
    torch.save(recs[:1], work / "features" / "heldout" / "shard_00000.pt")  # WORK's own set comes first...
    own = corpus_cli.heldout(target, work, folder)
    assert [r["ids"].tolist() for r in own] == seqs[:1]
    assert torch.allclose(own[0]["f"].float(), f, atol=1e-2)  # ...its states recomputed, as training's are


def test_the_bench_runs_inside_the_background_pause(tmp_path, monkeypatch):
    """`bench` times with every registered background job stopped: its run happens inside `paused()`."""
    from contextlib import contextmanager

    from pyramid_demo.bench import runner
    from pyramid_demo.cli import main as cli_main

    seen = {"inside": False, "ran_inside": False}

    @contextmanager
    def fake_paused(folder=None):
        seen["inside"] = True
        yield []
        seen["inside"] = False

    real = runner.run_bench

    def spy(*a, **k):
        seen["ran_inside"] = seen["inside"]
        return real(*a, **k)

    monkeypatch.setattr(background, "paused", fake_paused)
    monkeypatch.setattr(runner, "run_bench", spy)
    rc = cli_main(
        [
            "bench",
            "--models",
            "tiny-random",
            "--methods",
            "ar",
            "--prompts",
            "builtin",
            "--limit",
            "1",
            "--max-new-tokens",
            "4",
            "--repeats",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path / "b"),
        ]
    )
    assert rc == 0 and seen["ran_inside"]


def test_debian_docs_keep_permissive_packages_only_with_their_licence(tmp_path):
    import gzip

    from training import text_corpus as tc

    prose = "This tool does one thing well. " * 20

    def pkg(name, copyright_text, files):
        d = tmp_path / name
        d.mkdir()
        (d / "copyright").write_text(copyright_text)
        for fn, text in files.items():
            (d / fn).write_bytes(gzip.compress(text.encode()) if fn.endswith(".gz") else text.encode())

    dep5 = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
    pkg(
        "mitpkg",
        dep5 + "Files: *\nCopyright: someone\nLicense: MIT\n\nFiles: debian/*\nLicense: GPL-2+\n",
        {"README.gz": prose, "README.Debian": prose, "changelog": prose, "table.txt": "| 1 | 2 |\n" * 100},
    )
    pkg("gplpkg", dep5 + "Files: *\nLicense: GPL-2+\n", {"README": prose})
    pkg("oldstyle", "This package was debianized by someone.\nLicense: MIT\n", {"README": prose})
    got = tc.debian_pieces(tmp_path)
    assert [(p["name"], p["licence"]) for p in got] == [("mitpkg README", "MIT")]
    assert got[0]["text"] == prose.strip()


@pytest.mark.slow  # a training job in a subprocess (the slow tier, which CI runs)
def test_sigterm_writes_the_finished_answers_as_a_shard(tmp_path):
    import subprocess
    import sys

    code = f"""
import torch
torch.set_num_threads(1)
from pathlib import Path
from training import corpus_gen
from pyramid_demo.models.tiny import tiny_random_triplet
fam = tiny_random_triplet(0)
fam.tokenizer.chat_template = {CHAT!r}
corpus_gen.grow(fam.target, fam.tokenizer, Path({str(tmp_path)!r}), seed=3, rows=2, max_new=3, shard_seqs=10**6,
                shard_minutes=1e6, capacity=96, log=lambda s: print(s, flush=True))
print("done", flush=True)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"},
    )
    try:
        for line in proc.stdout:
            if line.startswith("step 200"):  # running, nothing written yet (no shard is due)
                assert not corpus.shards(tmp_path)
                proc.send_signal(signal.SIGTERM)
                break
        rest = proc.stdout.read()
        assert proc.wait(timeout=120) == 0 and "done" in rest
    finally:
        proc.kill()
    man = corpus.check(tmp_path)
    assert len(man["shards"]) == 1 and man["total"]["sequences"] >= 100  # 200 steps of 2 rows, 3 tokens each
