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

Inside store/db/, one file, one layer: the table under the heading
"store/db/ in layers" (rows `layer` | files in backquotes | the layers it
may call, in backquotes, or "nothing"; listed top first) places every
file of store/db/, and the check fails when

  - a layer may call one listed above it, or one the table does not have
    (the table itself would make a circle);
  - a file of store/db/ is in no row, in two, or a row names a file that
    is not there;
  - a file's `#include "..."` reaches a file of store/db/ in a layer it may
    not call (its own layer's files it may include);
  - a file uses a kc__ or KC__ name (a function, a variable, a type, a
    macro, an enum constant) that a file of a layer it may not call
    defines: a call up, or across (into another .c of its own layer; the
    types and macros of its own layer's headers are shared). Definitions:
    a .c's functions and variables that are not static; a header's struct,
    union and enum tags, typedefs, macros, enum constants and static inline
    functions. A header's prototypes declare, they do not use, the
    functions of its own layer.

Usage: check_layers.py ROOT [ARCHITECTURE.md]
       check_layers.py --self-test
Exit status 0 when the tree keeps the table, 1 with one line per crossing.
--self-test builds small trees in a temporary directory, each with one
planted crossing of a different kind (of folders, and of store/db/'s
layers), and checks that every one is reported and that the clean tree
is not.
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
                # A name after '.' is a method (x.found()), not a variable.
                for name in sorted(set(re.findall(r"(?<![.\w])([A-Za-z_]\w*)\b", text))):
                    d = assigned.get(name)
                    if d is None or d == rel_dir:
                        continue
                    ok, tgt = allowed(src, os.path.join(d, "meson.build"))
                    if not ok:
                        errors.append("%s: uses %s, made in %s/meson.build, which %s/ may "
                                      "not depend on" % (rel, name, tgt, src))
    return errors


# ---- store/db/: one file, one layer ------------------------------------------

# Each folder whose files are layered, and how: (folder, heading of its table
# in ARCHITECTURE.md, whether a layer's files may call each other). store/db/:
# one file, one layer, none calls another of its own. shim/: a family (the
# files of one library's hooks) or the shared mechanism is one layer whose
# files call each other, never in a circle; a family calls no other family
# but one below it in the table.
FILES_TABLES = [
    ("store/db", re.compile(r"^#+\s.*`store/db/` in layers"), False),
    ("shim", re.compile(r"^#+\s.*`shim/` in layers"), True),
]
FILES_DIR = "store/db"
FILES_HEADING = FILES_TABLES[0][1]
LAYER_ROW = re.compile(r"^\|\s*`([A-Za-z_][\w-]*)`\s*\|")
TICKS = re.compile(r"`([^`]+)`")
FILE_EXT = (".c", ".h", ".cc")
NAME = re.compile(r"\b((?:kc|KC)__\w+)\b")


def read_file_table(arch, heading=FILES_HEADING):
    """[(layer, [files], [may call])] from a folder's layer table, top first."""
    rows = []
    inside = False
    with open(arch, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                inside = bool(heading.match(line))
                continue
            if not inside:
                continue
            m = LAYER_ROW.match(line)
            if not m:
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 3:
                continue
            rows.append((m.group(1), TICKS.findall(cells[1]),
                         [] if cells[-1] == "nothing" else TICKS.findall(cells[-1])))
    return rows


def strip_c(text):
    """C text without comments and string or character literals."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\\n])+'", "''", text)
    return text


FUNC_DEF = re.compile(r"^(?!static\b|extern\b|typedef\b)[A-Za-z_][\w \t\*]*?\b((?:kc|KC)__\w+)"
                      r"\s*\([^;{}]*\)\s*(?:__attribute__\s*\(\(.*?\)\)\s*)?\{", re.M | re.S)
VAR_DEF = re.compile(r"^(?!static\b|extern\b|typedef\b|return\b)[A-Za-z_][\w \t\*]*?\b"
                     r"((?:kc|KC)__\w+)\s*(?:\[[^\]]*\]\s*)*(?:=|;)", re.M)


def definitions(fn, text):
    """The kc__/KC__ names file fn (text without comments) defines."""
    out = set()
    if fn.endswith((".c", ".cc")):
        out.update(m.group(1) for m in FUNC_DEF.finditer(text))
        out.update(m.group(1) for m in VAR_DEF.finditer(text))
    else:
        out.update(re.findall(r"\b(?:struct|union|enum)\s+((?:kc|KC)__\w+)\s*\{", text))
        out.update(re.findall(r"#\s*define\s+((?:kc|KC)__\w+)", text))
        out.update(re.findall(r"typedef\b[^;]*?\b((?:kc|KC)__\w+)\s*(?:\)\s*\([^;]*)?;", text))
        out.update(re.findall(r"\bstatic\s+inline\b[^;{(]*?\b((?:kc|KC)__\w+)\s*\(", text))
        for body in re.findall(r"\benum\b[^{;]*\{([^}]*)\}", text):
            out.update(re.findall(r"\b((?:kc|KC)__\w+)\b\s*(?:=[^,]*)?(?:,|$)", body))
    # Local macros (#define inside a .c) are the file's own too.
    if fn.endswith((".c", ".cc")):
        out.update(re.findall(r"#\s*define\s+((?:kc|KC)__\w+)", text))
    return out


def declared(text):
    """Names a header declares (prototypes): a name followed by '('."""
    return set(re.findall(r"\b((?:kc|KC)__\w+)\s*\(", text))


def circles(edges):
    """The circles of a graph {a: {b: name}}: one list [a, b, ..., a] each."""
    out, state, stack = [], {}, []

    def visit(a):
        state[a] = 1
        stack.append(a)
        for b in sorted(edges.get(a, ())):
            if state.get(b) == 1:
                out.append(stack[stack.index(b):] + [b])
            elif b not in state:
                visit(b)
        stack.pop()
        state[a] = 2

    for a in sorted(edges):
        if a not in state:
            visit(a)
    return out


def check_files(root, arch, files_dir=FILES_DIR, heading=FILES_HEADING, across=False):
    FILES_DIR = files_dir
    rows = read_file_table(arch, heading)
    d = os.path.join(root, FILES_DIR)
    if not os.path.isdir(d):
        return []
    if not rows:
        return ["%s: no table of %s/'s layers found" % (arch, FILES_DIR)]
    errors = []
    rank = {}
    layer_of = {}
    may = {}
    for i, (layer, files, calls) in enumerate(rows):
        if layer in rank:
            errors.append("%s: layer %s is in the table twice" % (FILES_DIR, layer))
        rank[layer] = i
        may[layer] = set(calls)
        for f in files:
            if f in layer_of:
                errors.append("%s/%s: in two layers (%s, %s)" % (FILES_DIR, f, layer_of[f], layer))
            layer_of[f] = layer
    for layer, files, calls in rows:
        for c in calls:
            if c not in rank:
                errors.append("%s: layer %s may call %s, which the table does not have"
                              % (FILES_DIR, layer, c))
            elif rank[c] <= rank[layer]:
                errors.append("%s: layer %s may call %s, which is not below it in the table"
                              % (FILES_DIR, layer, c))
    present = sorted(f for f in os.listdir(d)
                     if f.endswith(FILE_EXT) and os.path.isfile(os.path.join(d, f)))
    for f in present:
        if f not in layer_of:
            errors.append("%s/%s: in no layer of the table" % (FILES_DIR, f))
    for f in sorted(layer_of):
        if f not in present:
            errors.append("%s/%s: in the table, not in %s/" % (FILES_DIR, f, FILES_DIR))

    texts = {}
    defs = {}
    for f in present:
        raw = open(os.path.join(d, f), encoding="utf-8", errors="replace").read()
        texts[f] = (raw, strip_c(raw))
        defs[f] = definitions(f, texts[f][1])
    definer = {}
    for f in present:
        for n in defs[f]:
            definer.setdefault(n, set()).add(f)

    def allowed(src, tgt):
        ls, lt = layer_of.get(src), layer_of.get(tgt)
        if ls is None or lt is None:
            return True  # reported above
        return lt == ls or lt in may[ls]

    edges = {}
    for f in present:
        if f not in layer_of:
            continue
        raw, text = texts[f]
        ls = layer_of[f]
        for inc in INCLUDE.findall(raw):
            tgt = os.path.normpath(os.path.join(FILES_DIR, inc))
            if os.path.dirname(tgt) != FILES_DIR:
                continue
            tf = os.path.basename(tgt)
            if tf in layer_of and not allowed(f, tf):
                errors.append('%s/%s: #include "%s" reaches layer %s, which layer %s may not call'
                              % (FILES_DIR, f, inc, layer_of[tf], ls))
        decl = declared(text) if f.endswith(".h") else set()
        seen = set()
        for n in NAME.findall(text):
            if n in seen or n in defs[f]:
                continue
            seen.add(n)
            for g in sorted(definer.get(n, ())):
                if g == f or g not in layer_of:
                    continue
                lt = layer_of[g]
                if lt == ls:
                    if g.endswith(".h") or (f.endswith(".h") and n in decl):
                        continue  # the layer's shared types, or its header's prototypes
                    if across:
                        edges.setdefault(f, {}).setdefault(g, n)
                        continue
                    errors.append("%s/%s: uses %s of %s, a file of its own layer %s (a call across)"
                                  % (FILES_DIR, f, n, g, ls))
                elif lt not in may[ls]:
                    how = "up" if rank[lt] < rank[ls] else "across"
                    errors.append("%s/%s: uses %s of %s, in layer %s, which layer %s may not call "
                                  "(a call %s)" % (FILES_DIR, f, n, g, lt, ls, how))
    for c in circles(edges):
        errors.append("%s: a circle in layer %s: %s" % (
            FILES_DIR, layer_of[c[0]],
            " -> ".join("%s (%s)" % (a, edges[a][b]) for a, b in zip(c, c[1:])) + " -> " + c[-1]))
    return errors


def check_all_files(root, arch):
    errors = []
    for files_dir, heading, across in FILES_TABLES:
        errors += check_files(root, arch, files_dir, heading, across)
    return errors


SELF_TABLE = """| directory | responsibility | may depend on |
|---|---|---|
| `low/` | x | nothing |
| `high/` | x | `low/` |
| `tests/` | x | everything |
| `store/` | x | nothing |
| `store/db/` | x | `store/` |
| `shim/` | x | nothing |

## `store/db/` in layers

| layer | files | may call |
|---|---|---|
| `top` | `top.c` `top.h` | `mid`, `bottom` |
| `mid` | `mid.h` `m1.c` `m2.c` | `bottom` |
| `bottom` | `bottom.c` `bottom.h` | nothing |

## `shim/` in layers

| layer | files | may call |
|---|---|---|
| `entry` | `e.c` | `fam`, `mech` |
| `fam` | `f.c` | `mech` |
| `mech` | `m.h` `m1.c` `m2.c` | nothing |
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
        "store/db/bottom.h": "struct kc__b { int x; };\n#define KC__B_MAX 4\nint kc__b_get(void);\n",
        "store/db/bottom.c": '#include "bottom.h"\nint kc__b_get(void)\n{\n    return KC__B_MAX;\n}\n',
        "store/db/mid.h": '#include "bottom.h"\nstruct kc__m { struct kc__b b; };\n'
                          "int kc__m1(void);\nint kc__m2(void);\n",
        "store/db/m1.c": '#include "mid.h"\nint kc__m1(void)\n{\n    struct kc__m m;\n'
                         "    return kc__b_get();\n}\n",
        "store/db/m2.c": '#include "mid.h"\nint kc__m2(void)\n{\n    return 0;\n}\n',
        "store/db/top.h": "int kc__top(void);\n",
        "store/db/top.c": '#include "top.h"\n#include "mid.h"\nint kc__top(void)\n{\n'
                          "    return kc__m1() + kc__m2();\n}\n",
    }
    base.update({
        "shim/m.h": "int kc__m1(void);\nint kc__m2(void);\n",
        "shim/m1.c": '#include "m.h"\nint kc__m1(void)\n{\n    return kc__m2();\n}\n',
        "shim/m2.c": '#include "m.h"\nint kc__m2(void)\n{\n    return 0;\n}\n',
        "shim/f.c": '#include "m.h"\nint kc__f(void)\n{\n    return kc__m1();\n}\n',
        "shim/e.c": "int kc__f(void);\nint main(void)\n{\n    return kc__f();\n}\n",
    })
    planted = {
        "include": {"low/a.c": '#include "a.h"\n#include "../high/b.c"\n'},
        "meson file": {"low/meson.build": "low_src = files('a.c', '../high/b.c')\n"},
        "meson variable": {"low/meson.build": "low_src = files('a.c')\nx = high_lib\n"},
        "include dir": {"low/meson.build":
                        "low_src = files('a.c')\ninc = include_directories('../high')\n"},
        "unplaced file": {"other/c.c": "int c;\n"},
        "store/db call across": {"store/db/m2.c": '#include "mid.h"\nint kc__m2(void)\n{\n'
                                                  "    return kc__m1();\n}\n"},
        "store/db call up": {"store/db/bottom.c": '#include "bottom.h"\nint kc__top(void);\n'
                                                  "int kc__b_get(void)\n{\n    return kc__top();\n}\n"},
        "store/db include up": {"store/db/bottom.c": '#include "bottom.h"\n#include "mid.h"\n'
                                                     "int kc__b_get(void)\n{\n    return 0;\n}\n"},
        "store/db header declares up": {"store/db/bottom.h": "struct kc__b { int x; };\n"
                                        "#define KC__B_MAX 4\nint kc__b_get(void);\nint kc__top(void);\n"},
        "store/db file in no layer": {"store/db/new.c": "int kc__new(void)\n{\n    return 0;\n}\n"},
        "shim circle in a layer": {"shim/m2.c": '#include "m.h"\nint kc__m2(void)\n{\n'
                                              "    return kc__m1();\n}\n"},
        "shim mechanism calls a family": {"shim/m2.c": '#include "m.h"\nint kc__f(void);\n'
                                                     "int kc__m2(void)\n{\n    return kc__f();\n}\n"},
        "shim file in no layer": {"shim/g.c": "int kc__g(void)\n{\n    return 0;\n}\n"},
        "store/db table circle": {"ARCHITECTURE.md": SELF_TABLE.replace(
            "| `bottom.c` `bottom.h` | nothing |", "| `bottom.c` `bottom.h` | `top` |")},
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
            arch = os.path.join(root, "ARCHITECTURE.md")
            errors = check(root, arch) + check_all_files(root, arch)
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
    errors = check(root, arch) + check_all_files(root, arch)
    for e in errors:
        print(e)
    if errors:
        print("%d boundary crossing(s)" % len(errors))
        return 1
    print("layers: every include and meson file reference keeps the table; "
          "every file of store/db/ and shim/ calls only the layers below it, never in a circle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
