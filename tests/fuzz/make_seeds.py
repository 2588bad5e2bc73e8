#!/usr/bin/python3
"""Writes the seed corpora in tests/fuzz/corpus/<target>/ (run from the repository root).

Each seed is a valid input or one of the hostile inputs found by hand (issue "Hardening"):
non-scalar keys, duplicate keys, unbounded numbers, FIFOs and '..' in checkpoint paths, wrong
types in metadata. RPC seeds are protobuf messages encoded with protoc from text format.
"""
import os
import struct
import subprocess

ROOT = os.path.join("tests", "fuzz", "corpus")
SEP = "\n--8<--\n"

JOB = (open(os.path.join("examples", "jobs", "gpt_fortunes.yaml")).read()
       .replace("@CORPUS@", "/tmp/x").replace("@TOKENIZER@", "/tmp"))


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


HOSTILE_SPECS = {
    "valid": JOB,
    "nonscalar_key": "? [a, b]\n: 1\n",
    "nonscalar_key_nested": "data: {path: /x}\nmodel:\n  ? {k: v}\n  : 3\n",
    "duplicate_key": "data: {path: /x}\ntrain: {lr: 0.1, lr: 0.2}\n",
    "env_list": "data: {path: /x}\nenv: {A: [1, 2, 3]}\n",
    "env_bad_keys": "data: {path: /x}\nenv: {'': 1, 'A=B': 2}\n",
    "huge_numbers": "data: {path: /x}\nmodel: {seq_len: 2147483647, layers: 100000}\n"
                    "train: {global_batch: 2147483647, steps: 99999999999}\n",
    "inf": "data: {path: /x}\ntrain: {lr: .inf}\nparallel: {timeout_s: .inf}\n",
    "nan": "data: {path: /x}\ntrain: {lr: .nan, min_lr: .nan}\n",
    "micro_batch_too_big": "data: {path: /x}\ntrain: {global_batch: 8}\n"
                           "parallel: {micro_batch: 16, replicas: 2}\n",
    "deep": "a: " + "[" * 200 + "]" * 200 + "\n",
    "anchors": "x: &a {path: /x}\ndata: *a\nmodel: {kind: gpt}\n",
    "tags": "data: !!map {path: !!binary aGVsbG8=}\n",
    "not_a_map": "- 1\n- 2\n",
    "scalar_sections": "data: 5\nmodel: x\ntrain: [1]\n",
    "resume": "data: {path: /x}\ncheckpoint: {dir: /c, resume: '-1'}\n",
    "entrypoint": "data: {path: /x}\nentrypoint: ['', 'a']\n",
}
for name, text in HOSTILE_SPECS.items():
    put("job_spec_fuzz", name, text)

put("submission_fuzz", "valid", JOB + SEP + "train.lr=0.01\nparallel.stages=auto\nenv:A=1" +
    SEP + "export A=1\nB='two'\n# c\n" + SEP + "--set train.lr=0.1 \\\n  --stages 2\n")
put("submission_fuzz", "nonscalar_key", "? [a, b]\n: 1\n" + SEP + "" + SEP + "" + SEP + "")
put("submission_fuzz", "set_into_scalar", "data: 5\n" + SEP + "data.path.x=1\n..=3\n.a=1\n" +
    SEP + SEP)
put("submission_fuzz", "env_list", "data: {path: x}\nenv: {A: [1, 2]}\n" + SEP + SEP + SEP)
put("submission_fuzz", "env_file_bad", "data: {path: x}\n" + SEP + "env:=x\nenv:1A=2\n" + SEP +
    "=\nexport\nA B\n'\n" + SEP + "'unterminated\n\\")
put("submission_fuzz", "section_not_map", "model: [1]\ncheckpoint: 3\n" + SEP +
    "model.path=x\n" + SEP + SEP)

for name, text in {
    "2x2": "0,2;1,3;", "1x1": "0;", "holes": "0,5;1;", "dup": "0,0;1,1;", "neg": "-1;0;",
    "big": "0," + ",".join(str(i) for i in range(1, 300)) + ";", "empty": "", "junk": ";;,;a;",
}.items():
    put("stage_map_fuzz", name, text + SEP + "--job\nj.yaml\n--rank=1\n--chunk_size=999999\n"
        "--batch-size=0\n--steps=99999999999" + SEP + "WORLD_SIZE=0\nRANK=1\nMASTER_PORT=99999"
        + SEP + "data: {path: /x}\nparallel: {micro_batch: 64}\n")
put("stage_map_fuzz", "world_ok", "0,2;1,3;" + SEP + "--job\nj.yaml\n" + SEP +
    "WORLD_SIZE=4\nRANK=3\n" + SEP + "data: {path: /x}\ntrain: {global_batch: 8}\n")

COMMON = ('{"format": 1, "step": 1, "global_batch": 8, "stages": 1, "replicas": 1, '
          '"micro_batch": 1, "stage_to_rank_map": "0;", "loss_scale": 1, "clean_steps": 0, '
          '"writers": [0], "layers": ["head"], "model_spec": "kind=gpt"}')
MANIFEST = '{"files": [{"path": "layers/head.pt", "size": 5, "crc32": 907060870}]}'
for name, (common, manifest, layer, lname) in {
    "plausible": (COMMON, MANIFEST, "hello", "head"),
    "empty_lists": (COMMON.replace('[0]', '[]').replace('["head"]', '[]'), '{"files": []}',
                    "x", "head"),
    "dotdot": (COMMON, '{"files": [{"path": "../../../../dev/zero", "size": 1, "crc32": 0}]}',
               "", "head"),
    "abs_path": (COMMON, '{"files": [{"path": "/etc/passwd", "size": 1, "crc32": 0}]}', "",
                 "head"),
    "size_not_number": (COMMON, '{"files": [{"path": "layers/head.pt", "size": "big", '
                        '"crc32": []}]}', "hello", "head"),
    "no_step": (COMMON.replace('"step": 1, ', ''), MANIFEST, "hello", "head"),
    "wrong_types": ('{"step": "x", "writers": "y", "layers": {"a": 1}}', '[1, 2]', "", "head"),
    "huge_size": (COMMON, '{"files": [{"path": "layers/head.pt", "size": 1e30, "crc32": 1}]}',
                  "hello", "head"),
    "writer_range": (COMMON.replace('[0]', '[0, 7, -1]'), MANIFEST, "hello", "head"),
    "layer_slash": (COMMON.replace('["head"]', '["../x", "a/b"]'), MANIFEST, "hello", "head"),
    "not_json": ("{{{", "]]]", "", ""),
}.items():
    put("checkpoint_fuzz", name, SEP.join([common, manifest, layer, lname]))


def encode(msg, text):
    r = subprocess.run(["protoc", "-Iproto", "--encode=varuna.v1." + msg,
                        "proto/varuna/v1/control.proto"], input=text.encode(),
                       capture_output=True, check=True)
    return r.stdout


def frame(selector, payload):
    return bytes([selector]) + struct.pack("<H", len(payload)) + payload


REG = encode("RegisterRequest", 'name: "n1" address: "127.0.0.1:9" slots: 4 '
             'labels {key: "zone" value: "a"}')
REG_BIG = encode("RegisterRequest", 'name: "%s" address: "h:1" slots: 1000000000' % ("x" * 2000))
REG_BAD = encode("RegisterRequest", 'name: "a/b" address: "nohostport" slots: -1')
HB = encode("HeartbeatRequest", 'name: "n1" workers {job_id: "1" generation: 1 rank: 0 '
            'state: WORKER_EXITED exit_code: 1} workers {job_id: "zz" rank: -5}')
SUB = encode("SubmitRequest", 'spec_yaml: %r request_id: "r1"' % JOB.replace("'", ""))
SUB_BAD = encode("SubmitRequest", 'spec_yaml: "? [a, b]\\n: 1\\n"')
LAUNCH = encode("LaunchRequest", 'job_id: "1" generation: 1 spec_yaml: "x: 1" '
                'ranks {rank: 0 local_rank: 0} world_size: 1 master_addr: "127.0.0.1" '
                'stage_to_rank_map: "0;" micro_batch: 1 per_replica_batch: 1 '
                'entrypoint: "/bin/true" env {key: "A" value: "1"}')
LAUNCH_BAD = encode("LaunchRequest", 'job_id: "../x" generation: 0 ranks {rank: 9} '
                    'world_size: -1')
LOGS = encode("FetchLogsRequest", 'job_id: "1" rank: 0 offset: -5 max_bytes: 2147483647')
GETLOGS = encode("GetLogsRequest", 'job_id: "1" rank: 0 offset: 99999999999 max_bytes: -1')
STOP = encode("StopRequest", 'job_id: "1" generation: 0 grace_ms: -1')
put("rpc_fuzz", "register_submit_heartbeat",
    frame(0, REG) + frame(2, SUB) + frame(11, b"\x05") + frame(1, HB) + frame(3, b"1") +
    frame(11, b"\x3b" * 59))
put("rpc_fuzz", "bad_register", frame(0, REG_BIG) + frame(0, REG_BAD) + frame(4, b"n1"))
put("rpc_fuzz", "bad_submit", frame(2, SUB_BAD) + frame(5, GETLOGS) + frame(3, b"nope"))
put("rpc_fuzz", "agent", frame(6, LAUNCH) + frame(6, LAUNCH_BAD) + frame(9, LOGS) +
    frame(8, b"") + frame(7, STOP) + frame(10, b"") + frame(11, b""))
put("rpc_fuzz", "garbage", b"\x00\xff\xff\xff\xfe\x01\x02")
# The worker <-> agent protocol: typed events and commands, the flat lines user programs write,
# and hostile lines (one input may hold several lines).
WORKER_PROTOCOL = {
    "typed_events": '{"t":1700000000.5,"ready":{"resumed_from":0}}\n'
                    '{"t":1700000001,"step":{"step":1,"loss":10.8,"grad_norm":1.5,"lr":0.0006,'
                    '"stage_busy_s":[0.1,0.2],"stage_wait_s":[0,0.01]}}\n'
                    '{"t":2,"stopped":{"saved_step":1}}\n{"t":3,"rescued":{"saved_step":0}}\n'
                    '{"t":4,"profile":{"path":"/w/gen1/profile.json"}}\n'
                    '{"t":5,"error":{"message":"rescue failed","bad_input":false,"command":""}}\n',
    "flat_lines": '{"ready": true, "resumed_from": 3, "t": 1.5}\n'
                  '{"step": 7, "loss": 2.5, "step_time_s": 0.1, "samples_per_s": 80}\n'
                  '{"step": 7, "loss": 2.5, "stopped": true}\n'
                  '{"stopped": true, "saved_step": 20, "t": 2}\n{"rescued": true, "saved_step": 6}\n'
                  '{"profile": "/w/profile.json"}\n'
                  '{"error": "data.path is not a regular file", "bad_input": true}\n',
    "nan": '{"step": 2, "loss": nan, "grad_norm": -inf, "lr": "Infinity", "t": -nan}\n'
           '{"step": {"step": 3, "loss": "NaN"}}\n{"error": "loss is nan"}\n',
    "bad_lines": '\n   \nstep 3 loss 2\n[1, 2]\n{"loss": 2.5}\n{"step": 0}\n{"step": 2.5}\n'
                 '{"step": 1e300}\n{"step": "7"}\n{"stopped": true, "saved_step": -1}\n'
                 '{"ready": {}, "step": {"step": 1}}\n{"step": {"step": "many"}}\n'
                 '{"profile": {"path": ""}}\n{"a": 1, "a": 2}\n{"step": 1} trailing\n'
                 '{"error": "bad \xff\xfe utf-8 \xc3"}\n',
    "deep": '{"a": ' + "[" * 3000 + "]" * 3000 + '}\n{"step": {"stage_busy_s": [' +
            ",".join(["1"] * 5000) + ']}}\n',
    "long_line": '{"error": "' + "x" * 70000 + '"}\n{"stop": {}, "x": "' + "y" * 5000 + '"}\n',
    "commands": '{"generation":3,"stop":{}}\n{"checkpoint_now":{}}\n'
                '{"generation":1,"reconfigure":{"generation":2,"pipelines":"0,3,6:12;0,6:4",'
                '"rank":2,"micro_batch":4,"master_addr":"10.0.0.1","master_port":29500}}\n'
                '{"reconfigure":{"generation":2,"pipelines":"0,6:4","rank":9}}\n'
                '{"generation":-1,"stop":{}}\n{"stop":{},"checkpoint_now":{}}\nSIGUSR1\n',
}
for name, text in WORKER_PROTOCOL.items():
    put("worker_protocol_fuzz", name, text.encode("latin-1"))  # \xff: that byte, not UTF-8

# The agent reading a job's progress files: valid step lines, and the issue-23 heartbeat flood
# (step records whose per-stage lists add up past the heartbeat budget).
STEP = '{"step": %d, "loss": 2.5, "step_time_s": 0.1, "samples_per_s": 80}\n'
BIG_STAGES = '{"step": %d, "loss": 1, "stage_busy_s": [' + ",".join(["0.5"] * 20000) + "]}\n"
PROGRESS = {
    "valid": '{"ready": {}}\n' + "".join(STEP % i for i in range(1, 6)) + SEP +
             "".join(STEP % i for i in range(1, 6)),
    "flood": SEP.join("".join(BIG_STAGES % (10 * k + i) for i in range(10)) for k in range(6)),
    "partial_lines": '{"step": 1, "lo' + SEP + 'ss": 2}\n{"step": 2}' + SEP + "\n" + "x" * 70000,
    "garbage": "\x00\xff{{{\n" * 100 + SEP + '{"profile": {"path": "/etc/shadow"}}\n',
}
for name, text in PROGRESS.items():
    put("progress_fuzz", name, text.encode("latin-1"))

# Requests as peers send them to the daemons' HTTP ports.
HTTP = {
    "get": "GET /api/v1/jobs?after_step=3 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           "Authorization: Bearer abcdefghijklmnop\r\n\r\n",
    "ranges": "GET /app.js HTTP/1.1\r\nHost: x\r\nRange: bytes=0-," + "0-,".join([""] * 500) +
              "0-\r\n\r\n",
    "encoded": "GET /api/v1/jobs/%2e%2e%2f%00x?%zz=%41&a+b=c+d HTTP/1.0\r\n\r\n",
    "many_headers": "GET / HTTP/1.1\r\n" + "".join(f"X-{i}: y\r\n" for i in range(80)) + "\r\n",
    "bare_lf": "GET /healthz HTTP/1.1\nHost: a\n\n",
    "absolute": "GET http://evil/ HTTP/1.1\r\n\r\n",
    "no_end": "GET / HTTP/1.1\r\nHost: " + "a" * 9000,
}
for name, text in HTTP.items():
    put("http_request_fuzz", name, text)


# safetensors files: valid ones (F32, BF16, F16, scalar, empty, metadata) and headers that lie.
def safetensors(header, data):
    h = header.encode()
    return struct.pack("<Q", len(h)) + h + data


F = '{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}'
SAFETENSORS = {
    "valid": safetensors('{"__metadata__":{"format":"pt"},"a":' + F % ("F32", "[2]", 0, 8) +
                         ',"b":' + F % ("BF16", "[2,1]", 8, 12) + ',"c":' +
                         F % ("F16", "[]", 12, 14) + ',"e":' + F % ("F32", "[0]", 14, 14) + "}",
                         bytes(range(14))),
    "overlap": safetensors('{"a":' + F % ("F32", "[1]", 0, 4) + ',"b":' +
                           F % ("F32", "[1]", 2, 6) + "}", bytes(6)),
    "gap": safetensors('{"a":' + F % ("F32", "[1]", 0, 4) + ',"b":' +
                       F % ("F32", "[1]", 8, 12) + "}", bytes(12)),
    "past_end": safetensors('{"a":' + F % ("F64", "[4]", 0, 32) + "}", bytes(8)),
    "huge_shape": safetensors('{"a":' + F % ("F32", "[4294967296,4294967296,16]", 0, 4) + "}",
                              bytes(4)),
    "length_lies": struct.pack("<Q", 1 << 40) + b"{}",
    "nested": safetensors('{"a":' + "[" * 200 + "]" * 200 + "}", b""),
}
for name, data in SAFETENSORS.items():
    put("safetensors_fuzz", name, data)
print("seeds written under", ROOT)
