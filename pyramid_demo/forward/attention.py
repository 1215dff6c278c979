"""Row-wise attention: a verification pass computes each position exactly as a one-token step would.

Speculative decoding at temperature 0 promises the target's greedy text token for token. That
holds only if the target's logits at a position do not depend on how many positions share the
pass. In 16-bit on a CPU the linear layers (with oneDNN off) give bitwise the same rows whatever
the batch, but the fused attention kernel does not: transformers routes a one-token query
through a packed-GQA path and a multi-token query through a masked one, and the kernel's
blocking depends on the query length. A near-tie then flips, and SD's text drifts from AR's.

Registered as the attention implementation "rowwise", each query row attends through the
same SDPA call a one-token step makes (its own causal slice of the keys). Every model of a
family uses it, so AR, SD and the HF peers all compute the same numbers. It costs one small
kernel call per extra row per layer: measured in `bench` as the verification pass's cost.
"""
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
    """query [B, H, n, D] over key/value [B, H_kv, L, D] (the cache plus the n new positions).

    Row i sees the first L − n + i + 1 keys (causal, no padding: the engine feeds one sequence).
    Returns [B, n, H, D] as transformers' attention functions do."""
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
