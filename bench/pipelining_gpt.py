#!/usr/bin/env python3
"""One rank of the GPT of worker/models/gpt.cc trained with torch.distributed.pipelining.

The peer for pipeline schedules (bench (q), bench/pipelining_vs_varuna.py): bench/ddp_gpt.py's
model (same initial weights, same samples, same loss), cut into stages by layer ranges and run
by PyTorch's own `PipelineStage` and schedules, as its documentation sets them up: one process
per rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment), gloo, the whole batch
given to `schedule.step` and split into micro-batches by the schedule, `loss_fn` on the last
stage, the gradients scaled by the number of micro-batches (its default).

Schedules (--schedule):
  gpipe  ScheduleGPipe, one stage per rank
  1f1b   Schedule1F1B, one stage per rank
  zb     ScheduleInterleavedZeroBubble with one stage per rank (ZB-H1's shape)
  zbv    ScheduleZBVZeroBubble: two stages per rank in a V (rank r holds stages r and 2P-1-r),
         the same blocks per rank as one stage per rank
  i1f1b  ScheduleInterleaved1F1B: two stages per rank (r and r+P)

What the C++ engine does after its pipeline, done here too so the step is the same work: the
tied embedding / LM-head gradients summed between the two ranks that hold them, the gradient
norm over all ranks (one all-reduce) and the clip, AdamW.

Per step each rank writes {step, at, pipeline_s, recv_wait_s, step_time_s, loss} (at: the wall
time of the step's end, as varuna-worker's metrics): pipeline_s is
`schedule.step`, recv_wait_s the time spent in the schedule's waits on its point-to-point
operations (wrapped `schedules._wait_batch_p2p`), the same split as varuna-worker's metrics.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_gpt import Gpt, TokenDataset  # noqa: E402

WAITED = [0.0]
_wait = schedules._wait_batch_p2p


def _timed_wait(work):
    t0 = time.perf_counter()
    try:
        return _wait(work)
    finally:
        WAITED[0] += time.perf_counter() - t0


schedules._wait_batch_p2p = _timed_wait

# 2.11's first step warms each stage's neighbours with one send and receive each way, also
# where the neighbour stage is on the same rank (a V schedule's turn), and gloo refuses a
# rank's send to itself. Those warm-up operations are dropped; the schedule itself hands
# such activations over in memory.
_init_ops = PipelineStage._get_init_p2p_neighbors_ops


def _init_ops_without_self(self):
    return [op for op in _init_ops(self) if op.peer != dist.get_rank()]


PipelineStage._get_init_p2p_neighbors_ops = _init_ops_without_self


class StageModule(nn.Module):
    """Layers [lo, hi) of [embed, block 0 .. block L-1, head]; the head holds its own copy of
    the embedding weight where the embedding lives on another stage (tied, gradients summed)."""

    def __init__(self, model, lo, hi, layers):
        super().__init__()
        self.embed = model.embed if lo == 0 else None
        self.blocks = nn.ModuleList(model.blocks[max(lo, 1) - 1:min(hi, layers + 1) - 1])
        self.has_head = hi == layers + 2
        if self.has_head:
            self.ln_f = model.head.ln_f
            self.lm_head = model.embed.wte if lo == 0 else nn.Parameter(
                model.embed.wte.detach().clone())

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        if self.has_head:
            x = torch.matmul(self.ln_f(x), self.lm_head.t())
        return x


def loss_fn(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))


def stage_ranges(layers, stages):
    """Blocks split evenly over `stages`, the embedding before the first, the head after the
    last; as layer-list ranges [lo, hi)."""
    cuts = [0] + [1 + layers * s // stages for s in range(1, stages)] + [layers + 2]
    return list(zip(cuts[:-1], cuts[1:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "zb", "zbv", "i1f1b"])
    ap.add_argument("--micro_batches", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d_model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--global_batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip_grad_norm", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--metrics_out", default="", help="this rank's file: PATH.rank<R>")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = 2 if a.schedule in ("zbv", "i1f1b") else 1
    n_stages = world * per_rank
    if a.global_batch % a.micro_batches:
        raise SystemExit(f"global_batch={a.global_batch} is not divisible by "
                         f"{a.micro_batches} micro-batches")
    if a.layers < n_stages:
        raise SystemExit(f"{a.layers} blocks cannot fill {n_stages} stages")
    if a.schedule == "zbv":
        mine = [rank, n_stages - 1 - rank]
    else:
        mine = [rank + k * world for k in range(per_rank)]
    holder = {}
    for s in range(n_stages):
        r = s if s < world else (n_stages - 1 - s if a.schedule == "zbv" else s - world)
        holder[s] = r

    model = Gpt(a)  # every rank builds the whole model: the same initial weights everywhere
    model.train()
    ranges = stage_ranges(a.layers, n_stages)
    mods = {s: StageModule(model, *ranges[s], a.layers) for s in mine}
    # Shapes given, as the documentation allows, so no shape inference runs over the wire
    # (2.11's inference sends a V schedule's stage-to-stage hand-off within one rank to
    # itself, which gloo refuses).
    mb = a.global_batch // a.micro_batches
    hidden = torch.empty(mb, a.seq_len, a.d_model)

    def shapes(s):
        inp = torch.zeros(mb, a.seq_len, dtype=torch.long) if s == 0 else hidden
        return inp, (torch.empty(mb, a.seq_len, a.vocab) if s == n_stages - 1 else hidden)

    stages = [PipelineStage(mods[s], s, n_stages, torch.device("cpu"), *shapes(s))
              for s in mine]
    if a.schedule == "gpipe":
        sched = schedules.ScheduleGPipe(stages[0], a.micro_batches, loss_fn=loss_fn)
    elif a.schedule == "1f1b":
        sched = schedules.Schedule1F1B(stages[0], a.micro_batches, loss_fn=loss_fn)
    elif a.schedule == "zb":
        sched = schedules.ScheduleInterleavedZeroBubble(stages, a.micro_batches, loss_fn=loss_fn)
    elif a.schedule == "zbv":
        sched = schedules.ScheduleZBVZeroBubble(stages, a.micro_batches, loss_fn=loss_fn)
    else:
        sched = schedules.ScheduleInterleaved1F1B(stages, a.micro_batches, loss_fn=loss_fn)

    first, last = 0, n_stages - 1
    embed_rank, head_rank = holder[first], holder[last]
    tie = dist.new_group([embed_rank, head_rank]) if embed_rank != head_rank else None
    params = [p for m in mods.values() for p in m.parameters()]
    # The head's copy of the embedding counts once in the norm (its gradient equals the sum).
    head_copy = mods[last].lm_head if last in mods and first != last else None
    norm_params = [p for p in params if p is not head_copy]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)

    data = TokenDataset(a.data, a.seq_len, a.seed)
    out = open(f"{a.metrics_out}.rank{rank}", "w") if a.metrics_out else None
    B = a.global_batch
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        ids, labels = (t.contiguous() for t in data.batch((step - 1) * B, B))
        WAITED[0] = 0.0
        losses = []
        kwargs = {}
        if last in mods:
            kwargs = {"target": labels, "losses": losses}
        if first in mods:
            sched.step(ids, **kwargs)
        else:
            sched.step(**kwargs)
        pipe_s = time.perf_counter() - t0
        wait_s = WAITED[0]
        # The tied weight's two gradients summed (within a rank, or over the tie group).
        if tie is not None and rank in (embed_rank, head_rank):
            g = (mods[first].embed.wte if first in mods else mods[last].lm_head).grad
            dist.all_reduce(g, group=tie)
        elif first in mods and last in mods and first != last:
            g = mods[first].embed.wte.grad
            g += mods[last].lm_head.grad
            mods[last].lm_head.grad.copy_(g)
        sq = torch.zeros((), dtype=torch.float64)
        for p in norm_params:
            if p.grad is not None:
                sq += p.grad.detach().double().pow(2).sum()
        loss = torch.stack(losses).mean().double() if losses else torch.zeros((), dtype=torch.float64)
        both = torch.stack([sq, loss])
        dist.all_reduce(both)
        norm = both[0].sqrt().item()
        coef = a.clip_grad_norm / (norm + 1e-6)
        if coef < 1:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        opt.step()
        opt.zero_grad()
        dt = time.perf_counter() - t0
        if out:
            out.write(json.dumps({"step": step, "at": time.time(), "loss": both[1].item(),
                                  "grad_norm": norm,
                                  "pipeline_s": pipe_s, "recv_wait_s": wait_s,
                                  "step_time_s": dt, "samples_per_s": B / dt}) + "\n")
            out.flush()
        if rank == world - 1 and (step == 1 or step == a.steps):
            print(f"pipelining {a.schedule} step={step} loss={both[1].item():.6f} "
                  f"grad_norm={norm:.4f} step_time_s={dt:.3f}", flush=True)
    if out:
        out.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
