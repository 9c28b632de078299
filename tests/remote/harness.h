/*
 * harness.h: private redis-servers for the remote tier's tests.
 *
 * Each server runs in the test's own temporary directory (under TMPDIR),
 * listening on a unix socket there or on a loopback port (127.0.0.1 only),
 * and dies with the test process (PR_SET_PDEATHSIG), so a crashed test
 * leaves no server behind; the test's fini stops it and removes the
 * directory, also after a failed assertion. Header only: static functions.
 */
#ifndef KCACHE_TESTS_REMOTE_HARNESS_H
#define KCACHE_TESTS_REMOTE_HARNESS_H

#include "remote_internal.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct rserver {
    pid_t pid;
    char dir[256];  /* its working directory */
    char sock[300]; /* unix socket, or empty */
    int port;       /* loopback port, or 0 */
    int cport;      /* cluster bus port, or 0 */
    bool cluster;
    char maxmem[32]; /* --maxmemory, or empty */
};

static char h_tmp[256]; /* the test's directory */

static int h_rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    remove(p);
    return 0;
}

/* Removes the directory once the test process is gone, however it ends
 * (a crash skips the test's fini): a child that waits for the end of a
 * pipe only the test process holds. */
static void h_janitor(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return;
    pid_t pid = fork();
    if (pid == 0) {
        pid_t me = fork(); /* detached: reparented, never waited for */
        if (me != 0)
            _exit(0);
        for (int fd = 3; fd < 1024; fd++)
            if (fd != p[0])
                close(fd);
        char c;
        while (read(p[0], &c, 1) < 0 && errno == EINTR)
            ;
        nftw(h_tmp, h_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        _exit(0);
    }
    close(p[0]);
    if (pid > 0)
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    /* p[1] stays open, unused, until this process ends. */
}

/* A fresh private directory for the test. */
static void h_mktmp(const char *tag)
{
    const char *t = getenv("TMPDIR");
    snprintf(h_tmp, sizeof h_tmp, "%s/kc-remote-%s-XXXXXX", t && t[0] ? t : "/tmp", tag);
    cr_assert_not_null(mkdtemp(h_tmp), "mkdtemp: %s", strerror(errno));
    chmod(h_tmp, 0700);
    h_janitor();
}

static void h_rmtmp(void)
{
    if (h_tmp[0] != '\0')
        nftw(h_tmp, h_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    h_tmp[0] = '\0';
}

/* A loopback TCP port nobody listens on now (bound, then released). */
static int h_free_port(void)
{
    for (int tries = 0; tries < 50; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t l = sizeof a;
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(fd, (struct sockaddr *)&a, &l) != 0) {
            close(fd);
            continue;
        }
        int port = ntohs(a.sin_port);
        close(fd);
        if (port < 55000)
            return port;
    }
    cr_assert_fail("no free loopback port");
    return 0;
}

/* Runs argv, its stdout into out (len bytes, NUL-terminated); returns the
 * exit status (or -1). stderr goes to the test's log. */
static int h_run(char *out, size_t len, char *const argv[])
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t o = 0;
    for (;;) {
        char buf[4096];
        ssize_t r = read(p[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r; i++)
            if (out != NULL && o + 1 < len)
                out[o++] = buf[i];
    }
    if (out != NULL && len > 0)
        out[o] = '\0';
    close(p[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* redis-cli against server s with the given arguments (NULL-terminated). */
static int h_cli(const struct rserver *s, char *out, size_t len, ...)
{
    char *argv[40];
    int n = 0;
    char port[16];
    argv[n++] = "redis-cli";
    if (s->sock[0] != '\0') {
        argv[n++] = "-s";
        argv[n++] = (char *)s->sock;
    } else {
        snprintf(port, sizeof port, "%d", s->port);
        argv[n++] = "-h";
        argv[n++] = "127.0.0.1";
        argv[n++] = "-p";
        argv[n++] = port;
    }
    va_list ap;
    va_start(ap, len);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && n < 39)
        argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    char tmp[256];
    return h_run(out != NULL ? out : tmp, out != NULL ? len : sizeof tmp, argv);
}

static void h_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Whether the server accepts connections yet (no redis-cli complaint
 * while it starts). */
static bool h_listening(const struct rserver *s)
{
    int fd;
    int rc;
    if (s->sock[0] != '\0') {
        fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", s->sock);
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)s->port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    }
    close(fd);
    return rc == 0;
}

/* Starts a redis-server: on a unix socket DIR/<name>.sock when port is 0,
 * else on 127.0.0.1:port (cluster-enabled when s->cluster). Waits until it
 * answers PING. */
static void h_start(struct rserver *s, const char *name)
{
    snprintf(s->dir, sizeof s->dir, "%s/%s", h_tmp, name);
    mkdir(s->dir, 0700);
    if (s->port == 0)
        snprintf(s->sock, sizeof s->sock, "%s/%s.sock", h_tmp, name);
    else
        s->sock[0] = '\0';
    char port[16], cport[16], logf[320], conf[320];
    snprintf(port, sizeof port, "%d", s->port);
    snprintf(cport, sizeof cport, "%d", s->cport);
    snprintf(logf, sizeof logf, "%s/log", s->dir);
    snprintf(conf, sizeof conf, "%s/nodes.conf", s->dir);
    char *argv[48];
    int n = 0;
    argv[n++] = "redis-server";
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--port";
    argv[n++] = port;
    if (s->sock[0] != '\0') {
        argv[n++] = "--unixsocket";
        argv[n++] = s->sock;
        argv[n++] = "--unixsocketperm";
        argv[n++] = "700";
    }
    argv[n++] = "--dir";
    argv[n++] = s->dir;
    argv[n++] = "--logfile";
    argv[n++] = logf;
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = "no";
    argv[n++] = "--daemonize";
    argv[n++] = "no";
    if (s->maxmem[0] != '\0') {
        argv[n++] = "--maxmemory";
        argv[n++] = s->maxmem;
        argv[n++] = "--maxmemory-policy";
        argv[n++] = "noeviction";
    }
    if (s->cluster) {
        argv[n++] = "--cluster-enabled";
        argv[n++] = "yes";
        argv[n++] = "--cluster-config-file";
        argv[n++] = conf;
        argv[n++] = "--cluster-port";
        argv[n++] = cport;
        argv[n++] = "--cluster-node-timeout";
        argv[n++] = "3000";
        argv[n++] = "--cluster-require-full-coverage";
        argv[n++] = "no";
    }
    argv[n] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    s->pid = pid;
    char out[64];
    for (int i = 0; i < 400; i++) {
        if (h_listening(s) && h_cli(s, out, sizeof out, "PING", NULL) == 0 &&
            strncmp(out, "PONG", 4) == 0)
            return;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            cr_assert_fail("redis-server %s exited at start (see %s)", name, logf);
        }
        h_sleep_ms(25);
    }
    cr_assert_fail("redis-server %s did not answer PING", name);
}

/* Kills the server (SIGCONT first, in case it was stopped) and reaps it. */
static void h_kill(struct rserver *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGCONT);
    kill(s->pid, SIGKILL);
    while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    s->pid = 0;
}

/* ---- a fake server: a thread answering on a unix socket ------------------ */

enum fake_mode {
    FAKE_SLOW,    /* answers "$5\r\nhello\r\n" one byte every 100 ms */
    FAKE_GARBAGE, /* answers bytes that are not RESP */
    FAKE_INTEGER, /* answers every command with ":42" */
    FAKE_HUGE,    /* announces a 100 MB bulk string and sends 10 MiB of it */
    FAKE_CLOSE,   /* accepts and closes without reading */
};

struct fake {
    int mode;
    int lfd;
    int stop[2];
    pthread_t th;
    char path[300];
};

static void fake_serve(struct fake *f, int c)
{
    if (f->mode == FAKE_CLOSE) {
        close(c);
        return;
    }
    char buf[65536];
    struct pollfd p = {.fd = c, .events = POLLIN};
    if (poll(&p, 1, 5000) <= 0 || read(c, buf, sizeof buf) <= 0) {
        close(c);
        return;
    }
    static const char slow[] = "$5\r\nhello\r\n";
    switch (f->mode) {
    case FAKE_SLOW:
        for (size_t i = 0; i < sizeof slow - 1; i++) {
            struct pollfd q = {.fd = f->stop[0], .events = POLLIN};
            if (poll(&q, 1, 100) > 0)
                break;
            if (send(c, slow + i, 1, MSG_NOSIGNAL) != 1)
                break;
        }
        break;
    case FAKE_GARBAGE:
        send(c, "!!! this is not RESP\r\n", 22, MSG_NOSIGNAL);
        break;
    case FAKE_INTEGER:
        send(c, ":42\r\n", 5, MSG_NOSIGNAL);
        break;
    case FAKE_HUGE: {
        send(c, "$100000000\r\n", 12, MSG_NOSIGNAL);
        memset(buf, 'x', sizeof buf);
        for (int i = 0; i < 160; i++) /* 10 MiB, past any reply bound */
            if (send(c, buf, sizeof buf, MSG_NOSIGNAL) < 0)
                break;
        break;
    }
    }
    /* Hold the connection until the client goes or the test ends. */
    struct pollfd q[2] = {{.fd = c, .events = POLLIN}, {.fd = f->stop[0], .events = POLLIN}};
    while (poll(q, 2, 5000) > 0 && !(q[1].revents & POLLIN) && read(c, buf, sizeof buf) > 0)
        ;
    close(c);
}

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = f->lfd, .events = POLLIN},
                              {.fd = f->stop[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0 && errno == EINTR)
            continue;
        if (p[1].revents & POLLIN)
            break;
        if (p[0].revents & POLLIN) {
            int c = accept(f->lfd, NULL, NULL);
            if (c >= 0)
                fake_serve(f, c);
        }
    }
    return NULL;
}

static void fake_start(struct fake *f, int mode, const char *name)
{
    f->mode = mode;
    snprintf(f->path, sizeof f->path, "%s/%s.sock", h_tmp, name);
    f->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", f->path);
    cr_assert_eq(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0, "bind: %s", strerror(errno));
    cr_assert_eq(listen(f->lfd, 8), 0);
    cr_assert_eq(pipe(f->stop), 0);
    cr_assert_eq(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_stop(struct fake *f)
{
    if (f->lfd <= 0)
        return;
    if (write(f->stop[1], "x", 1) != 1)
        return;
    pthread_join(f->th, NULL);
    close(f->lfd);
    close(f->stop[0]);
    close(f->stop[1]);
    f->lfd = 0;
}

/* ---- raw commands through the module's own connection code -------------- */

static struct kc_remote_counters h_raw_ctr;
static bool h_raw_warned;

/* Runs one command on endpoint ep; returns the reply (free with
 * h_free) or fails the test. */
static redisReply *h_raw(const struct kc_remote_endpoint *ep, int argc, const char **argv,
                         const size_t *lens)
{
    const struct kc__hiredis *hi;
    cr_assert_eq(kc__hiredis_load(&hi), 0);
    struct kc__rctx rc = {
        .hi = hi, .ctr = &h_raw_ctr, .reply_cap = 1u << 30, .warned = &h_raw_warned};
    struct kc__node nd = {.ep = *ep};
    nd.ep.operation_timeout_ms = 5000;
    nd.ep.connect_timeout_ms = 2000;
    struct kc__cmd cmd = {.argc = argc};
    for (int i = 0; i < argc; i++) {
        cmd.argv[i] = argv[i];
        cmd.len[i] = lens != NULL ? lens[i] : strlen(argv[i]);
    }
    redisReply *rep = NULL;
    int r = kc__node_exec(&rc, &nd, 1, &cmd, &rep);
    kc__node_drop(&rc, &nd);
    cr_assert_eq(r, 0, "raw command %s: %s", argv[0], strerror(-r));
    return rep;
}

static void h_free(redisReply *rep)
{
    kc__reply_free(rep);
}

#endif
