"""The wheel's commands: each replaces this Python process with the program
of the same name in the package's bin/ (so exit status, signals and the
environment are the program's own)."""
import os
import sys

from . import bin_dir


def _exec(name):
    path = os.path.join(bin_dir(), name)
    try:
        os.execv(path, [path] + sys.argv[1:])
    except OSError as e:
        sys.stderr.write("%s: error: cannot run %s: %s\n" % (name, path, e.strerror))
        sys.exit(127)


def main():
    """``kcache`` and ``python -m kcache``: the store's tool."""
    _exec("kcache")


def run():
    """``kcache-run``: runs a command with the cache."""
    _exec("kcache-run")


if __name__ == "__main__":
    main()
