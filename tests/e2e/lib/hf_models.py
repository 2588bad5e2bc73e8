"""Hugging Face model dirs and the reference forward, from Hugging Face's own libraries.

transformers builds the models (LlamaForCausalLM, GPT2LMHeadModel from a config, seeded random
weights, save_pretrained to safetensors) and computes the reference loss (from_pretrained, so an
export is loaded the way users load it); safetensors reads checkpoints back. The golden file
for the C++ reader is written by an independent writer of the format here (write_safetensors).

CLI: hf_models.py golden OUT | make --kind llama|gpt2 --out DIR --config JSON [--seed N] [--dtype D] [--shard_bytes N] | loss --dir DIR --tokens FILE
--seq_len N [--dtype uint16|uint32] | compare A_DIR B_DIR
"""

import argparse
import array
import json
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
    """Raw little-endian bytes of a tensor (no numpy, so bf16 works too)."""
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
    """transformers' own config (LlamaConfig or GPT2Config) for kind 'llama' or 'gpt2'."""
    from transformers import GPT2Config, LlamaConfig
    if kind == "llama":
        c = {"hidden_act": "silu", "attention_bias": False, **LLAMA_DEFAULTS, **cfg}
        c.setdefault("num_key_value_heads", c["num_attention_heads"])
        return LlamaConfig(dtype=dtype, **c)
    if kind == "gpt2":
        c = {"activation_function": "gelu_new", "n_inner": None, "tie_word_embeddings": True,
             **GPT2_DEFAULTS, **cfg}
        # Token ids inside the small vocabularies these tests use.
        last = c["vocab_size"] - 1
        return GPT2Config(dtype=dtype, bos_token_id=last, eos_token_id=last, **c)
    raise ValueError(f"unknown kind {kind!r}")


def weight_shapes(cfg):
    """name -> (shape, init) of the tensors a checkpoint holds; cfg: config.json's dict.
    init 'w', 'b': N(0, 0.02), 'n' (norm weight): 1 + N(0, 0.1)."""
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


def write_hf_dir(out_dir, kind, cfg, seed=0, dtype=torch.float32, shard_bytes=None):
    """A Hugging Face model directory made by transformers itself: LlamaForCausalLM or
    GPT2LMHeadModel from its config, our seeded random weights loaded into it, then
    save_pretrained (safetensors; shards of at most shard_bytes with an index). Returns the
    config as config.json has it."""
    from transformers import GPT2LMHeadModel, LlamaForCausalLM
    dtype = TORCH_DTYPES[dtype] if isinstance(dtype, str) else dtype
    config = make_config(kind, cfg, dtype)
    model = (LlamaForCausalLM if kind == "llama" else GPT2LMHeadModel)(config)
    weights = random_weights(config.to_dict(), seed)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # A tied head is the embedding itself: the only tensor the checkpoint does not hold.
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"weights do not fit {kind}: missing {missing}, unexpected {unexpected}")
    model.to(dtype).save_pretrained(out_dir, max_shard_size=shard_bytes or "50GB")
    with open(os.path.join(out_dir, "config.json")) as f:
        return json.load(f)


def load_hf_weights(d):
    """Raw tensors (stored dtype) of a HF dir, read with safetensors: model.safetensors or an
    index with shards."""
    from safetensors.torch import load_file
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fname in files:
        for name, t in load_file(os.path.join(d, fname)).items():
            if name in out:
                raise ValueError(f"{d}: tensor {name} appears twice")
            out[name] = t
    return out


def load_model(d):
    """transformers' from_pretrained of a HF dir, in float32 (bf16 weights upcast), eval mode,
    the eager attention (softmax(QK^T)V with the softmax in fp32)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                 attn_implementation="eager")
    return model.eval()


def reference_logits(src, input_ids):
    """fp32 logits [B, T, V] of the HF dir `src`, computed by transformers."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    with torch.no_grad():
        return load_model(src)(input_ids=ids).logits.float()


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
