/*
 * fault_client: the NVRTC client the fault tests (suite 'faults') drive.
 *
 * It compiles numbered kernels -- kernel i is a small program whose source,
 * name and options are a pure function of i -- and prints one line per
 * compile as soon as the call returns, written with a single write(2) so a
 * line is either whole or absent when the process is killed:
 *
 *     done <role> <i> <hash> <ms> <ok|bad>
 *
 * <hash> is FNV-1a 64 over everything the program observes: the compile's
 * return code, and for the log, PTX and CUBIN the size call's return code,
 * the size and the bytes. <ms> is how long nvrtcCompileProgram took. A line
 * printed means NVRTC (or the shim) answered, and -- with the shim -- that a
 * store of the result was acknowledged (the shim's put is durable before the
 * compile returns). <ok|bad> is a structural check of the outputs against
 * the kernel's number (see compile_one).
 *
 * Kernels: i % 13 == 12 is a compile error (NVRTC_ERROR_COMPILATION with a
 * log), i % 5 == 3 targets sm_90 (PTX and CUBIN), the rest compute_90 (PTX).
 * Kernels >= 100000 are slow (cuda::std::complex, about a second or more):
 * the tests use one when they need a compile that lasts long enough to kill
 * or stop the process holding its lock.
 *
 * Usage: fault_client [--kernels SPEC] [--threads T] [--start K] [--barrier-stdin]
 *                     [--fork CHILD_SPEC] [--after-fork PARENT_SPEC]
 *                     [--load SEED,SHARED,DISTINCT_BASE,MS]
 *   SPEC          comma-separated indices and ranges a-b (inclusive).
 *   --threads T   T threads each compile the whole SPEC, thread t starting
 *                 at offset t (so threads race on the same kernels).
 *   --start K     start at position K of SPEC (then wrap around).
 *   --fork C      after SPEC, fork (no exec); the child compiles C and exits
 *                 normally, the parent compiles --after-fork P, then waits.
 *                 Roles: "p" before the fork and in the parent, "c" in the
 *                 child. A child that is not back within 120 s is an error.
 *   --load S,N,B,MS  load mode: each of T threads draws kernels for MS
 *                 milliseconds with an RNG seeded from S and its thread
 *                 number: half from the shared pool [0, N), half distinct to
 *                 this process and thread: B + t*1000 + a counter.
 * Exit: 0, or 2 on a usage or system error.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nvrtc.h>

static const char *role = "p";

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fnv(uint64_t *h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        *h ^= b[i];
        *h *= 0x100000001b3ull;
    }
}

static void fnv_u64(uint64_t *h, uint64_t v)
{
    fnv(h, &v, sizeof v);
}

typedef nvrtcResult (*size_fn)(nvrtcProgram, size_t *);
typedef nvrtcResult (*get_fn)(nvrtcProgram, char *);

/* Hashes one output; *found says whether `needle` occurs in it. */
static int hash_output(uint64_t *h, nvrtcProgram prog, size_fn sz, get_fn get, const char *needle,
                       bool *found)
{
    size_t n = 0;
    nvrtcResult rc = sz(prog, &n);
    fnv_u64(h, (uint64_t)rc);
    if (rc != NVRTC_SUCCESS)
        return 0;
    fnv_u64(h, n);
    char *buf = malloc(n + 1);
    if (buf == NULL)
        return -1;
    rc = get(prog, buf);
    fnv_u64(h, (uint64_t)rc);
    if (rc == NVRTC_SUCCESS) {
        fnv(h, buf, n);
        buf[n] = 0;
        if (needle != NULL && n > 0 && memmem(buf, n, needle, strlen(needle)) != NULL)
            *found = true;
    }
    free(buf);
    return 0;
}

/* Source and options of kernel i. */
static void kernel_of(long i, char *src, size_t len, const char **opts, int *nopts)
{
    static const char *ptx_opts[] = {"-arch=compute_90"};
    static const char *sm_opts[] = {"-arch=sm_90"};
    static const char *slow_opts[] = {"-arch=compute_90", "-std=c++17",
                                      "-I/usr/local/cuda/include/cccl",
                                      "-I/usr/local/cuda/include"};
    if (i >= 100000) {
        snprintf(src, len,
                 "#include <cuda/std/complex>\n"
                 "using cplx = cuda::std::complex<double>;\n"
                 "extern \"C\" __global__ void slow_%ld(cplx *d, cplx w, int n)\n"
                 "{\n"
                 "    int t = blockIdx.x * blockDim.x + threadIdx.x;\n"
                 "    if (t >= n) return;\n"
                 "    d[t] = cuda::std::exp(d[t] * w) + cuda::std::log(d[t] + %ld.0);\n"
                 "}\n",
                 i, i);
        memcpy(opts, slow_opts, sizeof slow_opts);
        *nopts = 4;
        return;
    }
    if (i % 13 == 12) {
        snprintf(src, len,
                 "extern \"C\" __global__ void k_%ld(int *o)\n"
                 "{\n"
                 "    o[0] = undeclared_%ld + 1;\n"
                 "}\n",
                 i, i);
    } else {
        snprintf(src, len,
                 "extern \"C\" __global__ void k_%ld(int *o, int n)\n"
                 "{\n"
                 "    int t = blockIdx.x * blockDim.x + threadIdx.x;\n"
                 "    if (t < n) o[t] = t * %ld + %ld;\n"
                 "}\n",
                 i, i % 97 + 2, i);
    }
    opts[0] = i % 5 == 3 ? sm_opts[0] : ptx_opts[0];
    *nopts = 1;
}

/* Compiles kernel i, prints its line. Returns the call's duration in ns. */
static uint64_t compile_one(long i)
{
    char src[2048], name[64];
    const char *opts[8];
    int nopts = 0;
    kernel_of(i, src, sizeof src, opts, &nopts);
    snprintf(name, sizeof name, "k%ld.cu", i);
    nvrtcProgram prog = NULL;
    uint64_t h = 0xcbf29ce484222325ull;
    nvrtcResult rc = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
    if (rc != NVRTC_SUCCESS) {
        fprintf(stderr, "fault_client: nvrtcCreateProgram(%ld): %d\n", i, (int)rc);
        exit(2);
    }
    uint64_t t0 = now_ns();
    rc = nvrtcCompileProgram(prog, nopts, opts);
    uint64_t took = now_ns() - t0;
    fnv_u64(&h, (uint64_t)rc);
    /* A structural check every line carries: the log of an erroneous kernel
     * names its own undeclared identifier, the PTX of a good one its own
     * entry point. It catches a result served for the wrong kernel even
     * where the test has no reference hash. */
    char want_log[64], want_ptx[64];
    snprintf(want_log, sizeof want_log, "undeclared_%ld", i);
    snprintf(want_ptx, sizeof want_ptx, i >= 100000 ? "slow_%ld" : "k_%ld(", i);
    bool err_kind = i < 100000 && i % 13 == 12;
    bool in_log = false, in_ptx = false;
    if (hash_output(&h, prog, nvrtcGetProgramLogSize, nvrtcGetProgramLog, want_log, &in_log) ||
        hash_output(&h, prog, nvrtcGetPTXSize, nvrtcGetPTX, want_ptx, &in_ptx) ||
        hash_output(&h, prog, nvrtcGetCUBINSize, nvrtcGetCUBIN, NULL, NULL)) {
        fprintf(stderr, "fault_client: out of memory\n");
        exit(2);
    }
    bool ok =
        err_kind ? (rc == NVRTC_ERROR_COMPILATION && in_log) : (rc == NVRTC_SUCCESS && in_ptx);
    nvrtcDestroyProgram(&prog);
    char line[128];
    int n = snprintf(line, sizeof line, "done %s %ld %016" PRIx64 " %.1f %s\n", role, i, h,
                     took / 1e6, ok ? "ok" : "bad");
    ssize_t w = write(STDOUT_FILENO, line, (size_t)n);
    (void)w;
    return took;
}

/* ---- kernel lists ---------------------------------------------------- */

struct list {
    long *v;
    size_t n;
};

static int parse_list(const char *s, struct list *l)
{
    l->v = NULL;
    l->n = 0;
    if (s == NULL || s[0] == 0)
        return 0;
    size_t cap = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0)
            return -1;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1 || b < a)
                return -1;
            p = end;
        }
        for (long k = a; k <= b; k++) {
            if (l->n == cap) {
                cap = cap ? cap * 2 : 64;
                l->v = realloc(l->v, cap * sizeof *l->v);
                if (l->v == NULL)
                    return -1;
            }
            l->v[l->n++] = k;
        }
        if (*p == ',')
            p++;
        else if (*p != 0)
            return -1;
    }
    return 0;
}

/* ---- threads ----------------------------------------------------------- */

struct worker {
    pthread_t tid;
    int index;
    const struct list *list;
    size_t start; /* first list position (then wraps around) */
    /* load mode */
    uint64_t seed;
    long shared, distinct_base;
    uint64_t deadline_ns;
    uint64_t max_ns;
    long count;
};

static void *run_list(void *arg)
{
    struct worker *w = arg;
    for (size_t k = 0; k < w->list->n; k++) {
        uint64_t t = compile_one(w->list->v[(k + w->start + (size_t)w->index) % w->list->n]);
        if (t > w->max_ns)
            w->max_ns = t;
        w->count++;
    }
    return NULL;
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void *run_load(void *arg)
{
    struct worker *w = arg;
    uint64_t rng = w->seed * 0x9e3779b97f4a7c15ull + (uint64_t)w->index * 7919u + 1;
    long distinct = 0;
    while (now_ns() < w->deadline_ns) {
        long i;
        if (xorshift(&rng) % 2 == 0 || w->shared == 0)
            i = w->distinct_base + w->index * 1000L + distinct++;
        else
            i = (long)(xorshift(&rng) % (uint64_t)w->shared);
        uint64_t t = compile_one(i);
        if (t > w->max_ns)
            w->max_ns = t;
        w->count++;
    }
    return NULL;
}

static int run_threads(int threads, const struct list *l, const char *load, size_t start)
{
    int nw = threads > 0 ? threads : 1;
    struct worker *w = calloc((size_t)nw, sizeof *w);
    if (w == NULL)
        return 2;
    uint64_t seed = 0, ms = 0;
    long shared = 0, base = 0;
    if (load != NULL &&
        sscanf(load, "%" SCNu64 ",%ld,%ld,%" SCNu64, &seed, &shared, &base, &ms) != 4) {
        fprintf(stderr, "fault_client: --load SEED,SHARED,DISTINCT_BASE,MS\n");
        return 2;
    }
    uint64_t deadline = now_ns() + ms * 1000000ull;
    for (int t = 0; t < nw; t++) {
        w[t].index = t;
        w[t].list = l;
        w[t].start = start;
        w[t].seed = seed;
        w[t].shared = shared;
        w[t].distinct_base = base;
        w[t].deadline_ns = deadline;
    }
    void *(*fn)(void *) = load != NULL ? run_load : run_list;
    if (threads > 0) {
        for (int t = 0; t < nw; t++) {
            int e = pthread_create(&w[t].tid, NULL, fn, &w[t]);
            if (e != 0) {
                fprintf(stderr, "fault_client: pthread_create: %s\n", strerror(e));
                return 2;
            }
        }
        for (int t = 0; t < nw; t++)
            pthread_join(w[t].tid, NULL);
    } else {
        fn(&w[0]);
    }
    uint64_t max = 0;
    long count = 0;
    for (int t = 0; t < nw; t++) {
        if (w[t].max_ns > max)
            max = w[t].max_ns;
        count += w[t].count;
    }
    char line[128];
    int n = snprintf(line, sizeof line, "summary %s compiles=%ld max_ms=%.1f\n", role, count,
                     max / 1e6);
    ssize_t wr = write(STDOUT_FILENO, line, (size_t)n);
    (void)wr;
    free(w);
    return 0;
}

int main(int argc, char **argv)
{
    const char *kernels = NULL, *fork_spec = NULL, *after_spec = NULL, *load = NULL;
    int threads = 0, start = 0;
    bool barrier = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--barrier-stdin"))
            barrier = true;
        else if (i + 1 < argc && !strcmp(a, "--kernels"))
            kernels = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--threads"))
            threads = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--start"))
            start = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--fork"))
            fork_spec = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--after-fork"))
            after_spec = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--load"))
            load = argv[++i];
        else {
            fprintf(stderr, "fault_client: unknown argument %s\n", a);
            return 2;
        }
    }
    struct list l, child, after;
    if (parse_list(kernels, &l) != 0 || parse_list(fork_spec, &child) != 0 ||
        parse_list(after_spec, &after) != 0 || threads < 0 || threads > 64) {
        fprintf(stderr, "fault_client: bad arguments\n");
        return 2;
    }
    if (barrier) {
        char ch;
        while (read(STDIN_FILENO, &ch, 1) > 0) {
        }
    }
    int rc = run_threads(threads, &l, load, (size_t)(start < 0 ? 0 : start));
    if (rc != 0 || fork_spec == NULL)
        return rc;

    pid_t pid = fork();
    if (pid < 0) {
        perror("fault_client: fork");
        return 2;
    }
    if (pid == 0) {
        role = "c";
        /* A child that hangs is killed, so the test sees a failure. */
        alarm(120);
        rc = run_threads(threads, &child, NULL, 0);
        exit(rc); /* normal exit: atexit handlers and destructors run */
    }
    rc = run_threads(threads, &after, NULL, 0);
    int status = 0;
    alarm(150);
    if (waitpid(pid, &status, 0) != pid) {
        perror("fault_client: waitpid");
        return 2;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "fault_client: child status %#x%s\n", status,
                WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? " (hung: alarm)" : "");
        return 2;
    }
    return rc;
}
