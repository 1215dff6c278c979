"""A chain's decision, this checkout's one walk against an earlier commit's chain rule, on the same hand-built
logits, interleaved in one process: µs per decision (median of 200), per rule. Why: a chain must not pay for
being a tree. Usage: PYTHONPATH=. python scripts/decide_cost.py COMMIT [vocab] (e.g. 2bea8e5, before the merge
of the two paths; run on an idle machine: only the ratio in one run is a claim)."""
import io
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

commit, V = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 49152
root = Path(tempfile.mkdtemp())
tar = subprocess.run(["git", "archive", commit, "pyramid_demo/core"], capture_output=True, check=True).stdout
tarfile.open(fileobj=io.BytesIO(tar)).extractall(root)
(root / "pyramid_demo").rename(root / "pyramid_old")
(root / "pyramid_old" / "__init__.py").write_text("")
sys.path.insert(0, str(root))
torch.set_num_threads(1)

from pyramid_old.core.config import DecodeConfig as OldCfg  # noqa: E402
from pyramid_old.core.decide import decide as old  # noqa: E402

from pyramid_demo.core.config import DecodeConfig as NewCfg  # noqa: E402
from pyramid_demo.core.decide import decide as new  # noqa: E402

n = 4
g = torch.Generator().manual_seed(0)
z_p, z_q = torch.randn(n + 1, V, generator=g), torch.randn(n, V, generator=g)  # [n+1, V], [n, V]
x = z_q.argmax(-1).tolist()
for rule, temp, fallback in (("sd", 0.0, "none"), ("sd", 1.0, "none"), ("fuzzy", 0.0, "none"), ("fuzzy", 1.0, "sd")):
    took: dict[str, list[float]] = {"old": [], "new": []}
    for rep in range(200):
        pair = (("old", old, OldCfg), ("new", new, NewCfg))
        for name, fn, make in pair if rep % 2 else pair[::-1]:
            cfg = make(method="fsd", temperature=temp, fallback=fallback)
            gen = torch.Generator().manual_seed(rep) if temp else None
            t0 = time.perf_counter()
            fn(z_p, z_q, x, rule, 0.5, cfg, gen, "target", "draft", "target")
            took[name].append(time.perf_counter() - t0)
    med = {k: sorted(v)[len(v) // 2] * 1e6 for k, v in took.items()}
    print(f"{rule} T={temp} fallback={fallback}: {commit} {med['old']:.0f} µs, this checkout {med['new']:.0f} µs, "
          f"ratio {med['new'] / med['old']:.2f}")
