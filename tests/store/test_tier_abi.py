#!/usr/bin/env python3
"""test_tier_abi.py: the shim refuses a store library of another ABI
(KC_STORE_ABI), suite `store`.

A lookup the key filter cannot rule out makes the shim's front load the
store library for its database tier. Given a library of ABI 1 (the table
before the store became a chain of tiers; tests/store/old_abi_store.c,
through KCACHE_STORE_LIB), the shim says so once, serves what needs no
database, and the compile's result is unchanged: a miss, compiled and
stored. Real NVRTC compiles, as test_front.py.
Usage: test_tier_abi.py OLD_ABI_LIB. Exit 0 pass, 1 fail, 77 skip.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_front as tf  # noqa: E402


def main():
    old = sys.argv[1] if len(sys.argv) > 1 else ""
    if not (os.path.exists(tf.BENCH) and os.path.exists(tf.SHIM) and os.path.exists(tf.TOOL)
            and os.path.exists(old)):
        print("skip: needs nvrtc_bench, the shim, the tool and the ABI 1 library")
        return 77
    d = tempfile.mkdtemp(prefix="kc-tier-abi-")
    os.chmod(d, 0o700)
    try:
        with open(os.path.join(d, "x.cu"), "w") as f:
            f.write('extern "C" __global__ void k_x(float *p) { p[threadIdx.x] *= 2.0f; }\n')
        s, _, ptx_x, _ = tf.run(d, "x", "x0")
        tf.check(s is not None and s[1] == 1 and s[2] == 1, "empty store: a miss, stored (%s)"
                 % (s,))
        tf.drain(d)
        # No hot files: only the database holds the entry, so the filter
        # says "maybe" and the front loads the store library.
        for f in tf.hot_files(d):
            os.unlink(os.path.join(d, "c", "hot", f))
        s, loaded, ptx, warns = tf.run(d, "x", "x1", extra={"KCACHE_STORE_LIB": old})
        tf.check(ptx == ptx_x, "an ABI 1 library: the compile's PTX")
        tf.check(not loaded, "an ABI 1 library is not used")
        tf.check(len(warns) == 1 and "does not match this shim" in warns[0],
                 "an ABI 1 library: one warning (%s)" % warns)
        tf.check(s is not None and s[0] == 0 and s[1] == 1 and s[3] == 0,
                 "an ABI 1 library: a miss, compiled, no error (%s)" % (s,))
        tf.drain(d)
        for f in tf.hot_files(d):
            os.unlink(os.path.join(d, "c", "hot", f))
        s, loaded, ptx, warns = tf.run(d, "x", "x2")
        tf.check(loaded and s is not None and s[0] == 1 and ptx == ptx_x and warns == [],
                 "this build's library: a hit through the database (%s, %s)" % (s, warns))
    finally:
        tf.rm_settled(d)
    if tf.failures:
        print("%d failure(s):" % len(tf.failures))
        for f in tf.failures:
            print("  " + f)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
