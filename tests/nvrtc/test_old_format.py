#!/usr/bin/env python3
"""Entries of the previous record format are misses, never misread.

Usage: test_old_format.py CLIENT OLD_FORMAT_TOOL

For each byte order the previous build may have written its NVRTC replay
records and manifests in (`le`: a little-endian host, `be`: a big-endian
one): a cold run through the shim fills a store; kc-old-format rewrites
every entry (database, hot files, spool) into the previous layout (record
headers of format 1, replay records and manifests with the previous
magics, host byte order) under the very keys the current build looks up;
the next run must miss every cacheable compile, silently: its outputs,
return codes and stderr equal NVRTC's own (the stats line aside), no
error counted. A run after it hits again: what the miss recompiled
replaced the old entries. A third case rewrites only the replay records
(big-endian), so lookups get past the current manifests to them.

Environment (tests/meson.build): KCACHE_SHIM, the shim to preload.
Exit status 0 on success, 1 on a failed check (with a message).
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import test_nvrtc as tn  # noqa: E402
from kctest import rm_settled  # noqa: E402


def plant(tool, store, order, only_nvrtc):
    args = [tool, store, order] + (["--only-nvrtc"] if only_nvrtc else [])
    p = subprocess.run(args, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    tn.check(p.returncode == 0,
             f"kc-old-format {order}: exit {p.returncode}: {p.stderr!r}")
    out = p.stdout.decode().strip()
    print(f"  {order}: {out}", flush=True)
    words = out.replace(",", " ").replace("(", " ").replace(")", " ").split()
    nvrtc = int(words[words.index("nvrtc") + 1])
    manifest = int(words[words.index("manifest") + 1])
    tn.check(nvrtc > 0 and (manifest > 0) != only_nvrtc,
             f"kc-old-format {order}: not what was asked ({out})")


def one_order(env, client, tool, ref, order, only_nvrtc=False):
    if only_nvrtc:
        order_label = order + ", replay records only"
    else:
        order_label = order
    store = env.store("old-" + order + ("-nvrtc" if only_nvrtc else ""))
    cold = env.run(f"{order_label}: cold", client, store=store, KCACHE_STATS=1)
    tn.same_dump(ref, cold)
    tn.expect_cold(cold)
    plant(tool, store, order, only_nvrtc)

    old = env.run(f"{order_label}: over previous-format entries", client,
                  store=store, KCACHE_STATS=1)
    tn.same_dump(ref, old)
    tn.same_streams(ref, old, strip_stats=True)
    hits, misses, passthrough, stores, errors = old.stats()
    tn.check(hits == 0,
             f"{old.label}: hits={hits}: an entry of the previous format "
             f"was served")
    tn.check(errors == 0,
             f"{old.label}: errors={errors}: an entry of the previous "
             f"format was read as the current one")
    tn.expect_cold(old)

    again = env.run(f"{order_label}: warm again", client, store=store,
                    KCACHE_STATS=1)
    tn.same_dump(ref, again)
    tn.same_streams(ref, again, strip_stats=True)
    tn.expect_warm(again)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    client, tool = sys.argv[1:]
    tmp = tempfile.mkdtemp(prefix="kcache-oldfmt-")
    try:
        env = tn.Env(tmp)
        ref = env.run("no shim", client, shim=False)
        for order in ("le", "be"):
            one_order(env, client, tool, ref, order)
        one_order(env, client, tool, ref, "be", only_nvrtc=True)
    except tn.Failure as e:
        print(f"FAIL old-format: {e}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as e:
        print(f"FAIL old-format: timed out: {e}", file=sys.stderr)
        return 1
    finally:
        rm_settled(tmp)
    print("PASS old-format")
    return 0


if __name__ == "__main__":
    sys.exit(main())
