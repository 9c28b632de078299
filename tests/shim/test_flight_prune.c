/*
 * shim/flight.c against the pruning of DIR/locks (the owner removes lock
 * files nobody holds, each while holding its lock): a process waiting on a
 * lock file that is removed under it must not end up "holding" the removed
 * file while another process locks the file the name now gives.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flight.h"
#include "shim.h"

/* What flight.c needs of core.c. */
static struct kc_config cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;

static void cfg_load(void)
{
    kc_config_load(&cfg);
}

const struct kc_config *kc__config(void)
{
    pthread_once(&cfg_once, cfg_load);
    return &cfg;
}

static char dir[PATH_MAX];

static void setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kc-flight-XXXXXX", t && t[0] ? t : "/tmp");
    cr_assert_not_null(mkdtemp(dir));
    setenv("KCACHE_DIR", dir, 1);
    setenv("KCACHE_LOCK_TIMEOUT", "20000", 1);
}

static void teardown(void)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

TestSuite(flight_prune, .init = setup, .fini = teardown, .timeout = 60);

/* Whether process pid has path open (one of its /proc/PID/fd links) on a
 * descriptor other than `but`. */
static bool has_open(pid_t pid, const char *path, int but)
{
    char fdp[64], link[PATH_MAX];
    for (int fd = 0; fd < 64; fd++) {
        if (fd == but)
            continue;
        snprintf(fdp, sizeof fdp, "/proc/%d/fd/%d", (int)pid, fd);
        ssize_t n = readlink(fdp, link, sizeof link - 1);
        if (n <= 0)
            continue;
        link[n] = 0;
        if (strcmp(link, path) == 0)
            return true;
    }
    return false;
}

Test(flight_prune, a_lock_file_removed_under_a_waiter_is_not_held)
{
    cr_assert_eq(kc__flight_prepare(), 0);
    kc_digest id = {.lo = 0x1234, .hi = 0x5678};
    char hex[33], path[PATH_MAX + 64];
    kc__digest_hex(&id, hex);
    snprintf(path, sizeof path, "%s/locks/%s", dir, hex);

    /* A compile in progress holds the lock. */
    int holder = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_geq(holder, 0);
    cr_assert_eq(flock(holder, LOCK_EX | LOCK_NB), 0);

    int res[2], hold[2];
    cr_assert_eq(pipe(res), 0);
    cr_assert_eq(pipe(hold), 0);
    pid_t w = fork();
    cr_assert_geq(w, 0);
    if (w == 0) {
        /* The waiter: acquires, says so, keeps the lock until told. Not
         * through the holder's open file (it shares its lock): its
         * descriptor becomes /dev/null, so the number stays taken. */
        int nul = open("/dev/null", O_RDONLY);
        if (nul < 0 || dup2(nul, holder) < 0)
            _exit(2);
        close(nul);
        close(res[0]);
        close(hold[1]);
        bool waited = false;
        int fd = kc__flight_acquire(&id, &waited);
        char c = fd >= 0 && waited ? 'y' : 'n';
        if (write(res[1], &c, 1) != 1)
            _exit(2);
        (void)!read(hold[0], &c, 1);
        _exit(0);
    }
    close(res[1]);
    close(hold[0]);
    /* Once the waiter has the file open (and polls its lock), the compile
     * ends and the file is pruned: removed while locked, then let go. */
    for (int i = 0; i < 20000 && !has_open(w, path, holder); i++)
        usleep(1000);
    cr_assert(has_open(w, path, holder), "the waiter never opened %s", path);
    cr_assert_eq(unlink(path), 0);
    close(holder);

    char c = 0;
    cr_assert_eq(read(res[0], &c, 1), 1);
    cr_assert_eq(c, 'y', "the waiter got the lock after waiting");
    /* A newcomer takes the lock of the name as it is now: the waiter must
     * be the one holding it. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    int rc = flock(fd, LOCK_EX | LOCK_NB);
    int e = errno;
    close(fd);
    close(hold[1]); /* lets the waiter go */
    int status;
    cr_assert_eq(waitpid(w, &status, 0), w);
    cr_assert(rc != 0 && e == EWOULDBLOCK,
              "a newcomer locked %s while the waiter believed it held it", path);
}
