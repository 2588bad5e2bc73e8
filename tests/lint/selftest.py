#!/usr/bin/env python3
"""The lints fail on what they are for: a tree with one bad include (layering.py) and one
with a long function and a wide class (shapes.py), each in a temporary directory."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(lint, files):
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        r = subprocess.run([sys.executable, os.path.join(HERE, lint), root],
                           capture_output=True, text=True)
        return r.returncode, r.stdout


def main():
    bad = []
    # models/ may not include the engine (an arrow pointing up).
    rc, out = run("layering.py", {"worker/models/model.cc": '#include "worker/engine/varuna.h"\n'})
    if rc != 1 or "worker/models may not include worker/engine/varuna.h" not in out:
        bad.append(f"layering.py passed an upward include: rc {rc}\n{out}")
    # jobs/ may not include morph/ (it declares JobMorphing instead).
    rc, out = run("layering.py", {"manager/jobs/x.cc": '#include "manager/morph/morph.h"\n'})
    if rc != 1 or "manager/jobs may not include" not in out:
        bad.append(f"layering.py passed jobs/ -> morph/: rc {rc}\n{out}")
    rc, out = run("layering.py", {"manager/jobs/x.cc": '#include "manager/nodes/node_table.h"\n'})
    if rc != 0:
        bad.append(f"layering.py refused jobs/ -> nodes/: rc {rc}\n{out}")
    body = "".join(f"  x += {i};\n" for i in range(130))
    wide = "".join(f"  void M{i}();\n" for i in range(16))
    files = {"common/base/long.cc": "namespace varuna {\nint Long() {\n  int x = 0;\n" + body +
             "  return x;\n}\n}  // namespace varuna\n",
             "common/base/wide.h": "class Wide {\n public:\n" + wide + "\n private:\n  int a_;\n};\n"}
    rc, out = run("shapes.py", files)
    if rc != 1 or "Long is 134 lines (over 120)" not in out or "class Wide: 16 public methods" not in out:
        bad.append(f"shapes.py passed a long function or a wide class: rc {rc}\n{out}")
    for b in bad:
        print(b)
    print(f"selftest: {len(bad)} lints passed what they should refuse")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
