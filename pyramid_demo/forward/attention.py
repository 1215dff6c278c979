"""Row-wise attention ("rowwise"): each query row of a verification pass makes the SDPA call a one-token step
makes, so SD at T=0 keeps AR's text in 16-bit on a CPU (the fused kernel's blocking depends on the query length,
and a near-tie flips). Costs one small call per extra row per layer."""
from __future__ import annotations

from typing import Any, cast

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "rowwise"


def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B, H_kv, L, D] -> [B, H_kv·n, L, D]: grouped-query heads expanded for plain SDPA."""
    if n == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n, t, d).reshape(b, h * n, t, d)


def rowwise_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, H, n, D] over key/value [B, H_kv, L, D] -> [B, n, H, D]; row i sees the first L − n + i + 1 keys."""
    if query.shape[0] != 1 or (attention_mask is not None and attention_mask.dim() == 4
                               and attention_mask.shape[0] != 1):
        raise ValueError("rowwise attention serves one unpadded sequence at a time")
    n_rep = getattr(module, "num_key_value_groups", 1)
    key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
    n, total = query.shape[2], key.shape[2]
    rows = [torch.nn.functional.scaled_dot_product_attention(
        query[:, :, i: i + 1], key[:, :, : total - n + i + 1], value[:, :, : total - n + i + 1],
        dropout_p=dropout, scale=scaling) for i in range(n)]  # n × [B, H, 1, D]
    out = rows[0] if n == 1 else torch.cat(rows, dim=2)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make "rowwise" a valid `attn_implementation` (idempotent); returns its name."""
    AttentionInterface.register(NAME, rowwise_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_rowwise(model: torch.nn.Module) -> bool:
    """Switch a loaded HF model to row-wise attention; False when the model cannot take it."""
    try:
        cast(Any, model).set_attn_implementation(register())  # a transformers PreTrainedModel's method
    except (ValueError, AttributeError, TypeError):
        return False
    return True
