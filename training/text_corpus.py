"""Existing text as corpus shards: documentation that ships with what is installed here, as chat turns.

Why: an on-policy answer costs one target forward per token to write and one more to recompute its states; a
piece of existing text costs only the second (one teacher-forced pass per sequence), and EAGLE-1 found a head
trained on fixed text nearly as good as one trained on the target's own answers. The training loss is the
target's distribution at each position, not the text's next token, so the text only has to put the target in
realistic states.

Sources, each piece with its licence (pieces under no stated licence are left out):
  text:python-package-docs     every installed distribution's long description (its README, from the METADATA
                               file), licence from License-Expression, License or its licence classifiers
  text:python-stdlib-docstrings the docstrings of the Python standard library's modules, classes and functions,
                               read from the source with `ast` (nothing imported), licence PSF-2.0
  text:python-reference-topics the language reference's sections that `help()` shows (the stdlib's
                               pydoc_data/topics.py, read with `ast.literal_eval`), licence PSF-2.0
  text:debian-doc              READMEs and text manuals under /usr/share/doc/<package>/ (no changelogs), licence
                               from the package's machine-readable copyright file (its `Files: *` stanza);
                               permissive licences only (no GPL, LGPL, GFDL or share-alike text)
Each chunk (paragraphs up to `max_tokens`) becomes a user turn asking for it and the text as the assistant's turn.
"""

from __future__ import annotations

import ast
import importlib.metadata as im
import random
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import corpus
from .features import prompt_ids

PKG, STDLIB, REF = "text:python-package-docs", "text:python-stdlib-docstrings", "text:python-reference-topics"
DEB = "text:debian-doc"
COPYLEFT = ("GPL", "GFDL", "FDL", "CC-BY-SA", "SHARE")
PKG_ASKS = [
    "Describe the Python package {name}.",
    "What is {name} and how do I use it?",
    "Write the README for the Python package {name}.",
    "Tell me about the {name} library.",
]
PKG_MORE = ["Continue the documentation of {name}.", "Tell me more about {name}.", "What else does {name} offer?"]
REF_ASKS = [
    "Explain {name} in Python.",
    "How does {name} work in Python?",
    "What does the Python reference say about {name}?",
]
REF_MORE = ["Continue the explanation of {name} in Python.", "Tell me more about {name} in Python."]
DEB_ASKS = [
    "What does the documentation of {name} say?",
    "Show me the {name} documentation.",
    "Explain {name} to me.",
    "Give me an overview of {name}.",
]
DEB_MORE = ["Continue the {name} documentation.", "What else does the {name} documentation cover?"]
DOC_ASKS = [
    "What does `{name}` do in Python?",
    "Explain `{name}` from Python's standard library.",
    "Write the docstring for `{name}`.",
    "How do I use `{name}`?",
]


def licence(meta: Any) -> str:
    """A distribution's licence as its metadata states it ('' when it states none)."""
    expr = (meta.get("License-Expression") or "").strip()
    if expr:
        return expr
    lic = (meta.get("License") or "").strip()
    if lic and len(lic) < 80 and "\n" not in lic:
        return lic
    cls = [c.split("::")[-1].strip() for c in (meta.get_all("Classifier") or []) if c.startswith("License ::")]
    return " / ".join(cls) if cls else ("(licence text in METADATA)" if lic else "")


def package_pieces() -> list[dict]:
    """One piece per installed distribution with a long description and a stated licence."""
    out, seen = [], set()
    for d in sorted(im.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        meta = d.metadata
        name = meta["Name"]
        body = (meta.get_payload() or meta.get("Description") or "").strip()
        lic = licence(meta)
        if not name or name.lower() in seen or len(body) < 200 or not lic:
            continue
        seen.add(name.lower())
        out.append({"source": PKG, "name": name, "version": meta["Version"], "licence": lic, "text": body})
    return out


def stdlib_pieces(root: Path | None = None) -> list[dict]:
    """Docstrings of the standard library's public modules, classes and functions (≥ 120 characters)."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    ver = ".".join(map(str, sys.version_info[:3]))
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(
            p.startswith("_") or p in ("test", "tests", "idlelib", "site-packages", "lib2to3") for p in rel.parts
        ) or rel.name in ("this.py", "antigravity.py"):
            continue
        mod = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue

        def visit(node: ast.AST, prefix: str) -> None:
            for ch in getattr(node, "body", []):
                defn = isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                if defn and not ch.name.startswith("_"):
                    doc = ast.get_docstring(ch)
                    if doc and len(doc) >= 120:
                        out.append(
                            {
                                "source": STDLIB,
                                "name": f"{prefix}.{ch.name}",
                                "version": ver,
                                "licence": "PSF-2.0",
                                "text": doc,
                            }
                        )
                    if isinstance(ch, ast.ClassDef):
                        visit(ch, f"{prefix}.{ch.name}")

        doc = ast.get_docstring(tree)
        if doc and len(doc) >= 120:
            out.append({"source": STDLIB, "name": mod, "version": ver, "licence": "PSF-2.0", "text": doc})
        visit(tree, mod)
    return out


def reference_pieces(root: Path | None = None) -> list[dict]:
    """The Python language reference's topics as `help()` shows them (pydoc_data/topics.py), one per topic."""
    path = (root or Path(sysconfig.get_paths()["stdlib"])) / "pydoc_data" / "topics.py"
    ver = ".".join(map(str, sys.version_info[:3]))
    tree = ast.parse(path.read_text(encoding="utf-8"))
    topics: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
    return [
        {"source": REF, "name": k.replace("-", " "), "version": ver, "licence": "PSF-2.0", "text": v}
        for k, v in sorted(topics.items())
        if len(v) >= 120
    ]


def debian_licence(copyright_file: Path) -> str:
    """The `License:` of a DEP-5 copyright file's `Files: *` stanza ('' if the file is not machine-readable)."""
    try:
        text = copyright_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    if not text.startswith("Format:"):
        return ""
    for stanza in text.split("\n\n"):
        fields = dict(line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith(" "))
        if fields.get("Files", "").strip() == "*" and fields.get("License", "").strip():
            return fields["License"].strip()
    return ""


def debian_pieces(root: Path = Path("/usr/share/doc"), max_chars: int = 400_000) -> list[dict]:
    """READMEs and .txt manuals of each package with a machine-readable licence (prose only: mostly letters)."""
    import gzip

    out = []
    for pkg in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        lic = debian_licence(pkg / "copyright")
        if not lic or any(c in lic.upper() for c in COPYLEFT):  # permissive only: no share-alike text in the repo
            continue
        for f in sorted(pkg.iterdir()):
            name = f.name.removesuffix(".gz")
            if not f.is_file() or not (name.startswith("README") or name.endswith(".txt")):
                continue
            if ".Debian" in name or name in ("README.source", "requirements.txt"):  # Debian's own notes: the
                continue  # packaging's licence (`Files: debian/*`), not the package's; a requirements list: no prose
            try:
                raw = gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes()
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
                continue
            letters = sum(c.isalpha() or c.isspace() for c in text[:20000]) / max(1, len(text[:20000]))
            if 200 <= len(text) <= max_chars and letters > 0.85:
                out.append(
                    {"source": DEB, "name": f"{pkg.name} {name}", "version": "", "licence": lic, "text": text.strip()}
                )
    return out


def chunks(text: str, count: Callable[[str], int], max_tokens: int) -> list[str]:
    """Paragraphs joined while they fit in max_tokens; a longer paragraph is cut by lines."""
    out, cur = [], ""
    paras = [p for p in text.split("\n\n") if p.strip()]
    for p in paras:
        parts = [p] if count(p) <= max_tokens else p.split("\n")
        for q in parts:
            cand = q if not cur else cur + "\n\n" + q
            if cur and count(cand) > max_tokens:
                out.append(cur)
                cur = q
            else:
                cur = cand
    if cur:
        out.append(cur)
    return [c for c in out if count(c) <= 2 * max_tokens]


def conversations(
    pieces: list[dict], tokenizer: Any, seed: int, max_tokens: int = 384, max_chunks: int = 8
) -> list[dict]:
    """Each piece's first `max_chunks` chunks as (prompt ids, answer ids + EOS), with the piece it came from."""
    r = random.Random(seed)
    eos = tokenizer.eos_token_id

    def count(s: str) -> int:
        return len(tokenizer(s, add_special_tokens=False)["input_ids"])

    out = []
    for p in pieces:
        for k, ch in enumerate(chunks(p["text"], count, max_tokens)[:max_chunks]):
            if p["source"] == PKG:
                asks = PKG_ASKS if k == 0 else PKG_MORE
            elif p["source"] in (REF, DEB):
                first, more = (REF_ASKS, REF_MORE) if p["source"] == REF else (DEB_ASKS, DEB_MORE)
                asks = first if k == 0 else more
            else:
                asks = DOC_ASKS
            msgs = [{"role": "user", "content": r.choice(asks).format(name=p["name"])}]
            ans = tokenizer(ch, add_special_tokens=False)["input_ids"] + [eos]
            out.append({"prompt": prompt_ids(tokenizer, msgs), "answer": [int(t) for t in ans], "piece": p})
    return out


def build(
    tokenizer: Any,
    folder: Path,
    source: str,
    seed: int = 0,
    shard_seqs: int = 512,
    max_tokens: int = 384,
    target: dict | None = None,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Write `source`'s text as shards named `<source>_<i>` (skipping a source already in the folder); each
    shard's entry lists its pieces with their versions and licences. Returns the new entries."""
    tag = source.split(":", 1)[1]
    if any(p.name.startswith(tag) for p in corpus.shards(folder)):
        log(f"{source}: already in {folder}")
        return []
    pieces = {PKG: package_pieces, STDLIB: stdlib_pieces, REF: reference_pieces, DEB: debian_pieces}[source]()
    convs = conversations(pieces, tokenizer, seed, max_tokens, max_chunks=24 if source == REF else 8)
    entries = []
    for i in range(0, len(convs), shard_seqs):
        part = convs[i : i + shard_seqs]
        used: dict[str, dict] = {}
        for c in part:
            p = c["piece"]
            u = used.setdefault(
                p["name"], {"name": p["name"], "version": p["version"], "licence": p["licence"], "sequences": 0}
            )
            u["sequences"] += 1
        meta = {
            "source": source,
            "seed": seed,
            "sampling": None,
            "teacher_forced_text": True,
            "prompts": {
                "asks": {PKG: PKG_ASKS + PKG_MORE, REF: REF_ASKS + REF_MORE, DEB: DEB_ASKS + DEB_MORE}.get(
                    source, DOC_ASKS
                ),
                "max_chunk_tokens": max_tokens,
            },
            "pieces": list(used.values()),
            "target": target or {},
            "machine": corpus.machine(),
        }
        seqs = [c["prompt"] + c["answer"] for c in part]
        entries.append(
            corpus.write_shard(folder, f"{tag}_{i // shard_seqs:04d}", seqs, [len(c["prompt"]) for c in part], meta)
        )
        log(f"{entries[-1]['file']}: {entries[-1]['sequences']} sequences, {entries[-1]['answer_tokens']:,} tokens")
    return entries
