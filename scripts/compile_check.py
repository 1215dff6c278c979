"""Issue 33 items 1-3, measured before anything is built on it: does `torch.compile` (inductor's CPU backend, frozen
and prepacked weights) over a gpt-fast-style static cache give the offline target a faster one-token step, and a
k-token pass whose logits are bitwise those of one-token steps (what the probe would require of a target forward)?

A static forward over the lean weights (`core.lean.lean_weights`): a cache of T slots, every query row attending over
all T keys through an additive mask, so a step and a k-token pass each have one static shape (k = 1 and k = 5,
compiled once each). Prints the compile time of each shape, then, for the eager and the compiled forward alike,
whether a 5-token pass equals 5 one-token steps bitwise, whether compiled equals eager, and (idle machine only)
the median ms of each. Usage: PYTHONPATH=. python scripts/compile_check.py [reps] [threads] [--dtype bfloat16]
(compile takes minutes of CPU: run it with nice -n 19; timings on 2 shared cores are meaningless)."""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from pyramid_demo.core.lean import lean_weights, rms_norm
from pyramid_demo.core.packed import available as packed_available
from pyramid_demo.models.bundled import bundled_target
from pyramid_demo.models.probe import candidate_model

nums = [int(a) for a in sys.argv[1:] if a.isdigit()]
reps = nums[0] if nums else 20
if len(nums) > 1:
    torch.set_num_threads(nums[1])
dt = "bfloat16" if "--dtype" in sys.argv and sys.argv[sys.argv.index("--dtype") + 1] == "bfloat16" else "float32"
backend = "packed" if dt == "bfloat16" and packed_available(torch.bfloat16) else "default"
T, CONTEXT, K = 270, 100, 5  # 270 = 4·64 + 14: every thread's attention scratch aligned (`lean.scratch_pad`)
_, fp32 = bundled_target(torch.device("cpu"), torch.float32)
model, _ = candidate_model(fp32, dt, backend)
if dt == "bfloat16" and backend == "default":
    model = model.to(torch.bfloat16)
w = lean_weights(model)
vocab = fp32.config.vocab_size
rep, half = w.n_heads // w.n_kv, w.head_dim // 2
freqs = torch.arange(T, dtype=torch.float32)[:, None] * w.inv_freq[None]
emb = torch.cat((freqs, freqs), -1)
COS, SIN = (emb.cos() * w.rope_scale).to(w.dtype), (emb.sin() * w.rope_scale).to(w.dtype)
SIN = torch.cat((-SIN[:, :half], SIN[:, half:]), -1)  # [T, D]: rotate_half's sign folded in


def forward(tokens: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """tokens [n] at positions pos [n] (consecutive) into the static cache kv [L, 2, H_kv, T, D] -> logits [n, V]."""
    n = tokens.shape[0]
    cos, sin = COS[pos][:, None], SIN[pos][:, None]  # [n, 1, D]
    seen = torch.arange(T)[None] <= pos[:, None]  # [n, T]
    mask = torch.zeros(n, 1, 1, T, dtype=w.dtype).masked_fill(~seen[:, None, None], float("-inf"))
    x = F.embedding(tokens, w.embed)  # [n, d]
    for li, lay in enumerate(w.layers):
        qkv = lay.qkv(rms_norm(x, lay.attn_norm, w.eps))
        qk = qkv[:, : (w.n_heads + w.n_kv) * w.head_dim].view(n, w.n_heads + w.n_kv, w.head_dim)
        qk = qk * cos + torch.cat((qk[..., half:], qk[..., :half]), -1) * sin
        v = qkv[:, (w.n_heads + w.n_kv) * w.head_dim:].view(n, w.n_kv, w.head_dim)
        kv[li, 0].index_copy_(1, pos, qk[:, w.n_heads:].transpose(0, 1))
        kv[li, 1].index_copy_(1, pos, v.transpose(0, 1))
        k, vv = (kv[li, i][None].expand(n, -1, -1, -1) for i in (0, 1))  # [n, H_kv, T, D]
        q = qk[:, : w.n_heads].reshape(n, w.n_kv, rep, w.head_dim)
        att = F.scaled_dot_product_attention(q, k, vv, attn_mask=mask, scale=w.head_dim ** -0.5)
        x = x + lay.o(att.reshape(n, -1))
        gate, up = lay.gate_up(rms_norm(x, lay.mlp_norm, w.eps)).chunk(2, -1)
        x = x + lay.down(F.silu(gate) * up)
    return w.head(rms_norm(x, w.norm, w.eps))[:, :vocab].float()


ids = torch.tensor([(7919 * i + 11) % (vocab - 1) + 1 for i in range(CONTEXT + K)])


def run(fn):
    """Prefill eagerly, then K one-token steps and one K-token pass from the same cache: ([K, V], [K, V])."""
    kv = torch.zeros(len(w.layers), 2, w.n_kv, T, w.head_dim, dtype=w.dtype)
    with torch.inference_mode():
        forward(ids[:CONTEXT], torch.arange(CONTEXT), kv)
        steps = torch.cat([fn(ids[CONTEXT + i: CONTEXT + i + 1], torch.tensor([CONTEXT + i]), kv)
                           for i in range(K)])  # [K, V]
        kv[:, :, :, CONTEXT:] = 0
        return steps, fn(ids[CONTEXT: CONTEXT + K], torch.arange(CONTEXT, CONTEXT + K), kv)


eager = run(forward)
print(f"{dt}/{backend}, {torch.get_num_threads()} threads; eager: {K}-token pass bitwise its steps: "
      f"{torch.equal(*eager)} (max diff {(eager[0] - eager[1]).abs().max():.2g})", flush=True)
import torch._inductor.config as inductor_config  # noqa: E402

inductor_config.freezing = True
compiled = torch.compile(forward, dynamic=False)
t0 = time.perf_counter()
with torch.inference_mode():
    kv0 = torch.zeros(len(w.layers), 2, w.n_kv, T, w.head_dim, dtype=w.dtype)
    compiled(ids[:1], torch.tensor([CONTEXT]), kv0)
    t1 = time.perf_counter()
    compiled(ids[:K], torch.arange(CONTEXT, CONTEXT + K), kv0)
t2 = time.perf_counter()
print(f"compile: k=1 {t1 - t0:.0f} s, k={K} {t2 - t1:.0f} s", flush=True)
comp = run(compiled)
print(f"compiled: {K}-token pass bitwise its steps: {torch.equal(*comp)} "
      f"(max diff {(comp[0] - comp[1]).abs().max():.2g}); "
      f"steps bitwise eager's: {torch.equal(comp[0], eager[0])} (max diff {(comp[0] - eager[0]).abs().max():.2g})",
      flush=True)
times = {name: {1: [], K: []} for name in ("eager", "compiled")}
kv = torch.zeros(len(w.layers), 2, w.n_kv, T, w.head_dim, dtype=w.dtype)
with torch.inference_mode():
    for _ in range(reps):
        for name, fn in (("eager", forward), ("compiled", compiled)):
            for k in (1, K):
                s = time.perf_counter()
                fn(ids[:k], torch.arange(CONTEXT, CONTEXT + k), kv)
                times[name][k].append(1000 * (time.perf_counter() - s))
for name, row in times.items():
    print(f"{name}: " + ", ".join(f"k={k} median {statistics.median(v):.2f} ms (min {min(v):.2f})"
                                  for k, v in row.items()))
med = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in times.items()}
print(f"compiled ÷ eager (median): k=1 {med['compiled'][1] / med['eager'][1]:.3f}, "
      f"k={K} {med['compiled'][K] / med['eager'][K]:.3f}")
