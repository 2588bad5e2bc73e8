#!/usr/bin/env python3
"""Fails on a class or a function past the house's bounds (docs/architecture.md "Rooms").

In the programs (manager/, agent/, worker/, ctl/) and common/:
  - a `class` has at most 15 public methods (constructors, destructors and deleted members
    not counted) and at most 15 data members; a `struct` is plain data and is not counted;
  - at most 5 functions are over 120 lines, and none is over 200.
Every exception is listed below with its reason: at most 5 functions are allowed over 120
lines for good; what is marked debt is to be split. An exception that no longer applies is
an error too, so the list stays true.
Usage: shapes.py [REPO_ROOT]  (exit 1 and one line per problem)
"""
import os
import re
import sys

MAX_PUBLIC_METHODS = 15
MAX_DATA_MEMBERS = 15
LONG_FUNCTION = 120
MAX_LONG_FUNCTIONS = 5
MAX_FUNCTION = 200

# "path:Class" or "path:Function" -> why it may exceed the bounds. What is to be split is
# marked "debt" (issue R4 2/10 splits it); the others say why the shape is right.
DEBT = "debt (R4 2/10): "
CLASS_EXCEPTIONS = {
    "common/pipeline/topology.h:Topology": "a value type: one read-only accessor per "
    "question the engine asks of a rank's place",
    "manager/state/state_store.h:StateStore": "an interface: a load and a save per record "
    "kind, implemented by SQLite and etcd alike",
    "manager/state/state_store.h:SqliteStateStore": "implements StateStore",
    "manager/ha/etcd_store.h:EtcdStateStore": "implements StateStore, and its flush",
    "manager/state/manager_metrics.h:ManagerMetrics": "one member per metric family "
    "(docs/observability.md)",
}
FUNCTION_EXCEPTIONS = {
    "agent/main.cc:Run": "the agent program's flags and start-up, in order, read top to bottom",
    "common/base/subprocess.cc:RunCommand": "fork, pipes, poll and reap in one place: the "
    "signal-safety of the child side is easier to check read in one piece",
}

TOPS = ("common", "manager", "agent", "worker", "ctl")
STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')
RAW_STRING = re.compile(r'R"([^(]*)\((?:.|\n)*?\)\1"')


def clean(text):
    """The text without comments and string literals (same line count)."""
    text = RAW_STRING.sub(lambda m: '""' + "\n" * m.group(0).count("\n"), text)
    text = re.sub(r"/\*(?:.|\n)*?\*/", lambda m: "\n" * m.group(0).count("\n"), text)
    out = []
    for line in text.split("\n"):
        line = STRING.sub('""', line)
        i = line.find("//")
        out.append(line[:i] if i >= 0 else line)
    return out


def functions(lines):
    """(name, first line, line count) of each function body at namespace level."""
    found = []
    depth = 0          # braces other than namespaces'
    ns_depth = 0
    start = None
    name = None
    for n, line in enumerate(lines):
        stripped = line.strip()
        if depth == 0 and re.match(r"^(inline\s+)?namespace\b[^;]*\{\s*$", stripped):
            ns_depth += 1
            continue
        if depth == 0 and stripped.startswith("}") and ns_depth and "namespace" in line:
            ns_depth -= 1
            continue
        for ch in line:
            if ch == "{":
                if depth == 0:
                    start, name = n, None
                    # The signature: back to the line after a blank, ';', '}' or preprocessor.
                    k = n
                    while k > 0:
                        prev = lines[k - 1].strip()
                        if not prev or prev.endswith((";", "}", "{")) or prev.startswith("#") or \
                                prev.endswith(":") and not prev.endswith("::"):
                            break
                        k -= 1
                    sig = " ".join(lines[k:n + 1])
                    if re.search(r"\b(class|struct|enum|union)\b", sig.split("(")[0]) or \
                            "=" in sig.split("(")[0] or "(" not in sig:
                        name = None
                    else:
                        m = re.search(r"([~\w:]+)\s*\(", sig)
                        name = m.group(1).split("::")[-1] if m else None
                    start = k
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and name:
                    found.append((name, start + 1, n - start + 1))
                if depth < 0:
                    depth = 0
    return found


def classes(lines):
    """(name, first line, public methods, data members) of each `class` body."""
    found = []
    n = 0
    while n < len(lines):
        m = re.match(r"^\s*class\s+(?:\[\[\w+\]\]\s+)?(\w+)\b[^;]*$", lines[n])
        if not m or "(" in lines[n].split("class")[0]:
            n += 1
            continue
        name = m.group(1)
        # Find the opening brace.
        k = n
        while k < len(lines) and "{" not in lines[k]:
            if ";" in lines[k]:
                break
            k += 1
        if k >= len(lines) or "{" not in lines[k]:
            n += 1
            continue
        depth = 0
        access = "private"
        public_methods = 0
        members = 0
        stmt = ""
        j = k
        started = False
        while j < len(lines):
            line = lines[j]
            for idx, ch in enumerate(line):
                if ch == "{":
                    depth += 1
                    started = True
                    if depth == 2:  # an inline body or a nested type: its text is not counted
                        stmt += "{}"
                elif ch == "}":
                    depth -= 1
                    if depth == 1 and stmt.rstrip().endswith("{}") and "(" in stmt:
                        # an inline function body ended: the declaration is complete
                        public_methods, members = count(stmt, name, access, public_methods,
                                                        members)
                        stmt = ""
                elif depth == 1:
                    stmt += ch
                    if ch == ";":
                        public_methods, members = count(stmt, name, access, public_methods,
                                                        members)
                        stmt = ""
                    elif ch == ":" and re.fullmatch(r"\s*(public|private|protected)\s*:",
                                                    stmt):
                        access = stmt.strip()[:-1]
                        stmt = ""
                if started and depth == 0:
                    break
            if started and depth == 0:
                break
            if depth == 1:
                stmt += " "
            j += 1
        found.append((name, n + 1, public_methods, members))
        n = j + 1
    return found


def count(stmt, cls, access, public_methods, members):
    s = " ".join(stmt.split())
    s = s.replace("{}", "").strip().rstrip(";").strip()
    if not s or re.match(r"^(using|typedef|friend|static_assert|enum|struct|class|template)\b", s):
        return public_methods, members
    head = s.split("(")[0]
    if "operator" in head or s.endswith("= delete"):  # operators and deleted members: not counted
        return public_methods, members
    if "(" in s and "=" not in head:
        # A function (or a member initialized with (...), rare here: counted as a method).
        fname = re.findall(r"[~\w]+", head)
        fname = fname[-1] if fname else ""
        if fname in (cls, "~" + cls) or "operator" in head or s.endswith("= delete"):
            return public_methods, members
        if access == "public":
            public_methods += 1
        return public_methods, members
    if re.match(r"^(static|constexpr)\b", s):
        return public_methods, members
    return public_methods, members + 1


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    problems = []
    long_functions = []
    used = set()
    for top in TOPS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for fname in sorted(files):
                if not fname.endswith((".h", ".cc")) or fname.endswith("_test.cc"):
                    continue
                full = os.path.join(dirpath, fname)
                rel = os.path.relpath(full, root)
                with open(full, encoding="utf-8") as f:
                    lines = clean(f.read())
                for cname, line, pub, mem in classes(lines):
                    key = f"{rel}:{cname}"
                    if pub > MAX_PUBLIC_METHODS or mem > MAX_DATA_MEMBERS:
                        if key in CLASS_EXCEPTIONS:
                            used.add(key)
                            continue
                        problems.append(f"{rel}:{line}: class {cname}: {pub} public methods, "
                                        f"{mem} data members (at most {MAX_PUBLIC_METHODS} "
                                        f"and {MAX_DATA_MEMBERS}): split it")
                if not fname.endswith(".cc"):
                    continue
                for name, line, length in functions(lines):
                    key = f"{rel}:{name}"
                    if length <= LONG_FUNCTION:
                        continue
                    long_functions.append((rel, line, name, length))
                    if key not in FUNCTION_EXCEPTIONS:
                        problems.append(f"{rel}:{line}: {name} is {length} lines (over "
                                        f"{LONG_FUNCTION}): split it, or list it with its reason")
                        continue
                    used.add(key)
                    debt = FUNCTION_EXCEPTIONS[key].startswith(DEBT)
                    if length > MAX_FUNCTION and not debt:
                        problems.append(f"{rel}:{line}: {name} is {length} lines (at most "
                                        f"{MAX_FUNCTION}): split it")
    allowed = [k for k in FUNCTION_EXCEPTIONS if not FUNCTION_EXCEPTIONS[k].startswith(DEBT)]
    if len(allowed) > MAX_LONG_FUNCTIONS:
        problems.append(f"{len(allowed)} functions allowed over {LONG_FUNCTION} lines (at most "
                        f"{MAX_LONG_FUNCTIONS}): {', '.join(allowed)}")
    for key in sorted(set(CLASS_EXCEPTIONS) | set(FUNCTION_EXCEPTIONS)):
        if key not in used:
            problems.append(f"{key}: listed as an exception but within bounds (or gone): "
                            "remove it from tests/lint/shapes.py")
    for p in problems:
        print(p)
    debts = [k for k in used if (CLASS_EXCEPTIONS.get(k) or FUNCTION_EXCEPTIONS.get(k, ""))
             .startswith(DEBT)]
    print(f"shapes: {len(long_functions)} functions over {LONG_FUNCTION} lines, "
          f"{len(used)} listed exceptions ({len(debts)} of them debt), {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
