"""varuna-data: prepares training corpora (docs/data.md "Preparing data").

  varuna-data prepare --tokenizer DIR --input FILE... --out PREFIX
                      [--format indexed|llmc] [--workers N] [--eod TOKEN] [--delimiter LINE]
  varuna-data tokenizer --input FILE... --vocab N --out DIR [--delimiter LINE]
  varuna-data seen LOG_DIR            what the model saw, from a job's data.sample_log

prepare tokenizes documents with the Hugging Face tokenizer in DIR (its tokenizer.json, through
Hugging Face's `tokenizers` library), in parallel, appends the end-of-document token to each,
and writes them as a Megatron indexed dataset (PREFIX.bin + PREFIX.idx; uint16 tokens when the
vocabulary fits, else int32) or an llm.c token file (PREFIX.bin: 20240520 v1 uint16, else
20240801 v7 uint32), plus PREFIX.manifest.json: tokens, documents, vocab_size, eod_token and
the sha256 of tokenizer.json, which varunactl submit and the worker check a job against.
Inputs: .jsonl (one document per line, its "text" field), else text files: one document per
file, or one per block between lines equal to --delimiter (e.g. '%' for fortune files).
The end-of-document token: --eod (a token or an id), else the tokenizer's eos_token
(tokenizer_config.json), else <|endoftext|>, </s> or <eos> if the vocabulary has one.

tokenizer trains a byte-level BPE tokenizer of N tokens on the inputs with `tokenizers`
(<|endoftext|> is token 0 and the eos_token) into DIR: for a corpus without a tokenizer of its
own (the demo's).

seen reads DIR/rank-*.gen-*.jsonl and prints one JSON line per committed sample, in step order
(Note [Sample log] in common/data/sample_log.h: a step a later generation re-ran counts once).
"""

import argparse
import glob
import hashlib
import json
import multiprocessing
import os
import struct
import sys
import time

INDEX_MAGIC = b"MMIDIDX\x00\x00"


def fail(msg):
    print(f"varuna-data: {msg}", file=sys.stderr)
    sys.exit(2)


class InputError(Exception):
    """Bad input met while reading documents (possibly on a pool's feeder thread, where
    sys.exit would not end the program): prepare reports it and removes what it wrote."""


def documents(paths, delimiter):
    """Yields each input's documents (strings) in order."""
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"{path}: no such file")
        if path.endswith(".jsonl"):
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise InputError(f"{path}:{n}: not JSON ({e.msg})")
                    if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                        raise InputError(f"{path}:{n}: no \"text\" string")
                    yield doc["text"]
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if delimiter is None:
            yield text
            continue
        block = []
        for line in text.splitlines(keepends=True):
            if line.rstrip("\r\n") == delimiter:
                if "".join(block).strip():
                    yield "".join(block)
                block = []
            else:
                block.append(line)
        if "".join(block).strip():
            yield "".join(block)


_TOKENIZER = None


def _init(tokenizer_json, single_threaded=False):
    global _TOKENIZER
    if single_threaded:  # one of N processes: N x the cores' threads would only contend
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer
    _TOKENIZER = Tokenizer.from_file(tokenizer_json)


def _encode(batch):
    return [e.ids for e in _TOKENIZER.encode_batch(batch, add_special_tokens=False)]


def batches(docs, size=256):
    batch = []
    for d in docs:
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def eod_token(tok, tokenizer_dir, given):
    vocab = tok.get_vocab(with_added_tokens=True)
    if given is not None:
        if given.isdigit():
            if int(given) >= tok.get_vocab_size(with_added_tokens=True):
                fail(f"--eod {given} is not below the vocabulary size")
            return int(given)
        if given not in vocab:
            fail(f"--eod {given!r} is not a token of {tokenizer_dir}")
        return vocab[given]
    names = []
    config = os.path.join(tokenizer_dir, "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str):
            names.append(eos)
    names += ["<|endoftext|>", "</s>", "<eos>"]
    for name in names:
        if name in vocab:
            return vocab[name]
    fail(f"{tokenizer_dir} names no end-of-document token: give one with --eod")


def write_indexed(prefix, seqs, vocab_size):
    code, fmt = (8, "<H") if vocab_size <= 65536 else (4, "<i")
    width = struct.calcsize(fmt)
    lengths, pointers, offset = [], [], 0
    with open(prefix + ".bin.tmp", "wb") as bin_file:
        for ids in seqs:
            bin_file.write(struct.pack(f"<{len(ids)}{fmt[1]}", *ids))
            lengths.append(len(ids))
            pointers.append(offset)
            offset += len(ids) * width
    with open(prefix + ".idx.tmp", "wb") as idx:
        idx.write(INDEX_MAGIC)
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", code))
        idx.write(struct.pack("<Q", len(lengths)))
        idx.write(struct.pack("<Q", len(lengths) + 1))
        idx.write(struct.pack(f"<{len(lengths)}i", *lengths))
        idx.write(struct.pack(f"<{len(pointers)}q", *pointers))
        idx.write(struct.pack(f"<{len(lengths) + 1}q", *range(len(lengths) + 1)))
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")
    return sum(lengths), len(lengths)


def write_llmc(prefix, seqs, vocab_size):
    v1 = vocab_size <= 65536
    fmt = "H" if v1 else "I"
    tokens, docs = 0, 0
    with open(prefix + ".bin.tmp", "wb") as f:
        f.write(b"\0" * 1024)
        for ids in seqs:
            f.write(struct.pack(f"<{len(ids)}{fmt}", *ids))
            tokens += len(ids)
            docs += 1
        if tokens >= 2**31:
            fail(f"{tokens} tokens: an llm.c file holds fewer than 2^31; split the input")
        header = [20240520, 1, tokens] if v1 else [20240801, 7, tokens]
        f.seek(0)
        f.write(struct.pack("<256i", *(header + [0] * 253)))
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    return tokens, docs


def prepare(args):
    tokenizer_json = os.path.join(args.tokenizer, "tokenizer.json")
    if not os.path.isfile(tokenizer_json):
        fail(f"{args.tokenizer}: no tokenizer.json (a Hugging Face tokenizer directory)")
    if args.workers < 1:
        fail("--workers must be at least 1")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    eod = eod_token(tok, args.tokenizer, args.eod)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()

    def encoded():
        docs = documents(args.input, args.delimiter)
        if args.workers == 1:
            _init(tokenizer_json)
            for b in batches(docs):
                for ids in _encode(b):
                    yield ids + [eod]
            return
        with multiprocessing.get_context("spawn").Pool(
                args.workers, initializer=_init, initargs=(tokenizer_json, True)) as pool:
            for out in pool.imap(_encode, batches(docs), chunksize=1):
                for ids in out:
                    yield ids + [eod]

    writer = write_indexed if args.format == "indexed" else write_llmc
    try:
        tokens, docs = writer(args.out, encoded(), vocab_size)
    except InputError as e:
        for ext in (".bin.tmp", ".idx.tmp"):
            if os.path.exists(args.out + ext):
                os.remove(args.out + ext)
        fail(str(e))
    seconds = time.perf_counter() - t0
    if docs == 0:
        for ext in (".bin", ".idx"):
            if os.path.exists(args.out + ext):
                os.remove(args.out + ext)
        fail("the inputs hold no documents")
    with open(tokenizer_json, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    manifest = {
        "format": args.format, "tokens": tokens, "documents": docs, "vocab_size": vocab_size,
        "eod_token": eod, "tokenizer": os.path.abspath(args.tokenizer), "tokenizer_sha256": sha,
        "inputs": [os.path.abspath(p) for p in args.input], "workers": args.workers,
        "seconds": round(seconds, 3), "tokens_per_s": round(tokens / max(seconds, 1e-9)),
    }
    with open(args.out + ".manifest.json", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"varuna-data: {docs} documents, {tokens} tokens in {seconds:.2f} s "
          f"({tokens / max(seconds, 1e-9):,.0f} tokens/s, {args.workers} workers) -> "
          f"{args.out}.{'bin/.idx' if args.format == 'indexed' else 'bin'} "
          f"(vocab {vocab_size}, end-of-document {eod})")


def train_tokenizer(args):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    if args.vocab < 258:
        fail("--vocab must be at least 258 (256 bytes and <|endoftext|>, and one merge)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    try:
        tok.train_from_iterator(list(documents(args.input, args.delimiter)), trainer)
    except InputError as e:
        fail(str(e))
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)
        f.write("\n")
    print(f"varuna-data: a byte-level BPE of {tok.get_vocab_size()} tokens in {args.out}")


def seen(args):
    files = sorted(glob.glob(os.path.join(args.log_dir, "rank-*.gen-*.jsonl")))
    if not files:
        fail(f"{args.log_dir}: no rank-*.gen-*.jsonl files (data.sample_log)")
    # A file may hold several runs of its generation (a rerun appends after its own header):
    # the k-th header of generation G in every file starts the same run (G, k).
    runs = {}  # (generation, k) -> [resumed_from, [lines]]
    for path in files:
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if not rows or "generation" not in rows[0]:
            fail(f"{path}: no generation header")
        seen_headers = {}
        key = None
        for r in rows:
            if "generation" in r:
                g = r["generation"]
                k = seen_headers[g] = seen_headers.get(g, -1) + 1
                key = (g, k)
                run = runs.setdefault(key, [r["resumed_from"], []])
                run[0] = min(run[0], r["resumed_from"])
            else:
                runs[key][1].append(r)
    order = sorted(runs)
    out = []
    for i, key in enumerate(order):
        later = [runs[k][0] for k in order[i + 1:]]
        cut = min(later) if later else None
        out += [r for r in runs[key][1] if cut is None or r["step"] <= cut]
    out.sort(key=lambda r: (r["step"], r["source"], r["sample"]))
    for r in out:
        print(json.dumps(r))


def main():
    p = argparse.ArgumentParser(prog="varuna-data", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("prepare", help="tokenize documents into a corpus")
    pr.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer directory")
    pr.add_argument("--input", required=True, nargs="+", help=".jsonl or text files")
    pr.add_argument("--out", required=True, help="output PREFIX")
    pr.add_argument("--format", choices=["indexed", "llmc"], default="indexed")
    pr.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    pr.add_argument("--eod", help="end-of-document token (text or id)")
    pr.add_argument("--delimiter", help="a line that separates documents in text inputs")
    tk = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer")
    tk.add_argument("--input", required=True, nargs="+", help=".jsonl or text files")
    tk.add_argument("--vocab", type=int, required=True, help="tokens in all")
    tk.add_argument("--out", required=True, help="output directory")
    tk.add_argument("--delimiter", help="a line that separates documents in text inputs")
    se = sub.add_parser("seen", help="the committed samples of a job's sample log")
    se.add_argument("log_dir")
    args = p.parse_args()
    {"prepare": prepare, "tokenizer": train_tokenizer, "seen": seen}[args.command](args)


if __name__ == "__main__":
    main()
