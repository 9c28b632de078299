/*
 * nvrtc_bench: times nvrtcCompileProgram for one kernel, repeatedly, in one
 * process. Run it with and without the shim, on a cold and a warm store, and
 * compare (scripts/bench does).
 *
 *   nvrtc_bench KERNEL ITERS     KERNEL: plain | cudastd | template
 *
 * Prints one JSON line: the first compile's milliseconds, then p50/p99 of
 * the rest in microseconds, and the PTX size (a check that output exists).
 */
#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *plain_src =
    "extern \"C\" __global__ void saxpy(float a, const float *x, float *y, int n)\n"
    "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }\n";

static const char *cudastd_src =
    "#include <cuda/std/complex>\n"
    "extern \"C\" __global__ void butterfly(cuda::std::complex<float> *d, int n)\n"
    "{ int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i + n / 2 < n) { auto a = d[i], b = d[i + n / 2];\n"
    "    auto w = cuda::std::polar(1.0f, -6.2831853f * i / n);\n"
    "    d[i] = a + w * b; d[i + n / 2] = a - w * b; } }\n";

static const char *template_src =
    "template <typename T, int N> __global__ void scale(T *p) { p[threadIdx.x] *= T(N); }\n";

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: nvrtc_bench plain|cudastd|template ITERS\n");
        return 2;
    }
    const char *kernel = argv[1];
    int iters = atoi(argv[2]);
    const char *src = strcmp(kernel, "cudastd") == 0    ? cudastd_src
                      : strcmp(kernel, "template") == 0 ? template_src
                                                        : plain_src;
    const char *opts[] = {"-arch=sm_90", "-std=c++17", "-I/usr/local/cuda/include/cccl",
                          "-I/usr/local/cuda/include"};
    double *t = calloc(iters > 0 ? iters : 1, sizeof *t);
    size_t ptx = 0;
    for (int i = 0; i < iters; i++) {
        nvrtcProgram p;
        if (nvrtcCreateProgram(&p, src, "bench.cu", 0, NULL, NULL) != NVRTC_SUCCESS)
            return 1;
        if (strcmp(kernel, "template") == 0)
            nvrtcAddNameExpression(p, "scale<float, 3>");
        double t0 = now_us();
        nvrtcResult rc = nvrtcCompileProgram(p, 4, opts);
        t[i] = now_us() - t0;
        if (rc != NVRTC_SUCCESS) {
            fprintf(stderr, "compile failed: %s\n", nvrtcGetErrorString(rc));
            return 1;
        }
        nvrtcGetPTXSize(p, &ptx);
        nvrtcDestroyProgram(&p);
    }
    double first = t[0];
    double p50 = 0, p99 = 0;
    if (iters > 1) {
        qsort(t + 1, iters - 1, sizeof *t, cmp);
        p50 = t[1 + (iters - 1) / 2];
        p99 = t[1 + (size_t)((iters - 1) * 0.99)];
        if (1 + (size_t)((iters - 1) * 0.99) >= (size_t)iters)
            p99 = t[iters - 1];
    }
    printf("{\"kernel\": \"%s\", \"first_ms\": %.3f, \"p50_us\": %.2f, \"p99_us\": %.2f, "
           "\"ptx_bytes\": %zu}\n",
           kernel, first / 1e3, p50, p99, ptx);
    free(t);
    return 0;
}
