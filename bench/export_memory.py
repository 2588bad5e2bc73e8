#!/usr/bin/env python3
"""Peak memory of `varuna-ckpt export --format hf` on a 1B-parameter-shaped Llama.

Writes a complete checkpoint in the system's layout (docs/checkpoints.md: common.json, one
layer file per layer holding parameters *and* AdamW state, manifest with CRC-32, marker) for
TinyLlama-1.1B's shape (hidden 2048, intermediate 5632, 22 layers, 32 heads, 4 KV heads,
vocab 32000) with random fp32 weights and zero moments, then runs the export and reads its
peak resident memory (GNU time's %M: the child's maximum RSS). The baseline is the same
binary's peak on `varuna-ckpt list` (LibTorch loaded, nothing exported). Reported: largest
layer (its parameters in the output dtype), peak, peak - baseline, and their ratios; the
target is peak - baseline under 2x the largest layer.

Usage: bench/export_memory.py [--dir DIR] [--bin build/bin] [--dtype fp32|bf16]
       [--layers 22] [--keep]
The checkpoint takes ~13 GB of disk (parameters + two AdamW moments) and the export 4.4 GB.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zlib

import torch

SHAPE = dict(hidden=2048, ffn=5632, heads=32, kv=4, vocab=32000, seq_len=2048)


def layer_params(name, s):
    d, f, kvd = s["hidden"], s["ffn"], s["kv"] * (s["hidden"] // s["heads"])
    if name == "model.embed_tokens" or name == "lm_head":
        return {"weight": (s["vocab"], d)}
    if name == "model.norm":
        return {"weight": (d,)}
    return {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
            "self_attn.q_proj.weight": (d, d), "self_attn.k_proj.weight": (kvd, d),
            "self_attn.v_proj.weight": (kvd, d), "self_attn.o_proj.weight": (d, d),
            "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
            "mlp.down_proj.weight": (d, f)}


def write_checkpoint(root, layers):
    s = SHAPE
    names = (["model.embed_tokens"] + [f"model.layers.{i}" for i in range(layers)] +
             ["model.norm", "lm_head"])
    ck = os.path.join(root, "varuna_ckpt_1")
    os.makedirs(os.path.join(ck, "layers"), exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    files, total = [], 0
    for name in names:
        d = {}
        for key, shape in layer_params(name, s).items():
            p = torch.randn(shape, generator=gen) * 0.02
            total += p.numel()
            d["param." + key] = p
            d[f"opt.{key}.step"] = torch.tensor(1)
            d[f"opt.{key}.exp_avg"] = torch.zeros(shape)
            d[f"opt.{key}.exp_avg_sq"] = torch.zeros(shape)
        rel = f"layers/{name}.pt"
        torch.save(d, os.path.join(ck, rel))
        del d
        crc, size = 0, 0
        with open(os.path.join(ck, rel), "rb") as f:
            while chunk := f.read(1 << 24):
                crc = zlib.crc32(chunk, crc)
                size += len(chunk)
        files.append({"path": rel, "size": size, "crc32": crc})
    line = (f"kind=llama layers={layers} d_model={s['hidden']} heads={s['heads']} "
            f"seq_len={s['seq_len']} vocab={s['vocab']} kv_heads={s['kv']} ffn={s['ffn']} "
            f"norm_eps=1e-05 rope_theta=10000 tie=0 max_positions=2048 path=")
    common = {"format": 1, "step": 1, "global_batch": 8, "stages": 1, "replicas": 1,
              "world": 1, "loss_scale": 1, "clean_steps": 0, "writers": [0], "layers": names,
              "model_spec": line}
    text = json.dumps(common).encode()
    with open(os.path.join(ck, "common.json"), "wb") as f:
        f.write(text)
    files.append({"path": "common.json", "size": len(text), "crc32": zlib.crc32(text)})
    with open(os.path.join(ck, "manifest.rank0.json"), "w") as f:
        json.dump({"files": files}, f)
    open(os.path.join(ck, "complete.rank0"), "w").close()
    return total


def peak_of(cmd):
    """Runs cmd under GNU time; returns (peak RSS bytes, wall s, CPU s, stdout). GNU time's
    own child is measured, not a fork of this (large) Python process."""
    t0 = time.time()
    r = subprocess.run(["/usr/bin/time", "-f", "TIME %M %U %S"] + cmd, capture_output=True,
                       text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr}")
    line = [x for x in r.stderr.splitlines() if x.startswith("TIME ")][-1].split()
    return int(line[1]) * 1024, wall, float(line[2]) + float(line[3]), r.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/varuna-export-bench")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin"))
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    tool = os.path.join(a.bin, "varuna-ckpt")
    ckpt, out = os.path.join(a.dir, "ckpt"), os.path.join(a.dir, "hf")
    shutil.rmtree(a.dir, ignore_errors=True)
    t0 = time.time()
    params = write_checkpoint(ckpt, a.layers)
    print(f"checkpoint: {params / 1e9:.3f} B parameters, written in {time.time() - t0:.0f} s")
    base, _, _, _ = peak_of([tool, "list", ckpt])
    peak, wall, cpu, text = peak_of([tool, "export", ckpt, "--format", "hf", "--out", out,
                                     "--dtype", a.dtype])
    print(text)
    item = 4 if a.dtype == "fp32" else 2
    largest = max(
        sum(torch.Size(s).numel() for s in layer_params(n, SHAPE).values())
        for n in ["model.embed_tokens", "model.layers.0", "lm_head"]) * item
    print(f"| model | params | dtype | largest layer MB | baseline RSS MB | peak RSS MB | "
          f"peak - baseline MB | (peak - baseline) / largest | peak / largest | wall s | CPU s |")
    print(f"| llama 1.1B shape ({a.layers} layers) | {params / 1e9:.2f} B | {a.dtype} | "
          f"{largest / 1e6:.0f} | {base / 1e6:.0f} | {peak / 1e6:.0f} | {(peak - base) / 1e6:.0f}"
          f" | {(peak - base) / largest:.2f} | {peak / largest:.2f} | {wall:.0f} | {cpu:.0f} |")
    if not a.keep:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
