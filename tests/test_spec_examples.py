"""The page's example prompts drawn from Spec-Bench (one question of each task, shown beside its task) and the
Statistics tab naming the task of a race whose prompt is a Spec-Bench question. One tiny-random race; no browser."""

from __future__ import annotations

import warnings
from collections import Counter

import gradio as gr
import pytest
from app_server import FAST as APP_FAST

from pyramid_demo import spec_bench
from pyramid_demo.app import handlers as h
from pyramid_demo.app import story, text, views
from pyramid_demo.app.races import Session

FAST = {**APP_FAST, "max_new_tokens": 4.0}


def test_every_spec_bench_task_has_exactly_one_example_after_a_short_default():
    """Rule: the examples hold one Spec-Bench question of each of the six tasks, no task twice, and the first
    example (the prompt box's default) is a short prompt of the page's own, so a first race stays quick."""
    found = [spec_bench.find(p) for p in text.EXAMPLE_PROMPTS]
    tasks = Counter(q.task for q in found if q is not None)
    assert tasks == Counter(spec_bench.TASKS)
    assert found[0] is None and len(text.EXAMPLE_PROMPTS[0]) <= 80
    assert [p for p, q in zip(text.EXAMPLE_PROMPTS, found) if q is None] == list(text.OWN_PROMPTS)


def test_each_example_is_spec_benchs_own_text_shown_with_its_own_task():
    """Rule: a Spec-Bench example's prompt is its question's first turn exactly as the file has it (read, not
    retyped), and the task shown beside it is that question's; the page's own prompts are marked as no task."""
    for prompt, label in text.EXAMPLES:
        q = spec_bench.find(prompt)
        if q is None:
            assert label == text.NOT_SPEC_BENCH, prompt
            continue
        assert prompt == q.turns[0] and q.id == text.SPEC_BENCH_EXAMPLES[q.task]
        assert label == text.task_label(q) and spec_bench.TITLES[q.task] in label
    mt = spec_bench.question(text.SPEC_BENCH_EXAMPLES["mt_bench"])
    assert text.task_label(mt) == f"Multi-turn Conversation · {mt.category}"  # MT-bench's category is named too


def test_find_matches_a_questions_exact_first_turn_whitespace_aside():
    """Rule: `find` gives the question whose first turn is the text, surrounding whitespace ignored; any other text
    (a prompt of the page's own, a question's text cut short or changed, an MT-bench second turn, nothing) is None."""
    for q in spec_bench.questions()[::37]:
        assert spec_bench.find(f"  \n{q.turns[0]}\t\n") == q
    q = spec_bench.question(text.SPEC_BENCH_EXAMPLES["summarization"])
    assert spec_bench.find(q.turns[0][:-1]) is None and spec_bench.find(q.turns[0] + " Thanks.") is None
    assert spec_bench.find(q.turns[0].upper()) is None
    assert spec_bench.find(spec_bench.question(text.SPEC_BENCH_EXAMPLES["mt_bench"]).turns[1]) is None
    for other in (*text.OWN_PROMPTS, "", "   ", None):
        assert spec_bench.find(other) is None


@pytest.mark.usefixtures("one_thread")
def test_the_statistics_story_names_the_spec_bench_task_of_the_races_prompt():
    """Rule: after a race whose prompt is a Spec-Bench question (here with stray whitespace around it), the Statistics
    tab's story opens with the question's id and task and a sentence on that task; a race of any other prompt
    names none."""
    q = spec_bench.question(text.SPEC_BENCH_EXAMPLES["qa"])  # short: a quick race
    session = Session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gr.Warning outside a request is a plain UserWarning
        list(h.race_event(f"  {q.turns[0]}\n", "tiny-random", "", "", "", session, **FAST))
    shown = views.pick_race(session)[9]  # the Statistics tab's story, as the page sets it
    first = shown.split("\n\n", 1)[0]
    assert f"Spec-Bench question {q.id} (Question Answering)" in first and text.TASK_NOTES["qa"] in first
    race = session.latest
    plain = story.markdown(race.results, race.profile, race.repeats, text.OWN_PROMPTS[0])
    assert "Spec-Bench" not in plain and plain.startswith(shown.split("\n\n", 1)[1])
    s = spec_bench.question(text.SPEC_BENCH_EXAMPLES["summarization"])
    assert story.prompt_line(s.turns[0]).startswith(f"**Prompt**: Spec-Bench question {s.id} (Summarization).")


def test_the_examples_widget_shows_each_prompt_beside_its_task():
    """Rule: the page's Examples table has a column of Spec-Bench tasks beside the prompts, one row per example in
    `text.EXAMPLES`' order, and the prompt box starts with the first example."""
    import app  # builds the page; no model loads (test_app)

    sets = [b.get_config() for b in app.demo.blocks.values() if isinstance(b, gr.Dataset)]
    assert len(sets) == 1  # the page's one Examples table
    cfg = sets[0]
    assert cfg["headers"] == [text.LABELS["prompt"], text.LABELS["task"]]
    assert [tuple(s) for s in cfg["samples"]] == text.EXAMPLES
    boxes = [b for b in app.demo.blocks.values() if isinstance(b, gr.Textbox) and b.label == text.LABELS["prompt"]]
    assert [b.value for b in boxes] == [text.EXAMPLE_PROMPTS[0]]
