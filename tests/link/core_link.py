"""cuda.core's Linker (nvJitLink backend) on the inputs link_client made:
prints what a host sees (cubin digests, logs, errors) and writes each
cubin to DIR/core-<name>. Run by test_link.py with the project venv.

Usage: core_link.py DIR
"""
import hashlib
import os
import sys

from cuda.core import Linker, LinkerOptions, ObjectCode


def main():
    d = sys.argv[1]

    def read(name):
        with open(os.path.join(d, name), "rb") as f:
            return f.read()

    cases = [
        ("lto2", [("ltoir", "a.ltoir", "a"), ("ltoir", "b.ltoir", "b")],
         dict(arch="sm_90", link_time_optimization=True)),
        ("lto2-lineinfo", [("ltoir", "a.ltoir", "a"), ("ltoir", "b.ltoir", "b")],
         dict(arch="sm_90", link_time_optimization=True, lineinfo=True)),
        ("ptx2", [("ptx", "a.ptx", "a"), ("ptx", "b.ptx", "b")], dict(arch="sm_90")),
        ("undefined", [("ltoir", "u.ltoir", "u")], dict(arch="sm_90", link_time_optimization=True)),
    ]
    for name, inputs, opts in cases:
        objs = []
        for kind, f, n in inputs:
            data = read(f)
            objs.append(ObjectCode.from_ltoir(data, name=n) if kind == "ltoir"
                        else ObjectCode.from_ptx(data, name=n))
        linker = Linker(*objs, options=LinkerOptions(**opts))
        print("@" + name, linker.which_backend())
        try:
            out = linker.link("cubin")
            code = bytes(out.code)
            print("  cubin", len(code), hashlib.sha256(code).hexdigest())
            with open(os.path.join(d, "core-" + name), "wb") as f:
                f.write(code)
        except Exception as e:  # the link error, as the host sees it
            print("  error", type(e).__name__, str(e))
        print("  error log [%s]" % linker.get_error_log())
        print("  info log [%s]" % linker.get_info_log())
        linker.close()


if __name__ == "__main__":
    main()
