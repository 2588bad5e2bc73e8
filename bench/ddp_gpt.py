#!/usr/bin/env python3
"""The GPT of worker/models/gpt.cc trained with plain PyTorch DistributedDataParallel (gloo, CPU).

The baseline a user would pick instead of varuna-worker for pure data parallelism: same model,
same initial weights, same data stream, same optimizer and clipping, same metrics format. Run
under the project environment's torchrun (scripts/python_env.sh; bench/ddp_vs_varuna.sh does this):

  $(dirname $(scripts/python_env.sh --path))/torchrun --standalone --nproc_per_node 2 \\
      --redirects 1 --tee 1 --log_dir /tmp/l bench/ddp_gpt.py --data corpus.txt --metrics_out m.jsonl

Equivalences with the C++ worker:
  * Init: torch.manual_seed(seed * 1000003 + layer_index) before building each layer (embed=0,
    blocks.i=1+i, head=L+1) and the same construction order and RNG draws (nn.Linear's default
    reset, then normal_(0, 0.02)), so initial weights are bit-identical to varuna-worker's.
  * Tied LM head: the C++ head holds a copy of the embedding and sums the two gradients; here the
    head truly shares the embedding tensor, which gives the same gradient and the same update.
  * Data: TokenDataset::Batch (SplitMix64 offsets, windows of seq_len+1 bytes); step s uses
    global samples [(s-1)*B, s*B) and replica r the slice [r*B/D, (r+1)*B/D).
  * Loss: each micro-batch's mean cross-entropy weighted by size/per_replica_batch; DDP averages
    over the D replicas, so the gradient is that of the global-batch mean (as in varuna-worker).
    The reported loss is the global mean (all-reduced, asynchronously, off the critical path).
  * AdamW(lr, betas, weight_decay only on dim>=2 params), constant LR, clip_grad_norm_(1.0).
  * step_time_s covers building the batch through the optimizer step; samples_per_s = B / it.
"""

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class TokenDataset:
    """worker/engine/data.cc TokenDataset for kind=text (one byte per token)."""

    def __init__(self, path, seq_len, seed):
        self.data = np.fromfile(path, dtype=np.uint8)
        self.seq_len = seq_len
        self.seed = seed & MASK64
        self.windows = len(self.data) - seq_len
        if self.windows < 1:
            raise ValueError(f"{path} has {len(self.data)} tokens; seq_len={seq_len} needs more")

    def batch(self, first, count):
        t = self.seq_len
        out = np.empty((count, t + 1), dtype=np.int64)
        base = (self.seed * 0x100000001B3) & MASK64
        for s in range(count):
            off = splitmix64(base ^ (first + s)) % self.windows
            out[s] = self.data[off:off + t + 1]
        out = torch.from_numpy(out)
        return out[:, :-1], out[:, 1:]


def make_linear(d_in, d_out):
    lin = nn.Linear(d_in, d_out)  # default reset (draws RNG exactly like torch::nn::Linear)
    with torch.no_grad():
        lin.weight.normal_(0, 0.02)
        lin.bias.zero_()
    return lin


class GptEmbedding(nn.Module):
    def __init__(self, vocab, seq_len, d, dropout):
        super().__init__()
        self.wte = nn.Parameter(torch.randn(vocab, d) * 0.02)
        self.wpe = nn.Parameter(torch.randn(seq_len, d) * 0.02)
        self.dropout = dropout

    def forward(self, ids):
        pos = torch.arange(ids.size(1), dtype=ids.dtype, device=ids.device)
        h = F.embedding(ids, self.wte) + F.embedding(pos, self.wpe).unsqueeze(0)
        return F.dropout(h, self.dropout, self.training)


class GptBlock(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1 = nn.LayerNorm(d)
        self.qkv = make_linear(d, 3 * d)
        self.proj = make_linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = make_linear(d, 4 * d)
        self.out = make_linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        p, train = self.dropout, self.training
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if hasattr(F, "scaled_dot_product_attention"):  # torch 2.x: fused, as the C++ worker
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p if train else 0.0,
                                               is_causal=True)
            y = y.transpose(1, 2).reshape(b, t, d)
            h = x + F.dropout(self.proj(y), p, train)
            return h + F.dropout(self.out(F.gelu(self.fc(self.ln2(h)))), p, train)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = F.dropout(torch.softmax(att.masked_fill(mask, float("-inf")), -1), p, train)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        h = x + F.dropout(self.proj(y), p, train)
        return h + F.dropout(self.out(F.gelu(self.fc(self.ln2(h)))), p, train)


class GptHead(nn.Module):
    def __init__(self, d, wte):
        super().__init__()
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = wte  # truly shared with the embedding (C++ keeps a tied copy)

    def forward(self, x, labels):
        logits = torch.matmul(self.ln_f(x), self.lm_head.t())
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        layer = 0

        def seed():  # Note [Init] in worker/models/model.h: one RNG stream per layer index
            nonlocal layer
            torch.manual_seed((a.seed * 1000003 + layer) & MASK64)
            layer += 1

        seed()
        self.embed = GptEmbedding(a.vocab, a.seq_len, a.d_model, a.dropout)
        blocks = []
        for _ in range(a.layers):
            seed()
            blocks.append(GptBlock(a.d_model, a.heads, a.dropout))
        self.blocks = nn.ModuleList(blocks)
        seed()
        self.head = GptHead(a.d_model, self.embed.wte)

    def forward(self, ids, labels):
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h, labels)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="text corpus (one byte per token)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d_model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--global_batch", type=int, default=32)
    ap.add_argument("--micro_batch", type=int, default=16,
                    help="samples per gradient-accumulation chunk (no_sync on all but the last)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--weight_decay", type=float, default=0.0)
    ap.add_argument("--clip_grad_norm", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    ap.add_argument("--metrics_out", default="")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.global_batch % world:
        raise SystemExit(f"global_batch={a.global_batch} is not divisible by {world} replicas")
    per_replica = a.global_batch // world
    chunk = max(1, min(a.micro_batch, per_replica))

    data = TokenDataset(a.data, a.seq_len, a.seed)
    model = Gpt(a)
    # The worker reseeds after building (dropout streams); mirror it for dropout > 0 runs.
    torch.manual_seed((a.seed * 7919 + 104729 * rank) & MASK64)
    model.train()
    ddp = DDP(model)  # default bucket_cap_mb=25 (the worker's bucket_bytes is 25 MiB too)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2))

    out = open(a.metrics_out, "w") if a.metrics_out and rank == 0 else None
    B = a.global_batch
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        ids, labels = data.batch((step - 1) * B + rank * per_replica, per_replica)
        loss_sum = torch.zeros((), dtype=torch.float64)
        starts = list(range(0, per_replica, chunk))
        for i, s in enumerate(starts):
            n = min(chunk, per_replica - s)
            # Mean over this replica's samples; DDP's average over replicas makes it global.
            if i + 1 < len(starts):
                with ddp.no_sync():
                    loss = ddp(ids[s:s + n], labels[s:s + n]) * (n / per_replica)
                    loss.backward()
            else:
                loss = ddp(ids[s:s + n], labels[s:s + n]) * (n / per_replica)
                loss.backward()
            loss_sum += loss.detach().double()
        loss_sum /= world
        loss_work = dist.all_reduce(loss_sum, async_op=True)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad_norm))
        opt.step()
        opt.zero_grad()
        loss_work.wait()
        dt = time.perf_counter() - t0
        if out:
            out.write(json.dumps({"step": step, "loss": loss_sum.item(), "grad_norm": grad_norm,
                                  "lr": a.lr, "step_time_s": dt, "samples_per_s": B / dt,
                                  "tokens_per_s": B * a.seq_len / dt}) + "\n")
            out.flush()
        if rank == 0 and (step == 1 or step % 10 == 0 or step == a.steps):
            print(f"ddp step={step} loss={loss_sum.item():.4f} grad_norm={grad_norm:.3f} "
                  f"step_time_s={dt:.3f}", flush=True)
    if out:
        out.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
