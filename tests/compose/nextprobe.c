/*
 * libcompose-nextprobe.so: a preloaded interposer, as libfaketime or a
 * profiler is, that asks dlsym(RTLD_NEXT, ...) and dlvsym(RTLD_NEXT, ...)
 * for names libc, libcuda, NVRTC and kcache define, from its constructor
 * (which may run before kcache's) and at exit (atexit: everything the host
 * loaded is still there). It appends one line
 * per answer to $KCACHE_TEST_NEXTPROBE: "PHASE NAME OBJECT" (OBJECT: the
 * basename of the defining object, "NULL", or "SELF" when the answer is
 * this library's own definition, the recursion libfaketime died of).
 */
/* stat itself, not stat64: the name libfaketime interposes. */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* An interposed stat, as libfaketime's: forwards to the next one. */
__attribute__((visibility("default"))) int stat(const char *path, struct stat *st)
{
    int (*next)(const char *, struct stat *) =
        (int (*)(const char *, struct stat *))dlsym(RTLD_NEXT, "stat");
    return next != NULL && (void *)next != (void *)stat ? next(path, st) : -1;
}

static const char *const names[] = {"stat",
                                    "open",
                                    "cuInit",
                                    "cuModuleLoadData",
                                    "cuMemAlloc_v2",
                                    "nvrtcCreateProgram",
                                    "kc_no_such_name",
                                    "stat@GLIBC_2.33"};
enum { N_NAMES = sizeof names / sizeof *names };

/* Asks every name first, before calling anything another preloaded
 * library may interpose (getenv, fopen), as libeatmydata's constructor
 * does: nothing has run in kcache yet when it asks from its constructor. */
static void report(const char *phase)
{
    void *answers[N_NAMES];
    for (size_t i = 0; i < N_NAMES; i++) {
        const char *at = strchr(names[i], '@');
        if (at != NULL) {
            char name[64];
            memcpy(name, names[i], (size_t)(at - names[i]));
            name[at - names[i]] = '\0';
            answers[i] = dlvsym(RTLD_NEXT, name, at + 1);
        } else {
            answers[i] = dlsym(RTLD_NEXT, names[i]);
        }
    }
    const char *out = getenv("KCACHE_TEST_NEXTPROBE");
    if (out == NULL)
        return;
    FILE *f = fopen(out, "a");
    if (f == NULL)
        return;
    Dl_info self;
    dladdr((void *)report, &self);
    for (size_t i = 0; i < N_NAMES; i++) {
        void *p = answers[i];
        Dl_info info;
        const char *obj = "NULL";
        if (p != NULL && dladdr(p, &info) != 0 && info.dli_fname != NULL) {
            obj = info.dli_fbase == self.dli_fbase ? "SELF" : strrchr(info.dli_fname, '/');
            obj = obj != NULL && obj[0] == '/' ? obj + 1 : obj ? obj : info.dli_fname;
        } else if (p != NULL) {
            obj = "UNKNOWN";
        }
        fprintf(f, "%s %s %s\n", phase, names[i], obj);
    }
    struct stat st;
    fprintf(f, "%s stat-call %d\n", phase, stat("/", &st));
    fclose(f);
}

static void probe_exit(void)
{
    report("exit");
}

__attribute__((constructor)) static void probe_init(void)
{
    report("ctor");
    atexit(probe_exit);
}
