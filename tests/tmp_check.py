#!/usr/bin/env python3
"""tmp_check.py: every test cleans up after itself, also when it fails.

Every test runs with TMPDIR set to the build tree's tmp/ (tests/meson.build,
the default test setup). Two tests in every suite bracket a run:

  tmp_check.py before DIR   first (highest priority, alone): notes what DIR
                            already holds (an interrupted earlier run) in
                            DIR/../tmp-before.txt, and says so
  tmp_check.py after DIR    last (lowest priority, alone): fails when DIR
                            holds anything that was not there before the
                            run, listing it, and removes it so that the next
                            run starts clean

Exit 0 ok, 1 leftovers.
"""
import os
import shutil
import sys


def main():
    what, d = sys.argv[1], sys.argv[2]
    os.makedirs(d, exist_ok=True)
    note = os.path.join(os.path.dirname(os.path.abspath(d)), "tmp-before.txt")
    names = sorted(os.listdir(d))
    if what == "before":
        with open(note, "w") as f:
            f.write("".join(n + "\n" for n in names))
        if names:
            print("note: %s already holds %d entries (an interrupted run?): %s"
                  % (d, len(names), ", ".join(names[:20])))
        return 0
    try:
        with open(note) as f:
            before = set(f.read().split("\n"))
    except FileNotFoundError:
        before = set()
    left = [n for n in names if n not in before]
    for n in left:
        p = os.path.join(d, n)
        print("FAIL: left behind in TMPDIR: %s" % n)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass
    if left:
        print("%d entries left in %s by the tests of this run (removed now)" % (len(left), d))
        return 1
    print("ok: the tests of this run left nothing in %s" % d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
