"""A quantized copy of a model as a family member ('X@int4'), built at load: as in gpt-fast, every `nn.Linear` becomes
an `Int4Linear` (one bf16 scale and zero per group; min/max groups recover a Q4_1 GGUF's own codes)."""

from __future__ import annotations

import copy
import re
from typing import Any

import torch

from ..forward.fusable import Fusable, swap_linears
from .errors import LoadError

GROUPS = (32, 64, 128, 256)  # group sizes torch's int4 kernels take
DEFAULT_GROUP = 32
_SUFFIX = re.compile(r"^(?P<ref>.+)@int4(?:g(?P<group>\d+))?$")


def parse_quant(ref: str) -> tuple[str, int | None]:
    """'owner/model@int4' -> ('owner/model', 32); '…@int4g128' -> (…, 128); a plain ref -> (ref, None)."""
    m = _SUFFIX.match(ref.strip())
    if m is None:
        if "@" in ref:
            raise LoadError(
                f"'{ref}': the only model suffix is @int4 (or @int4g32/g64/g128/g256: the group size), "
                "e.g. 'HuggingFaceTB/SmolLM2-1.7B-Instruct@int4'."
            )
        return ref, None
    group = int(m["group"]) if m["group"] else DEFAULT_GROUP
    if group not in GROUPS:
        raise LoadError(
            f"'{ref}': group {group} is not one torch's int4 kernel takes; use one of "
            f"{', '.join(f'@int4g{g}' for g in GROUPS)}."
        )
    return m["ref"], group


def quant_name(ref: str, group: int) -> str:
    """The reference of `ref`'s int4 copy (the inverse of `parse_quant`)."""
    return f"{ref}@int4" + ("" if group == DEFAULT_GROUP else f"g{group}")


def quantize_groups(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min/max per row and group: codes [N, K] int32 in [0, 15], bf16 scales, zeros [N, K/group]; w ≈ (c − 8)·s + z."""
    n, k = w.shape
    g = w.float().reshape(-1, group)  # [N·K/group, group]
    lo, hi = g.amin(1, keepdim=True), g.amax(1, keepdim=True)
    scale = ((hi - lo).clamp(min=1e-6) / 15).to(torch.bfloat16)  # [N·K/group, 1]
    zero = (lo + scale.float() * 8).to(torch.bfloat16)
    codes = ((g - zero.float()) / scale.float() + 8).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    return codes, scale.reshape(n, -1), zero.reshape(n, -1)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] int32 in torch's int4 layout for their device."""
    if codes.device.type == "cpu":
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)  # [N, K/2] uint8
    pairs = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)  # [N, K/2]: two codes a byte
    k = codes.shape[1]
    tiles = next(t for t in (8, 4, 2) if k % (16 * t) == 0)  # CUDA's inner k-tiles (gpt-fast's 8 where K allows)
    return torch.ops.aten._convert_weight_to_int4pack(pairs, tiles)


def _joined_bias(parts: list[tuple[torch.Tensor | None, int]], device: torch.device) -> torch.Tensor | None:
    """Joined layers' biases end to end, fp32 zeros for a part (bias, width) without one; None where none has one."""
    if all(b is None for b, _ in parts):
        return None
    return torch.cat([torch.zeros(n, dtype=torch.float32, device=device) if b is None else b for b, n in parts])


class Int4Linear(Fusable):
    """y = x·Wᵀ + b with W in 4-bit groups; any input dtype in, the same dtype out (bf16 inside the kernel)."""

    def __init__(
        self,
        packed: torch.Tensor,
        scales_zeros: torch.Tensor,
        in_features: int,
        out_features: int,
        group: int,
        bias: torch.Tensor | None = None,
    ):
        super().__init__()
        self.in_features, self.out_features, self.group = in_features, out_features, group
        self.register_buffer("packed", packed, persistent=False)  # the device's int4 layout
        self.register_buffer("scales_zeros", scales_zeros, persistent=False)  # [K/group, N, 2] bf16
        self.register_buffer("bias", bias, persistent=False)  # [N] or None

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group: int) -> Int4Linear:
        w = linear.weight.detach()  # [N, K]
        pad = -w.shape[0] % 16  # the CPU layout packs rows in sixteens: zero rows, sliced off after the call
        w_full = torch.cat([w, w.new_zeros(pad, w.shape[1])]) if pad else w  # [N + pad, K]
        codes, scale, zero = quantize_groups(w_full, group)
        sz = torch.stack([scale, zero], 2).transpose(0, 1).contiguous().to(torch.bfloat16)  # [K/group, N, 2]
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(_pack(codes.to(w.device)), sz.to(w.device), w.shape[1], w.shape[0], group, bias)

    def _own_forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)  # [rows, K]
        cpu = flat.device.type == "cpu"
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu if cpu else torch.ops.aten._weight_int4pack_mm
        y = mm(flat, self.packed, self.group, self.scales_zeros)
        y = y[:, : self.out_features].to(x.dtype)  # [rows, N]: padding rows dropped
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}"

    def _own_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + self.scales_zeros.numel() * 2

    def _release(self, whole: torch.nn.Module, a: int, b: int) -> None:
        """Joined: its codes, scales and bias become views of the whole's rows a:b (it computes through the whole)."""
        self.packed, self.scales_zeros = whole.packed[a:b], whole.scales_zeros[:, a:b]
        self.bias = None if self.bias is None else whole.bias[a:b]

    @staticmethod
    def fuse(mods: list[Int4Linear]) -> Int4Linear | None:
        """Several int4 linears over one input as one kernel call (CPU, each width a multiple of 64 rows), else None."""
        groups = {m.group for m in mods}
        if len(mods) < 2 or len(groups) > 1 or mods[0].packed.device.type != "cpu":
            return None
        if any(m.out_features % 64 for m in mods):
            return None
        bias = _joined_bias([(m.bias, m.out_features) for m in mods], mods[0].packed.device)
        return Int4Linear(
            torch.cat([m.packed for m in mods]),
            torch.cat([m.scales_zeros for m in mods], 1),
            mods[0].in_features,
            sum(m.out_features for m in mods),
            groups.pop(),
            bias,
        )


class Fp16Linear(Fusable):
    """y = x·Wᵀ + b with W in fp16 through fbgemm (CPU): for a copy's LM head, where 4-bit codes cost most agreement."""

    def __init__(self, w: torch.Tensor, bias: torch.Tensor | None = None):
        """From a weight [out, in] and bias [out] (a fused one's too: no throwaway `nn.Linear` to build)."""
        super().__init__()
        self.out_features, self.in_features = w.shape
        self.packed = torch.ops.quantized.linear_prepack_fp16(
            w.detach().float(), None if bias is None else bias.detach().float()
        )

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Its weight [out, in] (fp16 values, as fp32) and bias [out], unpacked anew."""
        whole = self.part_of
        if whole is not None:
            w, b = whole.unpacked()
            a, z = self.cols
            return w[a:z], None if b is None else b[a:z]
        return torch.ops.quantized.linear_unpack_fp16(self.packed)

    def _release(self, whole: torch.nn.Module, a: int, b: int) -> None:
        self.packed = None

    def _own_bytes(self) -> int:
        return 2 * self.in_features * self.out_features

    @staticmethod
    def fuse(mods: list[Fp16Linear]) -> Fp16Linear | None:
        """Several fp16 linears over one input as one fbgemm call (the same sums); None for a single layer."""
        if len(mods) < 2:
            return None
        parts = [m.unpacked() for m in mods]  # (weight [N, K], bias)
        w = torch.cat([p[0] for p in parts])  # [sum N, K]
        return Fp16Linear(w, _joined_bias([(b, part.shape[0]) for part, b in parts], w.device))

    def _own_forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic_fp16(x.reshape(-1, self.in_features).float(), self.packed)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def fp16_available() -> bool:
    """fbgemm's fp16 linear is built into this torch (x86 CPU builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def refusal(model: torch.nn.Module, group: int) -> str | None:
    """Why `model` cannot have an int4 copy here (one line naming what would work), or None."""
    dev = next(model.parameters()).device
    if dev.type not in ("cpu", "cuda"):
        return (
            f"an int4 copy runs on the CPU or CUDA (torch's int4 kernels), not on {dev.type}: "
            "load the family with --device cpu, or name the model without @int4"
        )
    for name, m in model.named_modules():
        if type(m) is torch.nn.Linear and m.in_features % group:
            fits = [g for g in GROUPS if m.in_features % g == 0]
            hint = f"use @int4g{fits[-1]}" if fits else "name the model without @int4"
            return (
                f"an int4 copy needs every linear's input width divisible by the group: {name} has "
                f"{m.in_features}, not a multiple of {group}; {hint}"
            )
    if not any(type(m) is torch.nn.Linear for m in model.modules()):
        return f"{type(model).__name__} has no plain linear layers to quantize; name the model without @int4"
    return None


def int4_copy(model: Any, group: int = DEFAULT_GROUP) -> Any:
    """A copy of `model` with int4 linears, sharing embeddings and norms; the LM head is fp16 where fbgemm runs (a 4-bit
    head alone costs several points of top-1 agreement). LoadError with `refusal`'s line."""
    if why := refusal(model, group):
        raise LoadError(why)
    out = copy.deepcopy(model, memo={id(t): t for t in (*model.parameters(), *model.buffers())})  # shares them
    fp16 = next(model.parameters()).device.type == "cpu" and fp16_available()
    head = out.get_output_embeddings()

    def make(lin: torch.nn.Linear) -> torch.nn.Module:
        return Fp16Linear(lin.weight, lin.bias) if fp16 and lin is head else Int4Linear.from_linear(lin, group)

    swap_linears([out], make)
    out.config.tie_word_embeddings = False  # its head is its own layer now: the embedding stays full precision
    out.eval()
    return out


def label(model: torch.nn.Module) -> str:
    """A quantized copy's kernels in words, read from what it holds."""
    fp16 = isinstance(model.get_output_embeddings(), Fp16Linear)
    return "int4 weights, fp16 head" if fp16 else "int4 weights, int4 head"
