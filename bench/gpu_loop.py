#!/usr/bin/env python3
"""The baseline of bench/gpu_mfu.sh: the GPT of worker/models/model.cc trained by a plain PyTorch loop
on one GPU (bench/ddp_gpt.py's model: fused attention on torch 2.x, tied LM head), bf16
autocast, AdamW, gradient clipping 1.0, random token batches already on the GPU.

Prints one JSON line: parameters N (the tied embedding counted once), samples/s, tokens/s and
MFU = 6 * N * tokens/s / peak, the peak being the GPU's dense bf16 rate (--peak_tflops,
989 for an H100 SXM / H200), and mfu_attn, the same with attention's FLOPs counted too
(6 * N + 12 * layers * seq_len * d_model per token, as torchtitan counts them). With --compile
the model goes through torch.compile first. --device cpu (tests/gpu/device_check.sh --dry-run)
runs the same loop on the CPU (CPU bf16 autocast, unfused AdamW); its MFU is null there, and
null too when --peak_tflops is 0.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_gpt import Gpt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d_model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq_len", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--peak_tflops", type=float, default=989.0)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True

    def sync():
        if cuda:
            torch.cuda.synchronize()

    model = Gpt(a).to(dev)
    n_params = sum(p.numel() for p in model.parameters())  # shared wte counted once
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), fused=cuda)
    step_fn = torch.compile(model) if a.compile else model
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)
    times = []
    for step in range(a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), device=dev, generator=g)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = step_fn(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times[a.skip:])
    tokens = a.batch * a.seq_len / t
    flops_6n = 6 * n_params
    flops_attn = flops_6n + 12 * a.layers * a.seq_len * a.d_model
    peak = a.peak_tflops * 1e12 if cuda and a.peak_tflops > 0 else 0
    print(json.dumps({
        "system": "pytorch-compile" if a.compile else "pytorch-eager",
        "params": n_params, "batch": a.batch, "seq_len": a.seq_len,
        "step_s": t, "samples_per_s": a.batch / t, "tokens_per_s": tokens,
        "mfu": flops_6n * tokens / peak if peak else None,
        "mfu_attn": flops_attn * tokens / peak if peak else None,
        "flops_per_token_6n": flops_6n, "flops_per_token_attn": flops_attn,
        "layers": a.layers, "d_model": a.d_model,
        "peak_tflops": a.peak_tflops if peak else None,
        "gpu": torch.cuda.get_device_name(0) if cuda else "cpu (no GPU: dry run)",
        "torch": torch.__version__, "last_loss": float(loss)}))


if __name__ == "__main__":
    main()
