/*
 * drv_bench: driver-path timings for scripts/bench, linked against
 * libcuda.so.1 (the stand-in, tests/standin, first on LD_LIBRARY_PATH). Run it
 * with and without the shim preloaded and compare.
 *
 *   drv_bench jit PTX...               one cuModuleLoadData per file, timed
 *   drv_bench memo IMAGE FUNC BATCHES  cuModuleGetFunction and pooled cuMemAlloc
 *
 * jit prints one JSON line per file: {"kernel": base name, "load_ms": ...}.
 * memo prints one JSON line: the medians over BATCHES batches of the cost per
 * call, in nanoseconds, of cuModuleGetFunction (the same name, again and
 * again: the memo's hit), cuMemAlloc of blocks that fit a freed one (the
 * pool's hit) and the cuMemFree that returns them. Exits 1 on any driver
 * error.
 */
#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { GETS_PER_BATCH = 1000, ALLOCS_PER_BATCH = 128, ALLOC_BYTES = 64 << 10 };

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp);
    return n ? v[n / 2] : 0;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf != NULL) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            fprintf(stderr, "drv_bench: %s: error %d\n", #call, (int)rc_);                         \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int jit(int n, char **files)
{
    for (int f = 0; f < n; f++) {
        size_t len = 0;
        char *img = slurp(files[f], &len);
        if (img == NULL) {
            perror(files[f]);
            return 1;
        }
        CUmodule m;
        uint64_t t0 = now_ns();
        CHECK(cuModuleLoadData(&m, img));
        uint64_t dt = now_ns() - t0;
        CHECK(cuModuleUnload(m));
        free(img);
        const char *base = strrchr(files[f], '/');
        base = base ? base + 1 : files[f];
        char label[256];
        snprintf(label, sizeof label, "%s", base);
        char *dot = strrchr(label, '.');
        if (dot != NULL)
            *dot = '\0';
        printf("{\"kernel\": \"%s\", \"load_ms\": %.3f}\n", label, dt / 1e6);
        fflush(stdout);
    }
    return 0;
}

static int memo(const char *image, const char *func, int batches)
{
    size_t len = 0;
    char *img = slurp(image, &len);
    if (img == NULL) {
        perror(image);
        return 1;
    }
    CUmodule m;
    CHECK(cuModuleLoadData(&m, img));
    double *get = calloc(batches, sizeof *get), *alloc = calloc(batches, sizeof *alloc),
           *fre = calloc(batches, sizeof *fre);
    CUdeviceptr *p = calloc(ALLOCS_PER_BATCH, sizeof *p);
    if (!get || !alloc || !fre || !p)
        return 1;
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, m, func)); /* the miss, untimed */
    for (int b = 0; b < batches; b++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < GETS_PER_BATCH; i++)
            CHECK(cuModuleGetFunction(&fn, m, func));
        get[b] = (double)(now_ns() - t0) / GETS_PER_BATCH;
    }
    /* The first batch fills the pool (timed apart, not counted). */
    for (int b = -1; b < batches; b++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < ALLOCS_PER_BATCH; i++)
            CHECK(cuMemAlloc(&p[i], ALLOC_BYTES));
        uint64_t t1 = now_ns();
        for (int i = 0; i < ALLOCS_PER_BATCH; i++)
            CHECK(cuMemFree(p[i]));
        uint64_t t2 = now_ns();
        if (b >= 0) {
            alloc[b] = (double)(t1 - t0) / ALLOCS_PER_BATCH;
            fre[b] = (double)(t2 - t1) / ALLOCS_PER_BATCH;
        }
    }
    CHECK(cuModuleUnload(m));
    printf("{\"get_function_ns\": %.1f, \"mem_alloc_ns\": %.1f, \"mem_free_ns\": %.1f, "
           "\"batches\": %d, \"gets_per_batch\": %d, \"allocs_per_batch\": %d}\n",
           median(get, batches), median(alloc, batches), median(fre, batches), batches,
           GETS_PER_BATCH, ALLOCS_PER_BATCH);
    free(get);
    free(alloc);
    free(fre);
    free(p);
    free(img);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "memo") == 0 && argc != 5)) {
        fprintf(stderr, "usage: drv_bench jit PTX...\n"
                        "       drv_bench memo IMAGE FUNC BATCHES\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    int rc;
    if (strcmp(argv[1], "jit") == 0)
        rc = jit(argc - 2, argv + 2);
    else if (strcmp(argv[1], "memo") == 0)
        rc = memo(argv[2], argv[3], atoi(argv[4]));
    else
        rc = 2;
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return rc;
}
