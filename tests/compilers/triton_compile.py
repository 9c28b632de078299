"""Compiles a 128x128x64 fp16 matmul with Triton for sm_90 on the CPU
(Triton's real make_cubin path: it runs its bundled ptxas on a temporary
PTX file) and prints the cubin's digest. TRITON_CACHE_DIR is the caller's.
With an argument, the PTX is written there too (scripts/bench's large
PTX)."""
import hashlib
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    b = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        acc += tl.dot(tl.load(a), tl.load(b))
        a += BK * sak
        b += BK * sbk
    c = c_ptr + rm[:, None] * scm + rn[None, :] * scn
    tl.store(c, acc.to(tl.float16))


sig = {n: "*fp16" for n in ("a_ptr", "b_ptr", "c_ptr")}
sig.update({n: "i32" for n in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn")})
sig.update({n: "constexpr" for n in ("BM", "BN", "BK")})
src = triton.compiler.ASTSource(fn=matmul_kernel, signature=sig,
                                constexprs={"BM": 128, "BN": 128, "BK": 64})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
print("cubin", len(k.asm["cubin"]), hashlib.sha256(k.asm["cubin"]).hexdigest())
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        f.write(k.asm["ptx"])
sys.stdout.flush()
