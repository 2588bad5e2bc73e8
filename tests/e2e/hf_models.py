"""Independent safetensors I/O, random Hugging Face model dirs and a reference forward.

Only torch and the standard library. CLI: hf_models.py golden OUT | make --kind llama|gpt2
--out DIR --config JSON [--seed N] [--dtype D] [--shard_bytes N] | loss --dir DIR --tokens FILE
--seq_len N [--dtype uint16|uint32] | compare A_DIR B_DIR
"""

import argparse
import array
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

assert sys.byteorder == "little", "safetensors I/O here assumes a little-endian host"


def tensor_bytes(t):
    """Raw little-endian bytes of a tensor (no numpy; works for bf16 in torch 1.13)."""
    x = t.detach().contiguous().reshape(-1)
    buf = bytearray(x.numel() * x.element_size())
    if buf:
        torch.frombuffer(buf, dtype=torch.uint8).copy_(x.view(torch.uint8))
    return bytes(buf)


def write_safetensors(path, tensors, metadata=None):
    """Write name -> tensor (in the given order) as a safetensors file."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-(8 + len(h))) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path, with_metadata=False):
    """Read a safetensors file -> dict name -> tensor (dtype and shape as stored)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header, start, out = json.loads(data[8:8 + n].decode("utf-8")), 8 + n, {}
    meta = header.pop("__metadata__", None)
    for name, info in header.items():
        dtype, shape = DTYPES[info["dtype"]], info["shape"]
        b, e = info["data_offsets"]
        numel = math.prod(shape)
        size = torch.empty((), dtype=dtype).element_size()
        if e - b != numel * size or start + e > len(data):
            raise ValueError(f"{path}: bad data_offsets for {name}")
        chunk = bytearray(data[start + b:start + e])  # a copy: aligned and writable
        out[name] = (torch.frombuffer(chunk, dtype=dtype).clone().reshape(shape) if numel
                     else torch.empty(shape, dtype=dtype))
    return (out, meta) if with_metadata else out


def golden(path):
    """Write the fixed golden safetensors file used to cross-check the C++ reader/writer."""
    t = {
        "a.f32": torch.tensor([0.5, -1.25, 3.0, 1e-3, -0.0, 65504.0]).reshape(2, 3),
        "b.bf16": torch.tensor([1.0, -2.5, 0.15625, 3.0e38]).to(torch.bfloat16),
        "c.f16": torch.tensor([1.0, -0.5, 0.099975586, 65504.0]).to(torch.float16).reshape(2, 2),
        "d.scalar": torch.tensor(7.0),
        "e.empty": torch.zeros(0),
    }
    write_safetensors(path, t, {"format": "pt", "made_by": "tests/e2e/hf_models.py"})


LLAMA_DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                  "max_position_embeddings": 2048}
GPT2_DEFAULTS = {"n_positions": 1024, "layer_norm_epsilon": 1e-5}


def make_config(kind, cfg, dtype=torch.float32):
    """Full Hugging Face config.json dict for kind 'llama' or 'gpt2' from the given fields."""
    dname = {v: k for k, v in TORCH_DTYPES.items()}[dtype]
    if kind == "llama":
        c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
             "torch_dtype": dname, "attention_bias": False, "rope_scaling": None,
             **LLAMA_DEFAULTS, **cfg}
        c.setdefault("num_key_value_heads", c["num_attention_heads"])
        return c
    if kind == "gpt2":
        c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
             "activation_function": "gelu_new", "n_inner": None, "tie_word_embeddings": True,
             "torch_dtype": dname, **GPT2_DEFAULTS, **cfg}
        c.setdefault("n_ctx", c["n_positions"])
        return c
    raise ValueError(f"unknown kind {kind!r}")


def weight_shapes(cfg):
    """name -> (shape, init); init 'w', 'b': N(0, 0.02), 'n' (norm weight): 1 + N(0, 0.1)."""
    s = {}
    if cfg["model_type"] == "llama":
        d, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        nh, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = d // nh
        s["model.embed_tokens.weight"] = ([v, d], "w")
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = ([d], "n")
            s[p + "post_attention_layernorm.weight"] = ([d], "n")
            attn = {"q": [nh * hd, d], "k": [kv * hd, d], "v": [kv * hd, d], "o": [d, nh * hd]}
            for mod, shape in attn.items():
                s[f"{p}self_attn.{mod}_proj.weight"] = (shape, "w")
            for mod, shape in {"gate": [inter, d], "up": [inter, d], "down": [d, inter]}.items():
                s[f"{p}mlp.{mod}_proj.weight"] = (shape, "w")
        s["model.norm.weight"] = ([d], "n")
        if not cfg["tie_word_embeddings"]:
            s["lm_head.weight"] = ([v, d], "w")
    else:
        d, v = cfg["n_embd"], cfg["vocab_size"]
        s["transformer.wte.weight"] = ([v, d], "w")
        s["transformer.wpe.weight"] = ([cfg["n_positions"], d], "w")
        for i in range(cfg["n_layer"]):
            p = f"transformer.h.{i}."
            for ln in ("ln_1", "ln_2"):
                s[p + ln + ".weight"], s[p + ln + ".bias"] = ([d], "n"), ([d], "b")
            for mod, din, dout in (("attn.c_attn", d, 3 * d), ("attn.c_proj", d, d),
                                   ("mlp.c_fc", d, 4 * d), ("mlp.c_proj", 4 * d, d)):
                s[p + mod + ".weight"], s[p + mod + ".bias"] = ([din, dout], "w"), ([dout], "b")
        s["transformer.ln_f.weight"], s["transformer.ln_f.bias"] = ([d], "n"), ([d], "b")
    return s


def random_weights(cfg, seed=0, dtype=torch.float32):
    """Random weights, generated in float32 in sorted name order from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, init) in sorted(weight_shapes(cfg).items()):
        x = torch.randn(shape, generator=g, dtype=torch.float32)
        x = 1.0 + 0.1 * x if init == "n" else 0.02 * x
        out[name] = x.to(dtype)
    return out


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_weights(out_dir, tensors, shard_bytes=None):
    """Write tensors (sorted by name) as model.safetensors, or greedy shards plus an index."""
    nbytes = {n: t.numel() * t.element_size() for n, t in tensors.items()}
    shards, cur_bytes = [[]], 0
    for n in sorted(tensors):
        if shard_bytes and shards[-1] and cur_bytes + nbytes[n] > shard_bytes:
            shards.append([])
            cur_bytes = 0
        shards[-1].append(n)
        cur_bytes += nbytes[n]
    weight_map = {}
    for i, group in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        fname = fname if shard_bytes else "model.safetensors"
        write_safetensors(os.path.join(out_dir, fname), {n: tensors[n] for n in group},
                          {"format": "pt"})
        weight_map.update((n, fname) for n in group)
    if shard_bytes:
        index = {"metadata": {"total_size": sum(nbytes.values())}, "weight_map": weight_map}
        write_json(os.path.join(out_dir, "model.safetensors.index.json"), index)


def write_hf_dir(out_dir, kind, cfg, seed=0, dtype=torch.float32, shard_bytes=None):
    """Write config.json and random weights for a 'llama' or 'gpt2' model; returns the config."""
    dtype = TORCH_DTYPES[dtype] if isinstance(dtype, str) else dtype
    os.makedirs(out_dir, exist_ok=True)
    config = make_config(kind, cfg, dtype)
    write_json(os.path.join(out_dir, "config.json"), config)
    write_weights(out_dir, random_weights(config, seed, dtype), shard_bytes)
    return config


def load_hf_weights(d):
    """Raw tensors (stored dtype) of a HF dir: model.safetensors or an index with shards."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fname in files:
        for name, t in read_safetensors(os.path.join(d, fname)).items():
            if name in out:
                raise ValueError(f"{d}: tensor {name} appears twice")
            out[name] = t
    return out


def load_hf_dir(d):
    """(config dict, dict name -> float32 tensor) of a HF model dir, sharded or not."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return cfg, {n: t.float() for n, t in load_hf_weights(d).items()}


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(hd) + causal mask) v in fp32; q, k, v: [B, H, T, hd]."""
    T, hd = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rotary(x, theta):
    """HF rotate-half rotary embedding on x [B, H, T, hd] at positions 0..T-1."""
    T, hd = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def llama_logits(cfg, w, ids):
    B, T = ids.shape
    nh, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    d, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
    hd, theta = d // nh, cfg.get("rope_theta", 10000.0)
    h = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rmsnorm(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, T, nh, hd).transpose(1, 2)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(B, T, kv, hd).transpose(1, 2)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(B, T, kv, hd).transpose(1, 2)
        q, k = apply_rotary(q, theta), apply_rotary(k, theta)
        k = k[:, :, None].expand(B, kv, nh // kv, T, hd).reshape(B, nh, T, hd)
        v = v[:, :, None].expand(B, kv, nh // kv, T, hd).reshape(B, nh, T, hd)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, nh * hd)
        h = h + y @ w[p + "self_attn.o_proj.weight"].T
        x = rmsnorm(h, w[p + "post_attention_layernorm.weight"], eps)
        m = F.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)
        h = h + m @ w[p + "mlp.down_proj.weight"].T
    h = rmsnorm(h, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if cfg.get("tie_word_embeddings", False) or head is None:
        head = w["model.embed_tokens.weight"]
    return h @ head.T


def gpt2_logits(cfg, w, ids):
    B, T = ids.shape
    d, nh, eps = cfg["n_embd"], cfg["n_head"], cfg.get("layer_norm_epsilon", 1e-5)
    hd = d // nh
    h = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][torch.arange(T)]

    def ln(x, name):
        return F.layer_norm(x, (d,), w[name + ".weight"], w[name + ".bias"], eps)

    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        a = ln(h, p + "ln_1")
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, nh, hd).transpose(1, 2) for t in qkv.split(d, dim=-1))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, d)
        h = h + (y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"])
        m = ln(h, p + "ln_2")
        m = gelu_new(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        h = h + (m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"])
    return ln(h, "transformer.ln_f") @ w["transformer.wte.weight"].T


def reference_logits(src, input_ids):
    """fp32 logits [B, T, V]; src is a HF dir or a (config, weights) pair."""
    cfg, w = load_hf_dir(src) if isinstance(src, (str, os.PathLike)) else src
    w = {n: t.float() for n, t in w.items()}
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    with torch.no_grad():
        if cfg["model_type"] == "llama":
            return llama_logits(cfg, w, ids)
        if cfg["model_type"] == "gpt2":
            return gpt2_logits(cfg, w, ids)
    raise ValueError(f"unsupported model_type {cfg['model_type']!r}")


def reference_loss(src, input_ids, labels):
    """Mean cross-entropy over all positions; labels are already the next tokens (no shift)."""
    logits = reference_logits(src, input_ids)
    labels = torch.as_tensor(labels, dtype=torch.long)
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1)))


TOKEN_CODES = {"uint16": "H", "uint32": "I"}
assert array.array("H").itemsize == 2 and array.array("I").itemsize == 4


def write_tokens(path, tokens, dtype="uint16"):
    """Write a flat little-endian token file."""
    tokens = tokens.tolist() if torch.is_tensor(tokens) else tokens
    with open(path, "wb") as f:
        f.write(array.array(TOKEN_CODES[dtype], [int(t) for t in tokens]).tobytes())


def tokens_sample(path, seq_len, dtype="uint16"):
    """(input_ids [1, T], labels [1, T]) = tokens[0:T], tokens[1:T+1] of a flat token file."""
    toks = array.array(TOKEN_CODES[dtype])
    with open(path, "rb") as f:
        toks.frombytes(f.read())
    if len(toks) < seq_len + 1:
        raise ValueError(f"{path}: {len(toks)} tokens, need {seq_len + 1}")
    t = torch.tensor(toks[:seq_len + 1].tolist(), dtype=torch.long)
    return t[:seq_len].unsqueeze(0), t[1:].unsqueeze(0)


def compare_dirs(a, b):
    """None if both dirs hold the same tensors byte for byte, else a description."""
    ta, tb = load_hf_weights(a), load_hf_weights(b)
    if sorted(ta) != sorted(tb):
        return f"names differ: only in A {sorted(set(ta) - set(tb))[:5]}, " \
               f"only in B {sorted(set(tb) - set(ta))[:5]}"
    for n in sorted(ta):
        x, y = ta[n], tb[n]
        if x.dtype != y.dtype:
            return f"{n}: dtype {DTYPE_NAMES[x.dtype]} vs {DTYPE_NAMES[y.dtype]}"
        if list(x.shape) != list(y.shape):
            return f"{n}: shape {list(x.shape)} vs {list(y.shape)}"
        bx, by = tensor_bytes(x), tensor_bytes(y)
        if bx != by:
            e = next(j for j in range(len(bx)) if bx[j] != by[j]) // x.element_size()
            x, y = x.reshape(-1)[e].item(), y.reshape(-1)[e].item()
            return f"{n}: data differs at element {e}: {x!r} vs {y!r}"
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("golden", help="write the golden safetensors file").add_argument("out")
    m = sub.add_parser("make", help="write a random HF model dir")
    m.add_argument("--kind", choices=["llama", "gpt2"], required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--config", required=True, help="JSON object of HF config fields")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default="float32")
    m.add_argument("--shard_bytes", type=int, default=None)
    lo = sub.add_parser("loss", help="print the reference loss on one token sample")
    lo.add_argument("--dir", required=True)
    lo.add_argument("--tokens", required=True)
    lo.add_argument("--seq_len", type=int, required=True)
    lo.add_argument("--dtype", choices=sorted(TOKEN_CODES), default="uint16")
    c = sub.add_parser("compare", help="exit 0 if two HF dirs hold identical tensors")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args(argv)
    if args.cmd == "golden":
        golden(args.out)
    elif args.cmd == "make":
        write_hf_dir(args.out, args.kind, json.loads(args.config), args.seed,
                     TORCH_DTYPES[args.dtype], args.shard_bytes)
    elif args.cmd == "loss":
        ids, labels = tokens_sample(args.tokens, args.seq_len, args.dtype)
        print(repr(reference_loss(args.dir, ids, labels)))
    elif args.cmd == "compare":
        diff = compare_dirs(args.a, args.b)
        if diff is not None:
            print(diff)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
