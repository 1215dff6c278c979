"""Linears whose weight only their own kernel reads (int4, fbgemm fp16): fused siblings share one resident copy,
and a model's plain linears are swapped for them in one place (`swap_linears`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch


class Fusable(torch.nn.Module):
    """A linear whose weight only its own kernel reads (int4, fp16). Joined to its fused siblings it drops its
    weight and computes through its child `whole` (every resident byte shown once); the core forward calls the whole."""

    in_features: int
    out_features: int
    cols: tuple[int, int] = (0, 0)  # its columns of the whole's output, once joined

    @property
    def part_of(self) -> torch.nn.Module | None:
        """The fused layer this one is columns of, or None."""
        return self._modules.get("whole")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]: its own kernel, or once joined its columns of the whole's output."""
        whole = self._modules.get("whole")
        if whole is None:
            return self._own_forward(x)
        a, b = self.cols
        return whole.forward(x)[..., a:b].contiguous()

    def _own_forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _release(self, whole: torch.nn.Module, a: int, b: int) -> None:
        """Drop (or re-point at views of `whole`) what this layer held itself; each kind says how."""
        raise NotImplementedError

    @property
    def weight_bytes(self) -> int:
        """Bytes of its weight that it holds itself: none once joined (its whole holds them)."""
        return 0 if self.part_of is not None else self._own_bytes()

    def _own_bytes(self) -> int:
        raise NotImplementedError


def join(parts: Sequence[Fusable], whole: torch.nn.Module) -> None:
    """Make `parts` (layers over one input, in order) the columns of `whole`, their fused layer: one resident copy."""
    a = 0
    for p in parts:
        b = a + p.out_features
        p._release(whole, a, b)
        p.add_module("whole", whole)
        p.cols = (a, b)
        a = b


def joined_whole(parts: Sequence[torch.nn.Module]) -> torch.nn.Module | None:
    """The fused layer `parts` already are, in order and covering it, or None (then they must be fused anew)."""
    whole = getattr(parts[0], "part_of", None)
    a = 0
    for p in parts:
        if getattr(p, "part_of", None) is not whole or whole is None or p.cols != (a, a + p.out_features):
            return None
        a += p.out_features
    return whole if a == whole.out_features else None


Swap = tuple[torch.nn.Module, str, torch.nn.Module]  # (parent, child's name, the child replaced)


def swap_linears(
    models: Iterable[torch.nn.Module], make: Callable[[torch.nn.Linear], torch.nn.Module | None]
) -> list[Swap]:
    """Replace every plain `nn.Linear` for which `make` returns a module (a shared one once); returns the swaps."""
    made: dict[int, torch.nn.Module | None] = {}
    out: list[Swap] = []
    for model in models:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is not torch.nn.Linear:
                    continue
                if id(child) not in made:
                    made[id(child)] = make(child)
                new = made[id(child)]
                if new is not None:
                    out.append((parent, name, child))
                    setattr(parent, name, new)
    return out
