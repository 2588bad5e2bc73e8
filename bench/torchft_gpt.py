#!/usr/bin/env python3
"""One TorchFT replica group (one process) training the GPT of worker/models/gpt.cc.

The peer for surviving failures (bench (r), bench/torchft_vs_varuna.py): bench/ddp_gpt.py's
model, data and optimizer under TorchFT as its own train_ddp.py example sets it up: a
lighthouse (TORCHFT_LIGHTHOUSE), one replica group per process started by torchrun (its
TCPStore), `Manager` with `ProcessGroupGloo` and `PGTransport` for recovery from a live peer,
`torchft.DistributedDataParallel` and `torchft.Optimizer`. REPLICA_GROUP_ID and
NUM_REPLICA_GROUPS come from the environment.

Data: replica r of N trains, at TorchFT step s, the samples [(s-1)*B + r*B/N, ...) of the same
stream as varuna-worker (TokenDataset), B/N per replica; a replica that is down leaves its
share untrained, as TorchFT documents (the survivors do not take it over).

Per step it appends {t, step, participants, committed, loss, step_time_s} to
--metrics_out.<REPLICA_GROUP_ID> (t: Unix seconds when the step ended; step: the manager's
step after it; committed: whether the optimizer step was applied).
"""

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torchft
from torchft.checkpointing.pg_transport import PGTransport

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_gpt import Gpt, TokenDataset  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d_model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--global_batch", type=int, default=24)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--step_min_ms", type=float, default=0.0,
                    help="pace: each step takes at least this long (as VARUNA_STEP_MIN_MS)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip_grad_norm", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pg_timeout_s", type=float, default=0,
                    help="ProcessGroupGloo timeout (0: its default)")
    ap.add_argument("--timeout_s", type=float, default=0, help="Manager timeout (0: default)")
    ap.add_argument("--quorum_timeout_s", type=float, default=0,
                    help="Manager quorum_timeout (0: default)")
    ap.add_argument("--metrics_out", required=True)
    a = ap.parse_args()

    torch.set_num_threads(1)
    replica = int(os.environ.get("REPLICA_GROUP_ID", 0))
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", 1))
    if a.global_batch % groups:
        sys.exit(f"global_batch={a.global_batch} is not divisible by {groups} replica groups")
    per = a.global_batch // groups

    model = Gpt(a)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    pg = (torchft.ProcessGroupGloo(timeout=timedelta(seconds=a.pg_timeout_s))
          if a.pg_timeout_s else torchft.ProcessGroupGloo())
    kw = {}
    if a.timeout_s:
        kw["timeout"] = timedelta(seconds=a.timeout_s)
    if a.quorum_timeout_s:
        kw["quorum_timeout"] = timedelta(seconds=a.quorum_timeout_s)
    transport = PGTransport(pg, timeout=timedelta(seconds=10), device=torch.device("cpu"))
    manager = torchft.Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict,
                              state_dict=state_dict, replica_id=f"gpt_{replica}",
                              checkpoint_transport=transport, **kw)
    ddp = torchft.DistributedDataParallel(manager, model)
    optimizer = torchft.Optimizer(manager, opt)
    data = TokenDataset(a.data, a.seq_len, a.seed)
    out = open(f"{a.metrics_out}.{replica}", "a")
    B = a.global_batch
    while manager.current_step() < a.steps:
        t0 = time.perf_counter()
        s = manager.current_step() + 1
        ids, labels = data.batch((s - 1) * B + replica * per, per)
        optimizer.zero_grad()  # starts the quorum (TorchFT: at the top of every step)
        loss = ddp(ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad_norm)
        optimizer.step()  # applies the update only if every participant agrees to commit
        committed = manager.current_step() >= s
        if a.step_min_ms:
            left = a.step_min_ms / 1000 - (time.perf_counter() - t0)
            if left > 0:
                time.sleep(left)
        out.write(json.dumps({"t": time.time(), "step": manager.current_step(),
                              "participants": manager.num_participants(),
                              "committed": bool(committed), "loss": loss.item(),
                              "step_time_s": time.perf_counter() - t0}) + "\n")
        out.flush()
    out.close()


if __name__ == "__main__":
    main()
