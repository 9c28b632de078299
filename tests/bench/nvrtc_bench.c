/*
 * nvrtc_bench: times nvrtcCompileProgram, repeatedly, in one process. Run it
 * with and without the shim, on a cold and a warm store, and compare
 * (scripts/bench does).
 *
 *   nvrtc_bench KERNEL ITERS     KERNEL: plain | cudastd | template
 *   nvrtc_bench [--name N] [--opt O]... [--expr E]... --file SRC [--file SRC]... ITERS
 *
 * The second form compiles each source file ITERS times, in the order given,
 * with the options and name expressions given (the program is named N, or
 * after the file's base name without extension). This is how scripts/bench
 * runs the demo kernel set and the ranks of the cold-start section.
 *
 * --save DIR also writes each kernel's PTX to DIR/<kernel>.ptx (the inputs of
 * the driver section) and, when the target is a real architecture, its CUBIN
 * to DIR/<kernel>.cubin (with the PTX, the store section's real artifacts).
 * With -dlto it writes the LTO-IR to DIR/<kernel>.ltoir instead of the PTX
 * (the inputs of the link section).
 *
 * Prints one JSON line per kernel: the first compile's milliseconds, then
 * p50/p99 of the rest in microseconds, and the output size (PTX, or CUBIN
 * when the target is a real architecture) -- a check that output exists.
 * Exits 1 on any failed compile.
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

enum { MAX_ARGS = 256 };

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

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf != NULL && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (nb == NULL)
                free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (buf != NULL)
        buf[len] = '\0';
    return buf;
}

/* Compiles `src` ITERS times and prints its JSON line. Returns 0 or 1. */
static const char *save_dir;

/* Writes one output of `p` to DIR/<label>.<ext>: `trim` bytes fewer than
 * its size (PTX's terminating NUL). An empty output is not written, and is
 * an error when `required`. */
static int save_one(nvrtcProgram p, const char *label, const char *ext,
                    nvrtcResult (*size)(nvrtcProgram, size_t *),
                    nvrtcResult (*get)(nvrtcProgram, char *), size_t trim, int required)
{
    size_t n = 0;
    if (size(p, &n) != NVRTC_SUCCESS)
        return 1;
    if (n <= trim)
        return required;
    char *buf = malloc(n);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", save_dir, label, ext);
    FILE *f = buf ? fopen(path, "wb") : NULL;
    int bad = f == NULL || get(p, buf) != NVRTC_SUCCESS || fwrite(buf, 1, n - trim, f) != n - trim;
    if (f != NULL && fclose(f) != 0)
        bad = 1;
    free(buf);
    if (bad)
        fprintf(stderr, "nvrtc_bench: cannot write %s\n", path);
    return bad;
}

static int save_outputs(nvrtcProgram p, const char *label)
{
    size_t lto = 0;
    if (nvrtcGetLTOIRSize(p, &lto) == NVRTC_SUCCESS && lto > 0)
        return save_one(p, label, "ltoir", nvrtcGetLTOIRSize, nvrtcGetLTOIR, 0, 1);
    return save_one(p, label, "ptx", nvrtcGetPTXSize, nvrtcGetPTX, 1, 1) ||
           save_one(p, label, "cubin", nvrtcGetCUBINSize, nvrtcGetCUBIN, 0, 0);
}

static int bench(const char *label, const char *prog_name, const char *src, int nopts,
                 const char **opts, int nexpr, const char **exprs, int iters)
{
    double *t = calloc(iters > 0 ? iters : 1, sizeof *t);
    size_t out = 0;
    if (t == NULL)
        return 1;
    for (int i = 0; i < iters; i++) {
        nvrtcProgram p;
        if (nvrtcCreateProgram(&p, src, prog_name, 0, NULL, NULL) != NVRTC_SUCCESS)
            return 1;
        for (int e = 0; e < nexpr; e++)
            nvrtcAddNameExpression(p, exprs[e]);
        double t0 = now_us();
        nvrtcResult rc = nvrtcCompileProgram(p, nopts, opts);
        t[i] = now_us() - t0;
        if (rc != NVRTC_SUCCESS) {
            size_t ln = 0;
            nvrtcGetProgramLogSize(p, &ln);
            char *log = malloc(ln + 1);
            if (log != NULL && nvrtcGetProgramLog(p, log) == NVRTC_SUCCESS)
                fprintf(stderr, "%s\n", log);
            free(log);
            fprintf(stderr, "nvrtc_bench: %s: compile failed: %s\n", label,
                    nvrtcGetErrorString(rc));
            return 1;
        }
        if (nvrtcGetCUBINSize(p, &out) != NVRTC_SUCCESS || out == 0)
            nvrtcGetPTXSize(p, &out);
        if (save_dir != NULL && i == 0 && save_outputs(p, label) != 0)
            return 1;
        nvrtcDestroyProgram(&p);
    }
    double first = t[0];
    double p50 = 0, p99 = 0;
    if (iters > 1) {
        size_t n = (size_t)iters - 1;
        qsort(t + 1, n, sizeof *t, cmp);
        p50 = t[1 + n / 2];
        size_t i99 = (size_t)(n * 0.99);
        p99 = t[1 + (i99 < n ? i99 : n - 1)];
    }
    printf("{\"kernel\": \"%s\", \"first_ms\": %.3f, \"p50_us\": %.2f, \"p99_us\": %.2f, "
           "\"iters\": %d, \"out_bytes\": %zu, \"ptx_bytes\": %zu}\n",
           label, first / 1e3, p50, p99, iters, out, out);
    fflush(stdout);
    free(t);
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: nvrtc_bench plain|cudastd|template ITERS\n"
                    "       nvrtc_bench [--name N] [--opt O]... [--expr E]... [--save DIR] --file "
                    "SRC... ITERS\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *opts[MAX_ARGS], *exprs[MAX_ARGS], *files[MAX_ARGS], *name = NULL;
    int nopts = 0, nexpr = 0, nfiles = 0;
    int i = 1;
    for (; i < argc - 1 && strncmp(argv[i], "--", 2) == 0; i += 2) {
        const char *v = argv[i + 1];
        if (strcmp(argv[i], "--opt") == 0 && nopts < MAX_ARGS)
            opts[nopts++] = v;
        else if (strcmp(argv[i], "--expr") == 0 && nexpr < MAX_ARGS)
            exprs[nexpr++] = v;
        else if (strcmp(argv[i], "--file") == 0 && nfiles < MAX_ARGS)
            files[nfiles++] = v;
        else if (strcmp(argv[i], "--name") == 0)
            name = v;
        else if (strcmp(argv[i], "--save") == 0)
            save_dir = v;
        else
            return usage();
    }
    if (nfiles > 0) {
        if (i != argc - 1)
            return usage();
        int iters = atoi(argv[i]);
        for (int f = 0; f < nfiles; f++) {
            char *src = slurp(files[f]);
            if (src == NULL) {
                perror(files[f]);
                return 1;
            }
            const char *base = strrchr(files[f], '/');
            base = base ? base + 1 : files[f];
            char label[256];
            snprintf(label, sizeof label, "%s", base);
            char *dot = strrchr(label, '.');
            if (dot != NULL)
                *dot = '\0';
            if (bench(label, name ? name : label, src, nopts, opts, nexpr, exprs, iters) != 0)
                return 1;
            free(src);
        }
        return 0;
    }
    if (argc != 3)
        return usage();
    const char *kernel = argv[1];
    const char *src = strcmp(kernel, "cudastd") == 0    ? cudastd_src
                      : strcmp(kernel, "template") == 0 ? template_src
                                                        : plain_src;
    const char *fixed[] = {"-arch=sm_90", "-std=c++17", "-I/usr/local/cuda/include/cccl",
                           "-I/usr/local/cuda/include"};
    const char *texpr[] = {"scale<float, 3>"};
    return bench(kernel, "bench.cu", src, 4, fixed, strcmp(kernel, "template") == 0, texpr,
                 atoi(argv[2]));
}
