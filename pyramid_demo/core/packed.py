"""Linear layers with weights packed once for oneDNN (AMX / AVX-512 BF16 on x86 CPUs).

A plain bf16 `linear` on a CPU either re-packs its weight for oneDNN on every call (oneDNN on)
or, with oneDNN off, streams the weight once per input row, so a 5-token verification pass
reads every weight five times. Packing each weight once at load time, as torch.compile's CPU
backend does, lets a k-token pass read the weights once: verification then costs about what a
one-token step costs, which is what speculative decoding needs from its target.
"""
from __future__ import annotations

import torch


class PackedLinear(torch.nn.Module):
    """y = x·Wᵀ + b through oneDNN with W packed once; same results as oneDNN's own bf16 linear."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1),
                             persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # [rows, in]
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")  # [rows, out]
        return y.reshape(*x.shape[:-1], self.out_features)


def available(dtype: torch.dtype) -> bool:
    """oneDNN is built in and runs this dtype natively on this CPU (bf16 needs AVX-512 BF16 or AMX)."""
    if dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def pack_linears(models: list[torch.nn.Module]) -> int:
    """Swap every bf16 `nn.Linear` in `models` for a `PackedLinear` (a layer shared between models
    is packed once); returns how many were packed. Inference only: packed weights take no grad."""
    done: dict[int, PackedLinear] = {}
    for model in models:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear and child.weight.dtype == torch.bfloat16 \
                        and child.weight.device.type == "cpu":
                    if id(child) not in done:
                        done[id(child)] = PackedLinear(child)
                    setattr(parent, name, done[id(child)])
    return len(done)
