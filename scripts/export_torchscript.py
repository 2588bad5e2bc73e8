#!/usr/bin/env python3
"""Exports a small GPT-like model as TorchScript segments for varuna-worker.

    scripts/python scripts/export_torchscript.py --out /tmp/gpt_ts --layers 2 --d_model 32 \
        --heads 4 --seq_len 16 --vocab 256

writes /tmp/gpt_ts/segment_0.pt (embedding), segment_1.pt .. segment_N.pt (one pre-LN
transformer block each) and segment_<N+1>.pt (final LayerNorm, LM head, cross-entropy). Train it
with a job spec containing

    model: {kind: torchscript, path: /tmp/gpt_ts, seq_len: 16, vocab: 256}

Writing your own segments: put files segment_0.pt, segment_1.pt, ... (consecutive, from 0) in
one directory. Each is a torch.jit.script-ed nn.Module (saved with torch.jit.save) with

    def forward(self, x: Tensor, input_ids: Tensor, labels: Tensor) -> Tensor

input_ids and labels are int64 [B, T] and reach every segment. The first segment gets
x == input_ids and should ignore x; every other segment gets the previous segment's output
(e.g. float [B, T, d]). The last segment returns the scalar loss: the mean over its micro-batch.
Tensors between segments may differ between micro-batches only in their batch dimensions
(size B). Use self.training for dropout: the worker calls train()/eval() on each segment.
Segments are the unit of pipeline partitioning: stages get consecutive segments, balanced by
parameter count, and each stage loads only its own. Parameters keep their values from the file
(the worker does not re-initialise them); in checkpoints they are named
"segment_<i>.<name with '.' replaced by '_'>". Weights cannot be tied across segments.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class Embedding(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d: int, dropout: float):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, input_ids: Tensor, labels: Tensor) -> Tensor:
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        return self.drop(self.wte(input_ids) + self.wpe(pos).unsqueeze(0))


class Block(nn.Module):
    """Pre-LN transformer block: h = x + attn(ln1(x)); h + mlp(ln2(h)), causal attention."""

    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, input_ids: Tensor, labels: Tensor) -> Tensor:
        b, t, d = x.size(0), x.size(1), x.size(2)
        hd = d // self.heads
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        att = torch.matmul(q, k.transpose(-2, -1)) * (hd ** -0.5)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = self.drop(torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1))
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        h = x + self.drop(self.proj(y))
        return h + self.drop(self.out(F.gelu(self.fc(self.ln2(h)))))


class Head(nn.Module):
    def __init__(self, vocab: int, d: int):
        super().__init__()
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, x: Tensor, input_ids: Tensor, labels: Tensor) -> Tensor:
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def gpt2_init(m: nn.Module):
    for mod in m.modules():
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            nn.init.normal_(mod.weight, 0.0, 0.02)
        if isinstance(mod, nn.Linear):
            nn.init.zeros_(mod.bias)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        sys.exit(f"export_torchscript.py: error: {message}")


def main():
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for segment_<i>.pt")
    for name in ["layers", "d_model", "heads", "seq_len", "vocab"]:
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for name in ["layers", "d_model", "heads", "seq_len"]:
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.vocab < 2:
        p.error(f"--vocab must be >= 2, got {a.vocab}")
    if a.d_model % a.heads:
        p.error(f"--heads ({a.heads}) must divide --d_model ({a.d_model})")
    if not 0 <= a.dropout < 1:
        p.error(f"--dropout must be in [0, 1), got {a.dropout}")
    try:
        os.makedirs(a.out, exist_ok=True)
        if not os.access(a.out, os.W_OK):
            raise PermissionError("not writable")
    except OSError as e:
        p.error(f"--out '{a.out}' is not a writable directory: {e.strerror or e}")

    torch.manual_seed(a.seed)
    segments = ([("embedding", Embedding(a.vocab, a.seq_len, a.d_model, a.dropout))] +
                [(f"block {i}", Block(a.d_model, a.heads, a.dropout)) for i in range(a.layers)] +
                [("ln_f + lm_head + loss", Head(a.vocab, a.d_model))])
    for _, m in segments:
        gpt2_init(m)
    scripted = [torch.jit.script(m) for _, m in segments]
    for i, ((what, m), s) in enumerate(zip(segments, scripted)):
        path = os.path.join(a.out, f"segment_{i}.pt")
        try:
            torch.jit.save(s, path)
        except (OSError, RuntimeError) as e:
            p.error(f"cannot write {path}: {str(e).strip().splitlines()[0]}")
        print(f"wrote {path}: {what}, {sum(t.numel() for t in m.parameters())} parameters")
    # A longer export left in the same directory would be picked up: remove its extra segments.
    i = len(segments)
    while os.path.exists(os.path.join(a.out, f"segment_{i}.pt")):
        os.remove(os.path.join(a.out, f"segment_{i}.pt"))
        print(f"removed stale {os.path.join(a.out, f'segment_{i}.pt')}")
        i += 1

    # Smoke test of the chain, as the worker runs it: loss on random tokens (~ln(vocab)).
    ids = torch.randint(a.vocab, (2, a.seq_len))
    with torch.no_grad():
        h = ids
        for s in scripted:
            h = s.eval()(h, ids, ids)
    print(f"{len(segments)} segments; loss on random tokens {h.item():.3f} "
          f"(ln(vocab) = {torch.log(torch.tensor(float(a.vocab))).item():.3f})")


if __name__ == "__main__":
    main()
