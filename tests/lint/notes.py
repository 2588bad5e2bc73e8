#!/usr/bin/env python3
"""Every `Note [X]` reference in the sources has exactly one definition.

A Note is defined where its name is followed by a colon (`// Note [Rescue]: a survivor ...`)
and referenced anywhere else (`(Note [Rescue] in checkpoint.cc)`). A name may wrap across
comment lines. Usage: notes.py [REPO_ROOT]  (exit 1 and one line per problem)
"""
import collections
import os
import re
import sys

DIRS = ("common", "manager", "agent", "worker", "ctl", "proto", "tests", "bench", "examples")
NOTE = re.compile(r"Note \[([^\]]+)\](:?)")
# A reference that says where the Note is: "Note [X] in file.cc" or "Note [X] (dir/file.cc)".
WHERE = re.compile(r"\s*(?:in|\()\s*`?([\w./-]+\.(?:cc|h|py|proto))`?")
WRAP = re.compile(r"\n[ \t]*(//|#)[ \t]*")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.abspath(root)
    defs = collections.defaultdict(list)
    refs = collections.defaultdict(list)
    located = []  # (title, file named by the reference, referring file)
    for top in DIRS:
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("node_modules", "corpus")]
            for name in files:
                if not name.endswith((".h", ".cc", ".proto", ".py", ".cmake")) and name != "CMakeLists.txt":
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                if rel == "tests/lint/notes.py":
                    continue
                with open(full, encoding="utf-8") as f:
                    text = WRAP.sub(" ", f.read())
                for m in NOTE.finditer(text):
                    title = " ".join(m.group(1).split())
                    (defs if m.group(2) else refs)[title].append(rel)
                    where = WHERE.match(text, m.end())
                    if not m.group(2) and where:
                        located.append((title, where.group(1), rel))
    bad = []
    for title, where in sorted(defs.items()):
        if len(where) > 1:
            bad.append(f"Note [{title}] is defined {len(where)} times: {', '.join(where)}")
    for title, where in sorted(refs.items()):
        if title not in defs:
            bad.append(f"Note [{title}] is referenced ({', '.join(sorted(set(where)))}) "
                       "but never defined")
    for title, named, rel in located:
        if title not in defs or len(defs[title]) != 1:
            continue
        actual = defs[title][0]
        if not (actual == named or actual.endswith("/" + named)):
            bad.append(f"{rel}: Note [{title}] is said to be in {named}, but it is in {actual}")
    for b in bad:
        print(b)
    print(f"notes: {len(defs)} defined, {sum(len(w) for w in refs.values())} references, "
          f"{len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
