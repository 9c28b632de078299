"""kcache: caches NVRTC compiles, nvJitLink links and driver JIT loads.

The package holds kcache's programs (bin/) and libraries (lib/); the
commands ``kcache`` (the store's tool), ``kcache-run`` (runs a command with
the cache) and ``python -m kcache`` (the tool) run them. See
``kcache-run --help``.
"""
import os

__all__ = ["bin_dir", "lib_dir", "shim_path"]

_here = os.path.dirname(os.path.abspath(__file__))


def bin_dir():
    """The package's bin/: kcache and kcache-run."""
    return os.path.join(_here, "bin")


def lib_dir():
    """The package's lib/: libkcache.so (the shim) and the store's libraries."""
    return os.path.join(_here, "lib")


def shim_path():
    """The shim to put in LD_PRELOAD (kcache-run does it for you)."""
    return os.path.join(lib_dir(), "libkcache.so")
