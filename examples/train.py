#!/usr/bin/env python3
"""A training job's kernel start-up: a realistic kernel set compiled through
cuda.core (cuda-python), the way a framework JIT-compiles its kernels at
start-up. Only compiles -- no GPU is needed; NVRTC runs on the CPU.

Run it twice under kcache and the second start-up compiles nothing:

    scripts/kcache-run --stats -- .venv/bin/python examples/train.py

Prints one JSON line per kernel, then one summary line:
    {"kernel": "softmax", "compile_ms": 231.4, "target": "cubin", "bytes": 9120}
    {"summary": true, "kernels": 6, "total_ms": 4120.7}

Options:
    --arch sm_XX        target architecture (default sm_90)
    --target T          cubin (default), ptx or ltoir; "ptx" makes cuda.core
                        ask the driver for its version, so it needs a libcuda
    --repeat N          compile the set N times in this process (default 1)
    --program-cache DIR also pass cuda.core's own FileStreamProgramCache at DIR
                        (cuda.core refuses it for compiles with include paths
                        or name expressions; those compile without it and are
                        marked "program_cache": "unsupported")
    --only a,b          compile only these kernels
"""
import argparse
import json
import os
import sys
import time

from cuda.core import Program, ProgramOptions

TOOLKIT = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or \
    "/usr/local/cuda"
CCCL = os.path.join(TOOLKIT, "include", "cccl")

REDUCE_CUB = r"""
#include <cub/block/block_reduce.cuh>

template <int BLOCK>
__device__ void block_sum(const float *in, float *out, int n)
{
    using Reduce = cub::BlockReduce<float, BLOCK>;
    __shared__ typename Reduce::TempStorage tmp;
    float acc = 0.0f;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK)
        acc += in[i];
    float total = Reduce(tmp).Sum(acc);
    if (threadIdx.x == 0) atomicAdd(out, total);
}

extern "C" __global__ void __launch_bounds__(256)
reduce_sum(const float *in, float *out, int n)
{
    block_sum<256>(in, out, n);
}
"""

SOFTMAX = r"""
__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One warp per row. */
extern "C" __global__ void softmax(const float *x, float *y, int rows, int cols)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float *xr = x + (size_t)row * cols;
    float *yr = y + (size_t)row * cols;
    float m = __int_as_float(0xff800000); /* -inf */
    for (int c = lane; c < cols; c += 32) m = fmaxf(m, xr[c]);
    m = warp_max(m);
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s += __expf(xr[c] - m);
    s = warp_sum(s);
    float inv = 1.0f / s;
    for (int c = lane; c < cols; c += 32) yr[c] = __expf(xr[c] - m) * inv;
}
"""

LAYERNORM = r"""
template <int BLOCK>
__device__ float block_sum(float v, float *shared)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x < BLOCK / 32 ? shared[threadIdx.x] : 0.0f;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    float r = shared[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void __launch_bounds__(256)
layernorm(const float *x, const float *gamma, const float *beta, float *y,
          int cols, float eps)
{
    __shared__ float shared[32];
    const float *xr = x + (size_t)blockIdx.x * cols;
    float *yr = y + (size_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += 256) s += xr[c];
    float mean = block_sum<256>(s, shared) / cols;
    float v = 0.0f;
    for (int c = threadIdx.x; c < cols; c += 256) {
        float d = xr[c] - mean;
        v += d * d;
    }
    float rstd = rsqrtf(block_sum<256>(v, shared) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += 256)
        yr[c] = (xr[c] - mean) * rstd * gamma[c] + beta[c];
}
"""

GEMM = r"""
template <int TILE>
__device__ void gemm_tile(const float *A, const float *B, float *C,
                          int M, int N, int K, float alpha, float beta)
{
    __shared__ float As[TILE][TILE + 1];
    __shared__ float Bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        As[threadIdx.y][threadIdx.x] =
            (row < M && t + threadIdx.x < K) ? A[row * K + t + threadIdx.x] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] =
            (col < N && t + threadIdx.y < K) ? B[(t + threadIdx.y) * N + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; k++) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = alpha * acc + beta * C[row * N + col];
}

extern "C" __global__ void sgemm_32x32(const float *A, const float *B, float *C,
                                       int M, int N, int K, float alpha, float beta)
{
    gemm_tile<32>(A, B, C, M, N, K, alpha, beta);
}
"""

FFT_BUTTERFLY = r"""
#include <cuda/std/complex>
#include <cuda/std/cmath>
using cplx = cuda::std::complex<float>;

/* One radix-2 stage of an in-place FFT over n points. */
extern "C" __global__ void fft_radix2_stage(cplx *data, int n, int half)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n / 2) return;
    int group = i / half, pos = i % half;
    int a = group * 2 * half + pos, b = a + half;
    float angle = -2.0f * 3.14159265358979f * pos / (2 * half);
    cplx w = cuda::std::polar(1.0f, angle);
    cplx t = w * data[b];
    data[b] = data[a] - t;
    data[a] = data[a] + t;
}
"""

ELEMENTWISE = r"""
struct Relu { template <typename T> __device__ T operator()(T x) const { return x > T(0) ? x : T(0); } };
struct Gelu {
    template <typename T> __device__ T operator()(T x) const
    { return T(0.5) * x * (T(1) + tanh(T(0.7978845608) * (x + T(0.044715) * x * x * x))); }
};
struct Silu { template <typename T> __device__ T operator()(T x) const { return x / (T(1) + exp(-x)); } };

template <typename T, typename Op>
__global__ void elementwise(const T *x, T *y, size_t n)
{
    Op op;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = op(x[i]);
}
"""

ELEMENTWISE_NAMES = tuple(
    f"elementwise<{t}, {op}>" for t in ("float", "double") for op in
    ("Relu", "Gelu", "Silu"))

# name, source, extra ProgramOptions, name expressions
KERNELS = [
    ("reduce_sum_cub", REDUCE_CUB, {"std": "c++17", "include_path": [CCCL]}, ()),
    ("softmax", SOFTMAX, {"use_fast_math": True}, ()),
    ("layernorm", LAYERNORM, {}, ()),
    ("sgemm_tiled", GEMM, {}, ()),
    ("fft_butterfly_complex", FFT_BUTTERFLY,
     {"std": "c++17", "include_path": [CCCL]}, ()),
    ("elementwise_family", ELEMENTWISE, {"std": "c++17"}, ELEMENTWISE_NAMES),
]


def compile_one(name, src, extra, names, args, cache):
    opts = ProgramOptions(name=name, arch=args.arch, **extra)
    use_cache = cache is not None and not names and "include_path" not in extra
    t0 = time.perf_counter()
    prog = Program(src, "c++", opts)
    if use_cache:
        obj = prog.compile(args.target, cache=cache)
    else:
        obj = prog.compile(args.target, name_expressions=names)
    ms = (time.perf_counter() - t0) * 1000.0
    nbytes = len(bytes(obj.code))
    prog.close()
    rec = {"kernel": name, "compile_ms": round(ms, 3), "target": args.target,
           "bytes": nbytes}
    if names:
        rec["name_expressions"] = len(names)
    if cache is not None:
        rec["program_cache"] = "used" if use_cache else "unsupported"
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--target", default="cubin",
                    choices=("cubin", "ptx", "ltoir"))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--program-cache", metavar="DIR")
    ap.add_argument("--only")
    args = ap.parse_args()

    cache = None
    if args.program_cache:
        from cuda.core.utils import FileStreamProgramCache
        cache = FileStreamProgramCache(args.program_cache)

    kernels = KERNELS
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {k[0] for k in KERNELS}
        if unknown:
            ap.error(f"unknown kernels: {', '.join(sorted(unknown))}")
        kernels = [k for k in KERNELS if k[0] in wanted]

    total = 0.0
    count = 0
    for r in range(args.repeat):
        for name, src, extra, names in kernels:
            if args.target == "ltoir":
                extra = dict(extra, link_time_optimization=True)
            rec = compile_one(name, src, extra, names, args, cache)
            if args.repeat > 1:
                rec["round"] = r
            total += rec["compile_ms"]
            count += 1
            print(json.dumps(rec), flush=True)
    print(json.dumps({"summary": True, "kernels": count,
                      "total_ms": round(total, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
