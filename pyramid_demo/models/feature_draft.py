"""A draft that reads the target (EAGLE-1, arXiv 2401.15077): one trained decoder layer over `fc([f_{i-1} ; E(x_i)])`
predicting the normed state f̂_i, scored by the target's head rows for a token subset; with `taps` (EAGLE-3,
arXiv 2503.01840) `fuse` first maps the tapped layers' outputs and f to one state. See docs/how-it-works.md."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..forward.cache import tap_layers
from ..forward.core import finish, project, rope_table
from ..forward.core import rms_norm as _rms
from ..forward.weights import Dense, Layer, Weights

FORMAT = "pyramid-feature-draft-v1"


class FeatureDraft(nn.Module):
    """fc + one Llama decoder layer + the target's final norm and (reduced) head."""

    reads_verifier = True  # `forward.lm.described` names it "feature": it opens as a FeatureLM over its verifier

    def __init__(self, target: nn.Module, subset: torch.Tensor, taps: tuple[int, ...] = ()):
        super().__init__()
        cfg, inner = target.config, target.model
        self.config = cfg  # the target's: same positions, vocabulary and tokenizer (what callers check)
        d, self.n_heads, self.n_kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.eps, self.d = d // self.n_heads, float(cfg.rms_norm_eps), d
        src = inner.layers[-1]  # starts as the target's last layer
        dt = inner.norm.weight.dtype
        # fc as bare parameters: the embedding passes, the state adds
        eye = torch.eye(d, dtype=dt)
        self.fc_w = nn.Parameter(torch.cat((0.1 * eye, eye), 1))  # [d, 2d]: [state ; embedding] -> d
        self.fc_b = nn.Parameter(torch.zeros(d, dtype=dt))
        self.taps = tuple(int(t) for t in taps)  # target layers whose outputs it reads beside the final state
        if self.taps and self.taps != tap_layers(cfg.num_hidden_layers):  # every forward publishes these alone
            raise ValueError(f"taps {self.taps}: a target publishes layers {tap_layers(cfg.num_hidden_layers)}")
        if self.taps:  # starts as "read the final state only": the taps' columns zero
            self.fuse_w = nn.Parameter(torch.cat((torch.zeros(d, len(self.taps) * d, dtype=dt), eye), 1))

        def copy(m: nn.Module) -> nn.Parameter:
            return nn.Parameter(m.weight.detach().clone())

        a, m = src.self_attn, src.mlp
        self.in_norm = copy(src.input_layernorm)
        self.q, self.k, self.v, self.o = copy(a.q_proj), copy(a.k_proj), copy(a.v_proj), copy(a.o_proj)
        self.post_norm = copy(src.post_attention_layernorm)
        self.gate, self.up, self.down = copy(m.gate_proj), copy(m.up_proj), copy(m.down_proj)
        # frozen, the target's own (buffers: not trained, not saved by `save`)
        self.register_buffer("embed", target.get_input_embeddings().weight.detach(), persistent=False)
        self.register_buffer("norm", inner.norm.weight.detach(), persistent=False)
        subset = torch.as_tensor(subset, dtype=torch.long).flatten()
        self.register_buffer("subset", subset, persistent=False)
        # [S, d] stored column-major: a few rows' x·headᵀ is then a plain GEMM over a row-major [d, S], which MKL
        # reads 2-3x faster than the transposed one (measured 0.58 vs 1.5 ms for one row over 8192 rows, 2 cores)
        self.register_buffer("head", target.lm_head.weight.detach()[subset].t().contiguous().t(), persistent=False)
        self.register_buffer("inv_freq", inner.rotary_emb.inv_freq.detach().float().clone(), persistent=False)
        self.vocab = int(target.lm_head.weight.shape[0])

    # ------------------------------------------------------------------ pieces
    def reduce(self, f: torch.Tensor) -> torch.Tensor:
        """A target state [.., d·(taps + 1)] -> [.., d] (`fuse`); a state of width d (its own prediction) as it is."""
        return f if f.shape[-1] == self.d else F.linear(f, self.fuse_w) if self.taps else f[..., -self.d :]

    def inputs(self, f_prev: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """States at i-1 [.., d] or the target's [.., d·(taps + 1)], tokens [..] at i -> layer inputs [.., d]."""
        x = torch.cat((self.reduce(f_prev), F.embedding(tokens, self.embed)), -1)
        return F.linear(x, self.fc_w if torch.is_grad_enabled() else self.joint_weights()[4], self.fc_b)

    def _joined(self) -> tuple[torch.Tensor, ...]:
        """[q; k; v], [gate; up], o, down and fc: the weights a pass multiplies by."""
        return torch.cat((self.q, self.k, self.v)), torch.cat((self.gate, self.up)), self.o, self.down, self.fc_w

    def joint_weights(self) -> tuple[torch.Tensor, ...]:
        """`_joined` without gradients, stored column-major (as `head`), rebuilt when a weight changes."""
        parts = (self.q, self.k, self.v, self.gate, self.up, self.o, self.down, self.fc_w)
        key = tuple((p.data_ptr(), p._version) for p in parts)
        if getattr(self, "_fused_key", None) != key:
            with torch.no_grad():
                self._fused_w = tuple(w.t().contiguous().t() for w in self._joined())
            self._fused_key = key
        return self._fused_w

    def weights(self) -> Weights:
        """The draft as a one-layer core model over the target's rotary table and norm (input rows: `inputs`); its
        layer multiplies by `joint_weights` without gradients, by `_joined` with them."""
        qkv, gate_up, o, down = (self._joined() if torch.is_grad_enabled() else self.joint_weights())[:4]
        layer = Layer(
            self.in_norm, Dense(qkv, None), Dense(o, None), self.post_norm, Dense(gate_up, None), Dense(down, None)
        )
        return Weights(
            layers=[layer],
            embed=self.embed,
            norm=self.norm,
            head=self.logits_subset,
            eps=self.eps,
            n_heads=self.n_heads,
            n_kv=self.n_kv,
            head_dim=self.head_dim,
            inv_freq=self.inv_freq,
            rope_scale=1.0,
            window=None,
            dtype=self.norm.dtype,
        )

    def logits_subset(self, f: torch.Tensor) -> torch.Tensor:
        """Normed states [.., d] -> logits over the subset [.., S]."""
        return F.linear(f, self.head)

    # ------------------------------------------------------------------ training
    def forward_train(self, f_prev: torch.Tensor, tokens: torch.Tensor, passes: int = 1) -> list[torch.Tensor]:
        """f_prev [B, T, d·(taps + 1)] (row i: the target's state at i-1; row 0 zeros), tokens [B, T] -> each pass's
        predicted states [B, T, d] (pass s: s tokens drafted ahead, over keys of every pass so far)."""
        B, T, _ = f_prev.shape
        w = self.weights()
        cos, sin = rope_table(self.inv_freq, T, f_prev.dtype)  # [T, D] each
        c, s_ = cos[:, None], sin[:, None]  # [T, 1, D]
        ks, vs, outs, f_in = [], [], [], f_prev
        idx = torch.arange(T)
        for s in range(passes):
            x = self.inputs(f_in, tokens)  # [B, T, d]
            q, k, v = project(w.layers[0], x, c, s_, w)  # [B, H, T, D], [B, H_kv, T, D] ×2
            ks.append(k)
            vs.append(v)
            # pass s (0-based) row j sees pass-0 keys at rows ≤ j-s and pass-r key at row j-s+r (r = 1..s)
            blocks = [idx[None] <= (idx[:, None] - s)]
            blocks += [idx[None] == (idx[:, None] - s + r) for r in range(1, s + 1)]
            mask = torch.cat(blocks, 1)  # [T, (s+1)·T]
            mask[:, 0] |= ~mask.any(1)  # rows with nothing to see (j < s): keep softmax finite, masked from loss
            att = F.scaled_dot_product_attention(
                q, torch.cat(ks, 2), torch.cat(vs, 2), attn_mask=mask, enable_gqa=self.n_heads != self.n_kv
            )  # [B, H, T, D]
            out = _rms(finish(w.layers[0], x, att, self.eps), self.norm, self.eps)
            outs.append(out)
            # next pass: row i reads the state this pass predicted for row i-1
            f_in = torch.cat((torch.zeros_like(out[:, :1]), out[:, :-1]), 1)
        return outs

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path, meta: dict | None = None) -> int:
        """The trained tensors (fc, the layer; fp16) and `meta` to `path`; returns the file size."""
        m = {"format": FORMAT, "n_subset": str(self.subset.numel()), "taps": ",".join(map(str, self.taps))}
        m.update({k: str(v) for k, v in (meta or {}).items()})
        state = {k: v.detach().to(torch.float16).contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(path), metadata=m)
        return Path(path).stat().st_size

    def load(self, path: str | Path) -> FeatureDraft:
        with safe_open(str(path), "pt") as fh:
            meta = fh.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"{path} is not a feature draft ({meta.get('format')!r})")
            sd = {k: fh.get_tensor(k) for k in fh.keys()}
        missing, unexpected = self.load_state_dict({k: v.to(self.norm.dtype) for k, v in sd.items()}, strict=False)
        if unexpected or set(missing) - {"fuse_w"}:  # a file without taps may start a draft with them
            raise ValueError(f"{path} does not fit this draft: missing {missing}, unexpected {unexpected}")
        return self


# ---------------------------------------------------------------------- the shipped one (offline family)
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
SUBSET_FORMAT = "pyramid-vocab-subset-v1"


def weight_path(weights_dir: str | Path | None = None) -> Path:
    return Path(weights_dir or WEIGHTS_DIR) / "feature_draft.safetensors"


def subset_path(weights_dir: str | Path | None = None) -> Path:
    """The ranked token subset the draft's head computes (FR-Spec, arXiv 2502.14856; `python -m training`)."""
    return Path(weights_dir or WEIGHTS_DIR) / "vocab.safetensors"


def save_subset(path: str | Path, ids: torch.Tensor, meta: dict) -> int:
    """Write the ranked ids (int32) with `meta` (json values); returns the file size."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    md = {"format": SUBSET_FORMAT, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}}
    save_file({"ids": ids.to(torch.int32).contiguous()}, str(path), metadata=md)
    return path.stat().st_size


def load_subset(path: str | Path) -> tuple[torch.Tensor, dict]:
    """The ranked ids (LongTensor [N]) and their metadata."""
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        ids = f.get_tensor("ids").long()
    if meta.get("format") != SUBSET_FORMAT:
        raise ValueError(f"{path}: not a {SUBSET_FORMAT} file")
    return ids, meta


def subset_ids(weights_dir: str | Path | None = None) -> torch.Tensor:
    """The shipped ranking's ids, most frequent first."""
    return load_subset(subset_path(weights_dir))[0]


def available(weights_dir: str | Path | None = None) -> bool:
    return weight_path(weights_dir).is_file()


def file_taps(path: str | Path) -> tuple[int, ...]:
    """The target layers a saved draft reads beside the final state (its metadata's `taps`)."""
    with safe_open(str(path), "pt") as fh:
        taps = (fh.metadata() or {}).get("taps", "")
    return tuple(int(t) for t in taps.split(",") if t)


def build(target: nn.Module, weights_dir: str | Path | None = None) -> FeatureDraft:
    """The shipped feature draft over `target` (SmolLM2-135M-Instruct), in its dtype, on the shipped subset."""
    path = weight_path(weights_dir)
    return FeatureDraft(target, subset_ids(weights_dir), taps=file_taps(path)).load(path).eval()
