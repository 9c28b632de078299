#!/usr/bin/env python3
"""check_layers.py: one folder, one layer.

Reads the directory table of ARCHITECTURE.md (rows whose first cell is a
directory in backquotes, whose last cell lists the directories it may
depend on, in backquotes, or "nothing") and fails when a file crosses a
boundary the table forbids:

  - an `#include "..."` in a C file or header of directory D that resolves
    (next to the file, else through the include_directories() of D's
    meson.build) to a file of directory E, where E is neither D nor a
    directory D may depend on;
  - a meson.build of D that names a file or an include directory of such
    an E (files('../x/y.c'), include_directories('../x'), or a plain
    source string), or uses a variable that E's meson.build assigns
    (shim_config_src = files(...) used by store/meson.build).

A directory is the deepest table row that contains the file. Source files
in no row are reported too, so a new folder has to be placed in the table.
Directories the table marks as depending on "everything" (tests/) are not
checked.

Usage: check_layers.py ROOT [ARCHITECTURE.md]
       check_layers.py --self-test
Exit status 0 when the tree keeps the table, 1 with one line per crossing.
--self-test builds small trees in a temporary directory, each with one
planted crossing of a different kind, and checks that every one is
reported and that the clean tree is not.
"""
import os
import re
import sys

ROW = re.compile(r"^\|\s*`([^`]+)/`\s*\|")
DIR = re.compile(r"`([^`]+)/`")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
MESON_STR = re.compile(r"'([^'\n]+)'")
SRC_EXT = (".c", ".h")


def read_table(arch):
    """Returns {dir: set(allowed dirs) or None (everything)}."""
    table = {}
    with open(arch, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line)
            if not m:
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 3:
                continue
            d = m.group(1).strip("/")
            deps = cells[-1]
            if "everything" in deps:
                table[d] = None
            else:
                table[d] = {x.strip("/") for x in DIR.findall(deps)}
    return table


def owner_of(rel, table):
    """The deepest table directory holding path `rel` (relative to root)."""
    best = None
    for d in table:
        if rel == d or rel.startswith(d + "/"):
            if best is None or len(d) > len(best):
                best = d
    return best


def meson_include_dirs(root, d):
    """include_directories() named in d/meson.build, as root-relative dirs."""
    out = []
    mb = os.path.join(root, d, "meson.build")
    if not os.path.exists(mb):
        return out
    text = open(mb, encoding="utf-8").read()
    for call in re.finditer(r"include_directories\(([^)]*)\)", text):
        for s in MESON_STR.findall(call.group(1)):
            p = os.path.normpath(os.path.join(d, s))
            out.append(p)
    return out


def check(root, arch):
    table = read_table(arch)
    if not table:
        return ["%s: no directory table found" % arch]
    errors = []

    # Variables each directory's meson.build assigns (name -> directory).
    assigned = {}
    meson_text = {}
    for d in table:
        mb = os.path.join(root, d, "meson.build")
        if os.path.exists(mb):
            t = re.sub(r"#.*", "", open(mb, encoding="utf-8").read())
            meson_text[d] = t
            for name in re.findall(r"^\s*([A-Za-z_]\w*)\s*=(?!=)", t, re.M):
                assigned.setdefault(name, d)

    def allowed(src_dir, target_rel):
        tgt = owner_of(target_rel, table)
        if tgt is None:
            return True, None  # outside the project's layers (system, toolkit)
        deps = table[src_dir]
        return (deps is None or tgt == src_dir or tgt in deps), tgt

    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            # Not hidden folders, not build directories (any name: meson's
            # has meson-private/), not caches.
            dirnames[:] = [x for x in dirnames if not x.startswith(".") and
                           not os.path.isdir(os.path.join(dirpath, x, "meson-private")) and
                           x != "__pycache__"]
            continue
        for fn in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, fn))
            src = owner_of(rel, table)
            if fn.endswith(SRC_EXT) and src is None:
                errors.append("%s: in no directory of the table" % rel)
                continue
            if src is None or table[src] is None:
                continue
            if fn.endswith(SRC_EXT):
                text = open(os.path.join(root, rel), encoding="utf-8",
                            errors="replace").read()
                incdirs = meson_include_dirs(root, rel_dir)
                for inc in INCLUDE.findall(text):
                    cands = [os.path.normpath(os.path.join(rel_dir, inc))]
                    cands += [os.path.normpath(os.path.join(i, inc)) for i in incdirs]
                    hit = next((c for c in cands
                                if os.path.exists(os.path.join(root, c))), None)
                    if hit is None:
                        continue
                    ok, tgt = allowed(src, hit)
                    if not ok:
                        errors.append('%s: #include "%s" reaches %s/, which %s/ may not '
                                      "depend on" % (rel, inc, tgt, src))
            elif fn == "meson.build":
                text = open(os.path.join(root, rel), encoding="utf-8").read()
                text = re.sub(r"#.*", "", text)
                for s in MESON_STR.findall(text):
                    if "/" not in s and not s.endswith(SRC_EXT):
                        continue
                    p = os.path.normpath(os.path.join(rel_dir, s))
                    if not os.path.exists(os.path.join(root, p)):
                        continue
                    ok, tgt = allowed(src, p)
                    if not ok:
                        errors.append("%s: names '%s' in %s/, which %s/ may not depend on"
                                      % (rel, s, tgt, src))
                for name in sorted(set(re.findall(r"\b([A-Za-z_]\w*)\b", text))):
                    d = assigned.get(name)
                    if d is None or d == rel_dir:
                        continue
                    ok, tgt = allowed(src, os.path.join(d, "meson.build"))
                    if not ok:
                        errors.append("%s: uses %s, made in %s/meson.build, which %s/ may "
                                      "not depend on" % (rel, name, tgt, src))
    return errors


SELF_TABLE = """| directory | responsibility | may depend on |
|---|---|---|
| `low/` | x | nothing |
| `high/` | x | `low/` |
| `tests/` | x | everything |
"""


def self_test():
    import tempfile
    base = {
        "ARCHITECTURE.md": SELF_TABLE,
        "low/a.h": "int a(void);\n",
        "low/a.c": '#include "a.h"\nint a(void) { return 0; }\n',
        "low/meson.build": "low_src = files('a.c')\n",
        "high/b.c": '#include "../low/a.h"\nint b(void) { return a(); }\n',
        "high/meson.build": "high_lib = static_library('h', files('b.c'), low_src)\n",
        "tests/t.c": '#include "../high/b.c"\n',
    }
    planted = {
        "include": {"low/a.c": '#include "a.h"\n#include "../high/b.c"\n'},
        "meson file": {"low/meson.build": "low_src = files('a.c', '../high/b.c')\n"},
        "meson variable": {"low/meson.build": "low_src = files('a.c')\nx = high_lib\n"},
        "include dir": {"low/meson.build":
                        "low_src = files('a.c')\ninc = include_directories('../high')\n"},
        "unplaced file": {"other/c.c": "int c;\n"},
    }
    failures = 0
    for name, extra in [("clean", {})] + list(planted.items()):
        with tempfile.TemporaryDirectory() as root:
            files = dict(base)
            files.update(extra)
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w") as f:
                    f.write(text)
            errors = check(root, os.path.join(root, "ARCHITECTURE.md"))
            ok = (errors == []) if name == "clean" else (len(errors) >= 1)
            print("%s: %s: %s" % ("ok" if ok else "FAIL", name, errors or "no crossing"))
            failures += not ok
    return 1 if failures else 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) < 2:
        print("usage: check_layers.py ROOT [ARCHITECTURE.md]", file=sys.stderr)
        return 2
    root = argv[1]
    arch = argv[2] if len(argv) > 2 else os.path.join(root, "ARCHITECTURE.md")
    errors = check(root, arch)
    for e in errors:
        print(e)
    if errors:
        print("%d boundary crossing(s)" % len(errors))
        return 1
    print("layers: every include and meson file reference keeps the table")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
