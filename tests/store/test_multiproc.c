/*
 * test_multiproc.c: many real processes on one cache directory (suite
 * `multiproc`). The processes are store_worker (fork + exec); the owner is
 * started on demand by the store, as store_worker's `owner` command.
 */
#include "store.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Opening, the data path on an open store, and the administration. */
static const struct kc_store_api *S;
static const struct kc_store_ops *api;
static const struct kc_store_admin *adm;
static char dir[256];
static const char *worker;

static void rm_rf(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", path);
}

static void stop_owner(void);

static void setup(void)
{
    S = kc_store_api();
    api = S->ops;
    adm = kc_store_admin();
    worker = getenv("STORE_WORKER");
    cr_assert_not_null(worker, "STORE_WORKER is not set (run through meson test)");
    setenv("STORE_WORKER_TOOL", worker, 1);
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kc-mp-XXXXXX", t && t[0] ? t : "/tmp");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    stop_owner();
    rm_rf(dir);
}

TestSuite(multiproc, .init = setup, .fini = teardown, .timeout = 240);

/* Starts store_worker with args; its stdout goes to *out_fd when not NULL. */
static pid_t start(char *const *args, int *out_fd)
{
    int p[2] = {-1, -1};
    if (out_fd != NULL)
        cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        if (out_fd != NULL) {
            dup2(p[1], 1);
            close(p[0]);
            close(p[1]);
        }
        execv(worker, args);
        _exit(127);
    }
    if (out_fd != NULL) {
        close(p[1]);
        *out_fd = p[0];
    }
    return pid;
}

static int wait_exit(pid_t pid)
{
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int run(char *const *args)
{
    return wait_exit(start(args, NULL));
}

/* Pids of owners running on `dir` (store_worker owner --dir DIR). */
static int find_owners(pid_t *out, int max)
{
    int n = 0;
    DIR *d = opendir("/proc");
    if (d == NULL)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char path[300], buf[1024];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = 0;
        /* argv[0] \0 argv[1] \0 "--dir" \0 DIR */
        const char *a1 = buf + strlen(buf) + 1;
        if (a1 >= buf + len || strcmp(a1, "owner") != 0)
            continue;
        const char *a2 = a1 + strlen(a1) + 1;
        const char *a3 = a2 < buf + len ? a2 + strlen(a2) + 1 : buf + len;
        if (a3 < buf + len && strcmp(a3, dir) == 0)
            out[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

static void stop_owner(void)
{
    pid_t p[8];
    int n = find_owners(p, 8);
    for (int i = 0; i < n; i++)
        kill(p[i], SIGKILL);
}

static void drain_all(void)
{
    struct kc_store_options o = {.dir = dir, .tool = worker};
    struct kc_store *st;
    cr_assert_eq(S->open(&o, &st), 0);
    int rc = adm->drain(st, 20000);
    cr_assert_eq(rc, 0, "drain: %s", strerror(-rc));
    api->close(st);
}

static void verify_clean(void)
{
    struct kc_store_options o = {.dir = dir, .tool = worker};
    struct kc_store *st;
    cr_assert_eq(S->open(&o, &st), 0);
    struct kc_verify_report r;
    cr_assert_eq(adm->verify(st, 0, &r, NULL, NULL), 0);
    printf("verify: checked=%" PRIu64 " bad=%" PRIu64 " spool_bad=%" PRIu64 "\n", r.checked, r.bad,
           r.spool_bad);
    cr_assert_eq(r.bad, 0, "unreadable records");
    cr_assert_eq(r.spool_bad, 0, "unreadable spool files");
    api->close(st);
}

Test(multiproc, eight_processes_write_and_read_one_directory)
{
    enum { N = 8 };
    pid_t pids[N];
    int fds[N];
    char ids[N][8];
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "%d", i);
        char *args[] = {(char *)worker, "work", "--dir", dir, "--id", ids[i],
                        "--n",          "40",   "--ids", "8", NULL};
        pids[i] = start(args, &fds[i]);
    }
    uint64_t max_get = 0, max_put = 0;
    for (int i = 0; i < N; i++) {
        char buf[256] = {0};
        ssize_t n = read(fds[i], buf, sizeof buf - 1);
        close(fds[i]);
        int rc = wait_exit(pids[i]);
        cr_assert_eq(rc, 0, "worker %d failed (exit %d)", i, rc);
        unsigned long long g = 0, p = 0;
        cr_assert(n > 0 && sscanf(buf, "max_get_us=%llu max_put_us=%llu", &g, &p) == 2,
                  "worker %d said: %s", i, buf);
        if (g > max_get)
            max_get = g;
        if (p > max_put)
            max_put = p;
    }
    printf("multiproc: 8 processes, slowest get %" PRIu64 " us, slowest put %" PRIu64 " us\n",
           max_get, max_put);
    fflush(stdout);
    /* The goal is ~100 ms; the bound is loose so a loaded machine does not
     * fail the suite. */
    cr_assert_lt(max_get, 1000000, "a get took %" PRIu64 " us", max_get);
    cr_assert_lt(max_put, 1000000, "a put took %" PRIu64 " us", max_put);

    /* Every entry is readable by a fresh process, drained or not... */
    char *check[] = {(char *)worker, "check", "--dir", dir, "--ids", "8", "--n", "40", NULL};
    cr_assert_eq(run(check), 0, "a fresh process misses entries");
    /* ...and once everything is drained. */
    drain_all();
    cr_assert_eq(run(check), 0, "entries lost in the drain");
    verify_clean();
}

Test(multiproc, kill_9_loses_nothing_acknowledged)
{
    uint64_t seed = (uint64_t)time(NULL);
    const char *es = getenv("KCACHE_TEST_SEED");
    if (es != NULL && es[0] != 0)
        seed = strtoull(es, NULL, 0);
    int trials = 24;
    const char *et = getenv("KCACHE_TEST_TRIALS");
    if (et != NULL && atoi(et) > 0)
        trials = atoi(et);
    printf("kill -9: seed=%" PRIu64 " trials=%d (KCACHE_TEST_SEED to replay)\n", seed, trials);
    fflush(stdout);
    srand48((long)seed);

    char logs[64][300];
    int nlogs = 0, owner_kills = 0, writer_kills = 0;
    for (int t = 0; t < trials; t++) {
        pid_t w[2];
        for (int i = 0; i < 2; i++) {
            snprintf(logs[nlogs], sizeof logs[0], "%s/log-%d-%d", dir, t, i);
            char s[32];
            snprintf(s, sizeof s, "%" PRIu64, seed * 1000 + (uint64_t)(t * 2 + i));
            char *args[] = {(char *)worker, "killput", "--dir", dir, "--log",
                            logs[nlogs],    "--seed",  s,       NULL};
            w[i] = start(args, NULL);
            if (nlogs < 63)
                nlogs++;
        }
        struct timespec ts = {0, (long)(5 + lrand48() % 150) * 1000000L};
        nanosleep(&ts, NULL);
        int victim = (int)(lrand48() % 3);
        if (victim == 2) {
            pid_t p[8];
            int n = find_owners(p, 8);
            for (int i = 0; i < n; i++)
                kill(p[i], SIGKILL);
            owner_kills += n > 0;
            ts.tv_nsec = (long)(lrand48() % 40) * 1000000L;
            nanosleep(&ts, NULL);
        } else {
            writer_kills++;
        }
        /* Writers are killed too, at whatever point they have reached. */
        kill(w[victim == 1], SIGKILL);
        ts.tv_nsec = (long)(lrand48() % 20) * 1000000L;
        nanosleep(&ts, NULL);
        kill(w[victim != 1], SIGKILL);
        wait_exit(w[0]);
        wait_exit(w[1]);
    }
    printf("kill -9: %d trials, owner killed %d times, writers killed first %d times\n", trials,
           owner_kills, writer_kills);
    fflush(stdout);

    char *args[200];
    int a = 0;
    args[a++] = (char *)worker;
    args[a++] = "checklog";
    args[a++] = "--dir";
    args[a++] = dir;
    for (int i = 0; i < nlogs; i++) {
        args[a++] = "--log";
        args[a++] = logs[i];
    }
    args[a] = NULL;
    cr_assert_eq(run(args), 0, "an acknowledged put does not read back (seed %" PRIu64 ")", seed);
    verify_clean();
    drain_all();
    cr_assert_eq(run(args), 0, "lost in the drain (seed %" PRIu64 ")", seed);
    verify_clean();
}
