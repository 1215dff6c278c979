"""The package's dependency rules, read from the source with `ast` (imports inside functions included).

core ← models ← bench / app ← cli, app.py: the decoding core knows nothing of loading, the benchmark or
the UI, and only the UI knows gradio. `training/` (rebuilding the shipped weights) sits outside the product:
it may import the package, never the other way round.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "pyramid_demo"
TRAINING = "training"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def project_files() -> dict[str, Path]:
    """Every project module by dotted name: the package's modules, the training package's and the root `app.py`
    (as "app")."""
    files = {_module_name(p): p for pkg in (PACKAGE, TRAINING) for p in sorted((ROOT / pkg).rglob("*.py"))}
    files["app"] = ROOT / "app.py"
    return files


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Absolute names of everything `path` imports, at any depth; `from x import y` gives x, and x.y too
    when y is a project module (a submodule import). x itself always counts: `from . import store` runs
    the package's `__init__` and reads the name from it, so a package whose `__init__` imports the module
    that does so is a cycle (it only works while the name happens to be a submodule)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update({f"{mod}.{a.name}" for a in node.names} & known)
    return out


def project_graph(files: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """module → the project modules it imports."""
    files = files or project_files()
    known = set(files)
    return {m: {i for i in imports_of(m, p, known) if i in known} for m, p in files.items()}


def all_imports(files: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """module → every name it imports, project or not (top-level package names included)."""
    files = files or project_files()
    known = set(files)
    out = {}
    for m, p in files.items():
        names = imports_of(m, p, known)
        out[m] = names | {n.split(".")[0] for n in names}
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for n in graph.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return project_graph()


@pytest.fixture(scope="module")
def imports() -> dict[str, set[str]]:
    return all_imports()


def test_the_reader_sees_lazy_and_relative_imports(graph) -> None:
    """The rules below are only as good as the import reader: it must resolve relative imports and see
    imports inside functions (e.g. the CLI's lazy `from .models.loading import ...`)."""
    assert "pyramid_demo.models.loading" in graph["pyramid_demo.generate_cli"]  # lazy, inside run()
    assert "pyramid_demo.core.rules" in graph["pyramid_demo.core.engine"]  # `from . import rules`
    assert "pyramid_demo.app.handlers" in graph["app"]
    assert len(graph) > 30


def test_no_import_cycles(graph) -> None:
    """No cycles between project modules, not even through lazy imports: each layer can be read,
    tested and replaced on its own."""
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph))


def test_a_cycle_through_a_packages_init_is_caught(tmp_path) -> None:
    """Planted: a package whose `__init__` re-exports from `a`, while `a` reads a sibling through the
    package (`from . import b`). That runs the package's `__init__` from inside it: the cycle rule must
    see it, although every name imported is a submodule."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from . import b\n\ndef f():\n    return b.g()\n")
    (pkg / "b.py").write_text("def g():\n    return 1\n")
    files = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py"}
    cycle = find_cycle(project_graph(files))
    assert cycle == ["pkg", "pkg.a", "pkg"], f"a cycle through pkg/__init__ went unseen: {cycle}"
    (pkg / "a.py").write_text("from .b import g\n\ndef f():\n    return g()\n")  # the fix: no cycle
    assert find_cycle(project_graph(files)) is None


def test_core_imports_only_core_and_the_forwards(graph) -> None:
    """`pyramid_demo.core` (the loop and its records) imports nothing of the project but itself and the forwards it
    drives (`pyramid_demo.forward`): it knows no loader, benchmark, UI, nor any cost model (`pyramid_demo.predict`)."""
    bad = {
        m: sorted(i for i in deps if not i.startswith(("pyramid_demo.core", "pyramid_demo.forward")))
        for m, deps in graph.items()
        if m.startswith("pyramid_demo.core.")
    }
    assert not {m: d for m, d in bad.items() if d}


def test_the_forwards_know_no_decoding_rule(graph) -> None:
    """`pyramid_demo.forward` (caches, the core forward and its compiled package, HF's adapter, the weights they read)
    imports nothing of the project outside itself: a forward is the same whatever loop or predictor drives it."""
    bad = {
        m: sorted(i for i in deps if not i.startswith("pyramid_demo.forward"))
        for m, deps in graph.items()
        if m.startswith("pyramid_demo.forward")
    }
    assert not {m: d for m, d in bad.items() if d}


FORWARD = {"cache", "core", "weights", "fusable", "compiled", "lm", "feature_lm", "lookup"}
# within forward/, what each module may build on: one core pass over one set of weights; its package and the opener
# above it; nothing below the core knows it
FORWARD_DEPS = {
    "fusable": set(),
    "cache": set(),
    "weights": {"fusable"},
    "core": {"cache", "weights"},
    "compiled": {"cache", "core", "weights"},
    "feature_lm": {"cache", "core"},  # its one layer runs on the core pass (`core.stack`)
    "lookup": {"cache"},
    "lm": {"cache", "core", "weights", "compiled", "feature_lm", "lookup"},
}
MODELS = {
    "background",
    "bundled",
    "checks",
    "compat",
    "errors",
    "feature_draft",
    "hub",
    "loading",
    "memory",
    "offline",
    "placement",
    "presets",
    "provision",
    "quant",
    "runtime",
    "tiny",
    "warm",
}


def test_the_forward_room_is_one_core(graph) -> None:
    """`pyramid_demo/forward/` holds one forward core and what serves it, and nothing else: the static cache's
    bookkeeping, the core pass, its weights (fused linears), quantized layers' fusing, its compiled package, the opener
    with HF's adapter, the feature draft's cache and prompt lookup (a proposer with no model). A second forward (a
    module beside these) fails here; inside, each module builds only on those below it."""
    room = {m.removeprefix("pyramid_demo.forward.") for m in graph if m.startswith("pyramid_demo.forward.")}
    assert room == FORWARD, sorted(room ^ FORWARD)
    for m in FORWARD:
        deps = {d.removeprefix("pyramid_demo.forward.") for d in graph[f"pyramid_demo.forward.{m}"]}
        assert deps <= FORWARD_DEPS[m], (m, sorted(deps - FORWARD_DEPS[m]))


def test_the_models_room_has_one_decision(graph) -> None:
    """`pyramid_demo/models/` is these modules, no sub-package (no probe, no kernel timing, no second backend); the
    decision of what runs is made in one place: only `models.runtime` loads compiled packages (a run opens what its
    family's plan holds)."""
    room = {m.removeprefix("pyramid_demo.models.") for m in graph if m.startswith("pyramid_demo.models.")}
    assert room == MODELS, sorted(room ^ MODELS)
    loaders = {m for m, deps in graph.items() if "pyramid_demo.forward.compiled" in deps}
    assert loaders <= {"pyramid_demo.models.runtime"}, sorted(loaders)


def test_the_rooms_stay_small(graph) -> None:
    """The loop's room holds the loop and its records only: at most 15 modules, none a cost model."""
    core = [m for m in graph if m.startswith("pyramid_demo.core.")]
    assert len(core) <= 14, sorted(core)  # + its __init__: 15 files
    assert not [m for m in core if m.rsplit(".", 1)[1] in {"costs", "expected", "insertion", "measure", "throughput"}]


def test_rules_import_nothing_of_the_project(graph) -> None:
    """`core/rules.py` (the acceptance rules) is pure math over tensors: it imports no project module."""
    assert graph["pyramid_demo.core.rules"] == set()


def test_only_the_ui_imports_gradio(imports) -> None:
    """Only `pyramid_demo/app/` and the root `app.py` import gradio; the core, loaders, bench and
    CLI run without it."""
    users = {m for m, names in imports.items() if "gradio" in names}
    assert users and all(m == "app" or m.startswith("pyramid_demo.app.") for m in users), sorted(users)


def test_charts_and_render_never_touch_models(graph, imports) -> None:
    """`app/charts.py` and `app/render.py` draw plain trace records: they never import torch or
    transformers themselves, nor reach a model loader through their imports (any `pyramid_demo.models`
    module but `presets`, the family table that the settings text shows)."""
    for m in (
        "pyramid_demo.app.charts",
        "pyramid_demo.app.render",
        "pyramid_demo.app.tree_view",
        "pyramid_demo.app.pass_hist",
    ):
        assert not imports[m] & {"torch", "transformers"}, m
        loaders = {x for x in reachable(graph, m) if x.startswith("pyramid_demo.models")}
        assert loaders <= {"pyramid_demo.models", "pyramid_demo.models.presets"}, (m, sorted(loaders))


def test_nothing_imports_app_py(graph) -> None:
    """The root `app.py` builds the page at import: no project module imports it."""
    assert not [m for m, deps in graph.items() if "app" in deps]


def test_charts_compute_no_predictions(graph) -> None:
    """`app/charts.py` draws records it is given: the speed chart gets `story.rows`; charts import neither
    the paper's formula (`predict.throughput`) nor the story that computes predictions."""
    assert not {"pyramid_demo.predict.throughput", "pyramid_demo.app.story"} & graph["pyramid_demo.app.charts"]


def _product(module: str) -> bool:
    return module != TRAINING and not module.startswith(f"{TRAINING}.")


def test_the_product_never_imports_training(imports) -> None:
    """The app, the CLI and the engine (everything under `pyramid_demo/`, and `app.py`) run without the training
    package: nothing of theirs imports `training`, lazily or not, nor names one of its modules for
    `importlib` (as a subcommand table would), so it can be left out of a deployment."""
    users = sorted(m for m, names in imports.items() if _product(m) and TRAINING in names)
    assert not users, users
    named = []
    for m, path in project_files().items():
        if _product(m):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            named += [
                (m, n.value)
                for n in ast.walk(tree)
                if isinstance(n, ast.Constant)
                and isinstance(n.value, str)
                and (n.value == TRAINING or n.value.startswith(f"{TRAINING}."))
            ]
    assert not named, named


def test_the_training_package_is_seen(graph) -> None:
    """The rule above reads the training package too: its modules are in the graph and import the product."""
    assert "training.feature_cli" in graph and "pyramid_demo.models.feature_draft" in graph["training.feature_train"]


def test_the_app_stands_on_the_clock_not_the_bench(graph) -> None:
    """Rule: the page and the bench time runs with one clock (`pyramid_demo.clock`) below both; nothing under
    `pyramid_demo/app/` (nor `app.py`) reaches `pyramid_demo.bench` or a peer, so the race's quiet decode runs no
    code of the benchmark's CLI."""
    app_modules = [m for m in graph if m == "app" or m.startswith("pyramid_demo.app")]
    reached = {m: sorted(x for x in reachable(graph, m) if x.startswith("pyramid_demo.bench")) for m in app_modules}
    assert not {m: r for m, r in reached.items() if r}
    assert (
        "pyramid_demo.clock" in graph["pyramid_demo.app.races"]
        and "pyramid_demo.clock" in graph["pyramid_demo.bench.runner"]
    )
    assert not {
        x for x in reachable(graph, "pyramid_demo.clock") if x.startswith(("pyramid_demo.app", "pyramid_demo.bench"))
    }
