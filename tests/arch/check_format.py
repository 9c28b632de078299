#!/usr/bin/env python3
"""check_format.py: every C file and header of the project is as
clang-format (.clang-format in the root) writes it.

Usage: check_format.py ROOT CLANG_FORMAT
Exit 0 when none would change; 1 with one line per file that would.
"""
import os
import subprocess
import sys

DIRS = ("common", "shim", "store", "tools", "tests")


def main(argv):
    root, tool = argv[1], argv[2]
    files = []
    for d in DIRS:
        for dirpath, dirnames, names in os.walk(os.path.join(root, d)):
            dirnames[:] = [x for x in dirnames if not x.startswith(".") and x != "corpus"]
            files += [os.path.join(dirpath, n) for n in names if n.endswith((".c", ".h"))]
    bad = []
    for f in sorted(files):
        p = subprocess.run([tool, "--dry-run", "--Werror", "--style=file", f],
                           cwd=root, capture_output=True, text=True)
        if p.returncode != 0:
            bad.append(os.path.relpath(f, root))
    for f in bad:
        print("not formatted (clang-format -i %s): %s" % (f, f))
    print("%d of %d files formatted" % (len(files) - len(bad), len(files)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
