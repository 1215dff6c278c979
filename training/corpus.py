"""The draft's training corpus as token ids: compressed shards committed in the repo, with a manifest.

Why ids and not states: a shard of ids is ~2 bytes a token where the target's states are 1,152; the states are
recomputed by one teacher-forced pass (`lean_batch.states`), so the corpus can be carried from machine to
machine in git and grow across sessions. A shard (`<name>.npz`, numpy's compressed zip) holds
  ids       uint16 [total]  every sequence's prompt ids then answer ids, concatenated (vocabulary < 65,536)
  offsets   int64  [n + 1]  sequence i is ids[offsets[i]:offsets[i + 1]]
  n_prompt  int32  [n]      how many of sequence i's ids are the prompt (the rest: the target's answer)
  meta      a JSON string: the shard's own manifest entry (source, seed, sampling, counts, target, ...)
The shard is the source of truth; `manifest.json` lists every shard's entry (plus its file's sha256) and is
rebuilt from the shards whenever one is added, so a crash between the two never loses or invents an entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

MANIFEST = "manifest.json"
FORMAT = "pyramid-corpus-v1"
MAX_ID = np.iinfo(np.uint16).max


def default_dir() -> Path:
    """The committed corpus: pyramid_demo/models/weights/corpus/."""
    return Path(__file__).resolve().parent.parent / "pyramid_demo" / "models" / "weights" / "corpus"


def pack(seqs: list[list[int]], n_prompt: list[int]) -> dict[str, np.ndarray]:
    """Sequences -> the shard's arrays (ids uint16 [total], offsets int64 [n+1], n_prompt int32 [n])."""
    if len(seqs) != len(n_prompt):
        raise ValueError("one prompt length per sequence")
    flat = [int(t) for s in seqs for t in s]
    if flat and (min(flat) < 0 or max(flat) > MAX_ID):
        raise ValueError(f"token ids must lie in 0..{MAX_ID} to be stored as uint16")
    for s, p in zip(seqs, n_prompt):
        if not 0 < p <= len(s):
            raise ValueError(f"a prompt of {p} ids in a sequence of {len(s)}")
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    return {
        "ids": np.asarray(flat, dtype=np.uint16),
        "offsets": offsets,
        "n_prompt": np.asarray(n_prompt, dtype=np.int32),
    }


def counts(seqs: list[list[int]], n_prompt: list[int]) -> dict[str, int]:
    return {
        "sequences": len(seqs),
        "answer_tokens": sum(len(s) - p for s, p in zip(seqs, n_prompt)),
        "prompt_tokens": sum(n_prompt),
    }


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def machine() -> dict[str, Any]:
    """Where a shard was made (the CPU model from /proc/cpuinfo where there is one)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__}


def write_shard(folder: Path, name: str, seqs: list[list[int]], n_prompt: list[int], meta: dict) -> dict:
    """Write one shard atomically (temp file, then rename), then rebuild the manifest. Returns its entry;
    the counts in it are computed here from the ids, never taken from the caller."""
    folder.mkdir(parents=True, exist_ok=True)
    entry = {
        **meta,
        "file": f"{name}.npz",
        "format": FORMAT,
        **counts(seqs, n_prompt),
        "date": meta.get("date") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = folder / entry["file"]
    if path.exists():
        raise FileExistsError(f"{path} exists: a shard is never overwritten")
    tmp = folder / f".{name}.tmp-{os.getpid()}.npz"
    np.savez_compressed(tmp, meta=np.asarray(json.dumps(entry)), **pack(seqs, n_prompt))
    os.replace(tmp, path)
    rebuild_manifest(folder)
    return entry


def read_shard(path: Path) -> tuple[list[list[int]], list[int], dict]:
    """A shard's sequences (lists of ids), prompt lengths and its own entry."""
    with np.load(path, allow_pickle=False) as z:
        ids, off, npr = z["ids"].astype(np.int64), z["offsets"], z["n_prompt"]
        meta = json.loads(str(z["meta"]))
    seqs = [ids[off[i] : off[i + 1]].tolist() for i in range(len(npr))]
    return seqs, [int(p) for p in npr], meta


def shards(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).glob("*.npz") if not p.name.startswith("."))


def rebuild_manifest(folder: Path) -> dict:
    """manifest.json from the shards themselves (each entry plus its file's sha256), written atomically."""
    entries = []
    for p in shards(folder):
        _, _, meta = read_shard(p)
        entries.append({**meta, "sha256": sha256(p), "bytes": p.stat().st_size})
    total = {k: sum(e[k] for e in entries) for k in ("sequences", "answer_tokens", "prompt_tokens", "bytes")}
    by_source: dict[str, int] = {}
    for e in entries:
        by_source[e["source"]] = by_source.get(e["source"], 0) + e["answer_tokens"]
    man = {"format": FORMAT, "shards": entries, "total": total, "answer_tokens_by_source": by_source}
    tmp = Path(folder) / f".{MANIFEST}.tmp-{os.getpid()}"
    body = ",\n".join(json.dumps(e, separators=(",", ":")) for e in entries)  # one line per shard: short diffs
    head = {k: v for k, v in man.items() if k != "shards"}
    tmp.write_text(json.dumps(head, indent=1)[:-2] + ',\n "shards": [\n' + body + "\n ]\n}\n")
    os.replace(tmp, Path(folder) / MANIFEST)
    return man


def check(folder: Path) -> dict:
    """Verify the manifest against the shards (every file listed, hashes and counts equal); returns the
    manifest. Raises ValueError on any mismatch."""
    man = json.loads((Path(folder) / MANIFEST).read_text())
    listed = {e["file"]: e for e in man["shards"]}
    on_disk = {p.name: p for p in shards(folder)}
    if set(listed) != set(on_disk):
        raise ValueError(f"manifest lists {sorted(set(listed) ^ set(on_disk))} differently from the folder")
    for name, p in on_disk.items():
        seqs, npr, _ = read_shard(p)
        want = counts(seqs, npr)
        got = {k: listed[name][k] for k in want}
        if got != want or listed[name]["sha256"] != sha256(p):
            raise ValueError(f"{name}: manifest {got} / file {want} or its hash differs")
    return man


def target_identity(model: Any) -> dict[str, str]:
    """The target's name and a hash of its weights (sha256 over every parameter's bytes in fp32, in name
    order), so a corpus says which model answered; states recomputed from another target would not match."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().contiguous().numpy().tobytes())
    return {
        "name": str(getattr(model.config, "_name_or_path", "") or type(model).__name__),
        "arch": type(model).__name__,
        "weights_sha256": h.hexdigest(),
    }
