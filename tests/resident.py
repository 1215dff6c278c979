"""What models hold in memory, counted from the objects themselves (a test helper, not a test).

Every tensor reachable from the roots (modules: parameters, buffers, children and other attributes; containers,
dataclasses such as the core forward's weights, bound methods, closures) is counted once per storage; an fbgemm fp16
weight, which only its kernel reads, counts at two bytes a weight. `twice` finds weight rows held in two places:
the same bytes in two storages.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Held:
    bytes: int  # every storage once
    twice: list[tuple[Any, Any]]  # (storage, storage) pairs holding an identical weight row


def _reachable(roots: list[Any]) -> tuple[list[torch.Tensor], list[torch.ScriptObject]]:
    seen: set[int] = set()
    tensors, opaque = [], []
    stack = list(roots)
    while stack:
        o = stack.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            tensors.append(o)
        elif isinstance(o, torch.ScriptObject):
            opaque.append(o)
        elif isinstance(o, torch.nn.Module):
            stack.extend(vars(o).values())  # _parameters, _buffers, _modules and plain attributes (a dict of layers)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set | frozenset):
            stack.extend(o)
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            stack.extend(getattr(o, f.name) for f in dataclasses.fields(o))
        elif isinstance(o, types.MethodType):
            stack.append(o.__self__)
        elif isinstance(o, types.FunctionType):
            for cell in o.__closure__ or ():
                try:
                    stack.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
    return tensors, opaque


def _rows(t: torch.Tensor) -> list[bytes]:
    """A 2-D weight's rows as bytes, all-zero rows left out (padding and zeroed rows are alike by design)."""
    if t.dim() != 2 or t.shape[0] == 0 or t.shape[1] < 8:
        return []
    raw = t.detach().contiguous().view(torch.uint8).reshape(t.shape[0], -1).numpy()
    return [r.tobytes() for r in raw if r.any()]


def key_of(o: Any) -> Any:
    """The key `held` files a tensor or an fbgemm fp16 weight under (its storage, or its identity)."""
    if isinstance(o, torch.ScriptObject):
        return ("fp16", id(o))
    return o.untyped_storage().data_ptr()


def held(roots: list[Any]) -> Held:
    """What `roots` hold: bytes of every storage once, and weight rows held in two storages."""
    tensors, opaque = _reachable(roots)
    sizes: dict[Any, int] = {}
    owner: dict[bytes, Any] = {}
    twice = []

    def note(key: Any, nbytes: int, rows: list[bytes]) -> None:
        sizes[key] = max(sizes.get(key, 0), nbytes)
        for r in rows:
            other = owner.setdefault(r, key)
            if other != key:
                twice.append((other, key))

    for t in tensors:
        if t.device.type == "meta":
            continue
        note(key_of(t), t.untyped_storage().nbytes(), _rows(t))
    for o in opaque:
        w, _ = torch.ops.quantized.linear_unpack_fp16(o)  # [out, in]: fp16 values as fp32
        note(key_of(o), 2 * w.numel(), _rows(w.half()))
    return Held(sum(sizes.values()), twice)
