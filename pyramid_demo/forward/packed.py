"""Linear layers with weights packed once for oneDNN (AMX / AVX-512 BF16), so a k-token pass reads the weights once.

Exactness: oneDNN picks its kernel by row count, and a one-row call may round differently from a multi-row one;
padding every call to `min_rows` (the smallest invariant count here, `invariant_pad`) makes a pass equal steps.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

import torch

PADS = (1, 2, 4, 8)  # row counts `invariant_pad` tries, smallest first


class Fusable(torch.nn.Module):
    """A linear whose weight only its own kernel reads (oneDNN, int4, fp16). Joined to its fused siblings it drops its
    weight and computes through its child `whole` (every resident byte shown once); the lean forward calls the whole."""

    in_features: int
    out_features: int
    cols: tuple[int, int] = (0, 0)  # its columns of the whole's output, once joined

    @property
    def part_of(self) -> torch.nn.Module | None:
        """The fused layer this one is columns of, or None."""
        return self._modules.get("whole")

    def _through_whole(self, x: torch.Tensor) -> torch.Tensor | None:
        """This layer's output computed by its whole ([…, out]), or None when it is not joined."""
        whole = self._modules.get("whole")
        if whole is None:
            return None
        a, b = self.cols
        return whole.forward(x)[..., a:b].contiguous()

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


class PackedLinear(Fusable):
    """y = x·Wᵀ + b through oneDNN with W packed once; calls of fewer than `min_rows` rows are zero-padded."""

    def __init__(self, linear: torch.nn.Linear | torch.Tensor, min_rows: int = 1, bias: torch.Tensor | None = None):
        """From a linear, or from its weight [out, in] and bias [out] (no throwaway `nn.Linear` to build)."""
        super().__init__()
        if isinstance(linear, torch.nn.Linear):
            w, bias = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
        else:
            w = linear.detach()
        self.out_features, self.in_features = w.shape
        self.min_rows = min_rows
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(w, 1), persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def dense(self) -> torch.Tensor:
        """Its weight as a plain tensor [out, in] (a new one: oneDNN's packed form has no views)."""
        whole = self.part_of
        if whole is not None:
            return cast(PackedLinear, whole).dense()[self.cols[0]: self.cols[1]]
        return cast(torch.Tensor, self.packed).to_dense()

    def _release(self, whole: torch.nn.Module, a: int, b: int) -> None:
        self.packed = None
        self.bias = None if self.bias is None else cast(torch.Tensor, whole.bias)[a:b]  # a view: no copy

    def _own_bytes(self) -> int:
        return self.in_features * self.out_features * cast(torch.Tensor, self.packed).element_size()

    def __deepcopy__(self, memo: dict) -> torch.nn.Linear:
        """A plain linear over the dense weight (a packed tensor cannot be copied; a copy is cast or quantized)."""
        w = self.dense()  # [out, in]
        lin = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, dtype=w.dtype,
                              device="meta")  # no init: the weight is set next
        lin.weight = torch.nn.Parameter(w.clone())
        if self.bias is not None:
            lin.bias = torch.nn.Parameter(cast(torch.Tensor, self.bias).clone())
        return lin

    def exportable(self) -> torch.nn.Linear:
        """The plain linear a compiled pass is built from (inductor packs its own weights)."""
        return self.__deepcopy__({})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = self._through_whole(x)
        if part is not None:
            return part
        flat = x.reshape(-1, self.in_features)  # [rows, in]
        rows = flat.shape[0]
        if rows < self.min_rows:
            flat = torch.cat([flat, flat.new_zeros(self.min_rows - rows, self.in_features)])  # [min_rows, in]
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")  # [≥rows, out]
        return y[:rows].reshape(*x.shape[:-1], self.out_features)


def available(dtype: torch.dtype) -> bool:
    """oneDNN is built in and runs this dtype natively on this CPU (bf16 needs AVX-512 BF16 or AMX)."""
    if dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def bf16_linears(models: Iterable[torch.nn.Module]) -> list[torch.nn.Linear]:
    """Every distinct CPU bf16 `nn.Linear` in `models` (a layer shared between models counted once)."""
    seen: dict[int, torch.nn.Linear] = {}
    for model in models:
        for m in model.modules():
            if type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16 and m.weight.device.type == "cpu":
                seen.setdefault(id(m), m)
    return list(seen.values())


Swap = tuple[torch.nn.Module, str, torch.nn.Module]  # (parent, child's name, the child replaced)


def swap_linears(models: Iterable[torch.nn.Module],
                 make: Callable[[torch.nn.Linear], torch.nn.Module | None]) -> list[Swap]:
    """Replace every plain `nn.Linear` for which `make` returns a module (a shared one once); `restore` undoes it."""
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


def restore(swaps: list[Swap]) -> None:
    """Undo `swap_linears`."""
    for parent, name, child in swaps:
        setattr(parent, name, child)


def pack_linears(models: list[torch.nn.Module], min_rows: int = 1) -> int:
    """Swap every CPU bf16 `nn.Linear` for a `PackedLinear` padding to `min_rows`; returns how many."""
    def make(lin: torch.nn.Linear) -> PackedLinear | None:
        bf16 = lin.weight.dtype == torch.bfloat16 and lin.weight.device.type == "cpu"
        return PackedLinear(lin, min_rows) if bf16 else None

    return len({id(old) for _, _, old in swap_linears(models, make)})


def rows_invariant(linear: torch.nn.Module, max_rows: int, seed: int = 0) -> bool:
    """Whether row i of an M-row call equals the one-row call on row i, bitwise, for M = 1 … max_rows."""
    g = torch.Generator().manual_seed(seed)
    dtype = cast(torch.Tensor, linear.packed if hasattr(linear, "packed") else linear.weight).dtype
    x = torch.randn(max_rows, cast(int, linear.in_features), generator=g).to(dtype)  # [max_rows, in]
    with torch.inference_mode():
        ref = torch.cat([linear(x[i: i + 1]) for i in range(max_rows)])  # [max_rows, out], one row a call
        return all(torch.equal(linear(x[:m]), ref[:m]) for m in range(2, max_rows + 1))


def invariant_pad(linears: Sequence[torch.nn.Linear], max_rows: int, pads: Sequence[int] = PADS,
                  pack=PackedLinear) -> int | None:
    """The smallest padding in `pads` making every linear's packed rows batch-invariant up to `max_rows`, or None;
    one linear per (in, out, bias) shape is checked (oneDNN's kernel depends on shapes only)."""
    shapes: dict[tuple, torch.nn.Linear] = {}
    for lin in linears:
        shapes.setdefault((lin.in_features, lin.out_features, lin.bias is not None), lin)
    for pad in pads:
        if all(rows_invariant(pack(lin, pad), max_rows) for lin in shapes.values()):
            return pad
    return None
