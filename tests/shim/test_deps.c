/*
 * Unit tests of the dependency check (shim/deps.c): kc__dep_holds with the
 * directory handles of one pass (struct kc__dirs) must give exactly what it
 * gives without them (a stat of the whole path) for every kind of entry and
 * every way a path can fail: present, changed, absent in a present or
 * missing directory, under a regular file, relative, more directories than
 * are kept open. And shim/bundled.c's map of NVRTC's bundled headers.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deps.h"
#include "shim.h"

/* What hook.c gives deps.c. */
void *kc__real_dlsym(void *handle, const char *name)
{
    return dlsym(handle, name);
}

static char root[256];

static void put(const char *rel, const char *text)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    fputs(text, f);
    fclose(f);
}

/* A dependency as a compile records it: kind and, for a file, its digest
 * (no fingerprint, as for a file written within 2 s of the compile: every
 * check then compares content, so a change is seen whatever the clock). */
static struct kc__dep dep_of(const char *path, int kind)
{
    struct kc__dep d = {0};
    d.path = strdup(path);
    d.kind = kind;
    if (kind == KC_DEP_FILE) {
        struct stat st;
        cr_assert_eq(stat(path, &st), 0, "%s", path);
        d.st = st;
        cr_assert_eq(kc__file_digest(path, &st, &d.digest), 0);
    }
    return d;
}

static void both(const struct kc__dep *d, bool want, const char *what)
{
    struct kc__dirs dirs = {0};
    bool plain = kc__dep_holds(d, NULL);
    bool with = kc__dep_holds(d, &dirs);
    kc__dirs_close(&dirs);
    cr_assert_eq(plain, want, "%s (%s): without directory handles", what, d->path);
    cr_assert_eq(with, want, "%s (%s): with directory handles", what, d->path);
}

static void setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/kc-deps-XXXXXX", t && t[0] ? t : "/tmp");
    cr_assert_not_null(mkdtemp(root));
}

static void teardown(void)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(deps, .init = setup, .fini = teardown);

/* root/rel as a dependency of the given kind. */
static struct kc__dep dep_at(const char *rel, int kind)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    return dep_of(p, kind);
}

static void rm(const char *rel)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    cr_assert(unlink(p) == 0 || rmdir(p) == 0, "%s", p);
}

Test(deps, every_kind_and_failure_agrees)
{
    char sub[PATH_MAX / 2];
    snprintf(sub, sizeof sub, "%s/inc", root);
    cr_assert_eq(mkdir(sub, 0700), 0);
    put("inc/a.h", "int a;\n");
    put("plain.h", "int p;\n");

    enum { FILE_, DIR_, SLASH, DOTS, ABSENT, ABSENT_DIR, UNDER_FILE, N };
    static const struct {
        const char *rel;
        int kind;
        const char *what;
    } c[N] = {
        [FILE_] = {"inc/a.h", KC_DEP_FILE, "unchanged file"},
        [DIR_] = {"inc", KC_DEP_DIR, "directory"},
        [SLASH] = {"inc/", KC_DEP_DIR, "directory named with a trailing slash"},
        [DOTS] = {"inc/../inc/a.h", KC_DEP_FILE, "path through .."},
        [ABSENT] = {"inc/none.h", KC_DEP_ABSENT, "absent in a present directory"},
        [ABSENT_DIR] = {"gone/none.h", KC_DEP_ABSENT, "absent in a missing directory"},
        [UNDER_FILE] = {"plain.h/x.h", KC_DEP_ABSENT, "absent under a regular file (ENOTDIR)"},
    };
    struct kc__dep d[N];
    for (int i = 0; i < N; i++) {
        d[i] = dep_at(c[i].rel, c[i].kind);
        both(&d[i], true, c[i].what);
    }

    /* The same entries after the world changed under them. */
    put("inc/none.h", "int n;\n");
    both(&d[ABSENT], false, "absent entry that appeared");
    put("inc/a.h", "int a2;\n");
    both(&d[FILE_], false, "file whose content changed");
    char gone[PATH_MAX / 2];
    snprintf(gone, sizeof gone, "%s/gone", root);
    cr_assert_eq(mkdir(gone, 0700), 0);
    put("gone/none.h", "");
    both(&d[ABSENT_DIR], false, "absent entry whose directory and file appeared");
    rm("inc/none.h");
    rm("inc/a.h");
    rm("inc");
    put("inc", "now a file\n");
    both(&d[DIR_], false, "directory replaced by a file");
    both(&d[ABSENT], true, "absent under what is now a file");
    for (int i = 0; i < N; i++)
        free(d[i].path);
}

Test(deps, relative_paths_and_many_directories)
{
    /* More directories than are kept open at once: the rest are checked
     * by their full path, with the same answers. */
    enum { N = KC__DIRS_OPEN + 20 };
    struct kc__dep d[2 * N];
    char cwd[PATH_MAX];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(root), 0);
    for (int i = 0; i < N; i++) {
        char dir[64], rel[80];
        snprintf(dir, sizeof dir, "d%02d", i);
        cr_assert_eq(mkdir(dir, 0700), 0);
        snprintf(rel, sizeof rel, "d%02d/h.h", i);
        put(rel, i % 2 ? "odd\n" : "even\n");
        d[2 * i] = dep_of(rel, KC_DEP_FILE);
        snprintf(rel, sizeof rel, "d%02d/missing.h", i);
        d[2 * i + 1] = dep_of(rel, KC_DEP_ABSENT);
    }
    struct kc__dirs dirs = {0};
    for (int i = 0; i < 2 * N; i++) {
        cr_assert(kc__dep_holds(&d[i], NULL), "%s without handles", d[i].path);
        cr_assert(kc__dep_holds(&d[i], &dirs), "%s with handles", d[i].path);
    }
    cr_assert_leq(dirs.open, KC__DIRS_OPEN);
    put("d40/missing.h", "");
    cr_assert_not(kc__dep_holds(&d[81], &dirs), "appeared, in a directory not kept open");
    put("d03/missing.h", "");
    cr_assert_not(kc__dep_holds(&d[7], &dirs), "appeared, in a directory kept open");
    kc__dirs_close(&dirs);
    cr_assert_eq(dirs.open, 0);
    cr_assert_eq(chdir(cwd), 0);
    for (int i = 0; i < 2 * N; i++)
        free(d[i].path);
}

/* ---- a header rewritten in place while it is hashed ---------------------- */

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <xxhash.h>

#define BIG_SIZE (8u << 20)
#define BIG_CHUNK (1u << 20)

struct rewriter {
    const char *path;
    const unsigned char *content;
    volatile int stop;
    unsigned rounds;
};

/* As `cat new > h` does, over and over: truncate, then write the content
 * back a chunk at a time. */
static void *rewrite_loop(void *arg)
{
    struct rewriter *r = arg;
    int fd = open(r->path, O_WRONLY);
    if (fd < 0)
        return NULL;
    while (!r->stop) {
        if (ftruncate(fd, 0) != 0)
            break;
        for (size_t off = 0; off < BIG_SIZE && !r->stop; off += BIG_CHUNK)
            if (pwrite(fd, r->content + off, BIG_CHUNK, (off_t)off) != (ssize_t)BIG_CHUNK)
                goto out;
        __atomic_add_fetch(&r->rounds, 1, __ATOMIC_RELAXED);
    }
out:
    close(fd);
    return NULL;
}

/* The child: hashes the header many times while a thread rewrites it.
 * Exit 0 when every digest it got was of bytes the file really held, 1
 * when one was not; a SIGBUS kills it. */
static int hash_under_rewrites(const char *path)
{
    unsigned char *content = malloc(BIG_SIZE);
    if (content == NULL)
        return 2;
    for (size_t i = 0; i < BIG_SIZE; i++)
        content[i] = (unsigned char)(i * 131u + (i >> 12));
    FILE *f = fopen(path, "w");
    if (f == NULL || fwrite(content, 1, BIG_SIZE, f) != BIG_SIZE || fclose(f) != 0)
        return 2;
    struct rewriter r = {.path = path, .content = content};
    pthread_t t;
    if (pthread_create(&t, NULL, rewrite_loop, &r) != 0)
        return 2;
    int bad = 0, stale = 0, ok = 0;
    for (int i = 0; i < 400 || __atomic_load_n(&r.rounds, __ATOMIC_RELAXED) < 20; i++) {
        if (i > 100000)
            break;
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        kc_digest d;
        int rc = kc__file_digest(path, &st, &d);
        if (rc == -ESTALE) {
            stale++;
            continue;
        }
        if (rc != 0)
            continue;
        ok++;
        /* Whatever the moment, the file holds a prefix of the content, and
         * a digest given for a size must be that prefix's. */
        XXH128_hash_t want = XXH3_128bits(content, (size_t)st.st_size);
        if (d.lo != want.low64 || d.hi != want.high64)
            bad++;
    }
    r.stop = 1;
    pthread_join(t, NULL);
    fprintf(stderr, "hashed: %d right, %d wrong, %d stale; %u rewrites\n", ok, bad, stale,
            r.rounds);
    free(content);
    return bad ? 1 : 0;
}

Test(deps, header_truncated_while_hashed)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/big.h", root);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(hash_under_rewrites(path));
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert_not(WIFSIGNALED(status), "the hashing process died of signal %d (%s)",
                  WTERMSIG(status), strsignal(WTERMSIG(status)));
    cr_assert_eq(WEXITSTATUS(status), 0, "a digest of bytes the file never held (%d)",
                 WEXITSTATUS(status));
}

/* NVRTC 13.5 names what it looks up under the working directory by an
 * absolute path made from it: kc__deps_note_cwd makes those relative again
 * (so the set is checked where each lookup runs), leaves the directory
 * itself and paths elsewhere alone, and for a request that names the
 * directory adds a KC_DEP_CWD dependency instead, which holds only there
 * (as NVRTC names it: $PWD when it names "."). */
Test(deps, paths_under_the_working_directory)
{
    char cwd[PATH_MAX], a[PATH_MAX], b[PATH_MAX];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    cr_assert_eq(mkdir(a, 0700), 0);
    cr_assert_eq(mkdir(b, 0700), 0);
    cr_assert_eq(chdir(a), 0);
    setenv("PWD", a, 1);
    char want[PATH_MAX];
    cr_assert_eq(kc__cwd(want, sizeof want), 0);
    cr_assert_str_eq(want, a);

    for (int ambiguous = 0; ambiguous < 2; ambiguous++) {
        struct kc__deps d = {0};
        d.cap = 8;
        d.v = calloc(d.cap, sizeof *d.v);
        char under[PATH_MAX + 16];
        snprintf(under, sizeof under, "%s/inc/h.h", a);
        const char *paths[] = {under, a, "/usr/include/x.h", "rel/y.h"};
        for (int i = 0; i < 4; i++) {
            d.v[d.n].path = strdup(paths[i]);
            d.v[d.n++].kind = KC_DEP_ABSENT;
        }
        cr_assert_eq(kc__deps_note_cwd(&d, ambiguous), 0);
        cr_assert_str_eq(d.v[1].path, a, "the directory itself is left as it is");
        cr_assert_str_eq(d.v[2].path, "/usr/include/x.h");
        cr_assert_str_eq(d.v[3].path, "rel/y.h");
        if (!ambiguous) {
            cr_assert_eq(d.n, 4);
            cr_assert_str_eq(d.v[0].path, "inc/h.h", "made relative again");
        } else {
            cr_assert_eq(d.n, 5, "a dependency on the directory");
            cr_assert_str_eq(d.v[0].path, under, "kept as named");
            cr_assert_eq(d.v[4].kind, KC_DEP_CWD);
            cr_assert_str_eq(d.v[4].path, a);
            both(&d.v[4], true, "in the directory");
            cr_assert_eq(chdir(b), 0);
            setenv("PWD", b, 1);
            both(&d.v[4], false, "in another directory");
            setenv("PWD", a, 1); /* names another directory than ".": not used */
            both(&d.v[4], false, "PWD naming another directory than .");
            cr_assert_eq(chdir(a), 0);
            both(&d.v[4], true, "back");
        }
        kc__deps_free(&d);
    }
    cr_assert_eq(chdir(cwd), 0);
}

/* The kind of the entry for `path` in d, or -1 when there is none. */
static int kind_in(const struct kc__deps *d, const char *path)
{
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(d->v[i].path, path) == 0)
            return d->v[i].kind;
    return -1;
}

/* What a tracked call reached decides, not where its path lies (issue 45):
 * a file on a real filesystem is a dependency by the path named, under
 * /proc/self/... and /dev/shm too, and absent there is recorded absent; the
 * runtime's own device nodes and /proc files are nothing; any other file
 * of /proc, or a FIFO, read makes the compile unkeyable, probed or
 * written only it does not; an open through a directory handle of a real
 * directory is unkeyable. */
Test(deps, kernel_objects_and_real_files)
{
    put("a.h", "int a;\n");
    char via[PATH_MAX + 32], fifo[PATH_MAX], gone[PATH_MAX + 32];
    snprintf(via, sizeof via, "/proc/self/root%s/a.h", root);
    snprintf(gone, sizeof gone, "/proc/self/root%s/none.h", root);
    snprintf(fifo, sizeof fifo, "%s/fifo", root);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    struct stat st;

    /* The runtime's own, and probes of kernel objects: nothing at all. */
    struct kc__deps d = {0};
    kc__deps_begin(&d);
    int fds[6] = {open("/dev/null", O_RDONLY),         open("/dev/null", O_WRONLY),
                  open("/proc/self/status", O_RDONLY), open("/proc/self", O_RDONLY | O_DIRECTORY),
                  open("/proc/self/comm", O_PATH),     open("/dev/nvidia-kc-none", O_RDONLY)};
    int dfd = open("/proc/self", O_RDONLY | O_DIRECTORY);
    int at = dfd >= 0 ? openat(dfd, "maps", O_RDONLY) : -1;
    stat("/proc/self/comm", &st);
    stat("/dev/zero", &st);
    access("/proc/cpuinfo", R_OK);
    kc__deps_end();
    cr_assert(!d.unkeyable && !d.writes && !d.failed);
    cr_assert_eq(d.n, 0, "nothing recorded (%zu, the first %s)", d.n, d.n ? d.v[0].path : "");
    for (int i = 0; i < 6; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (at >= 0)
        close(at);
    kc__deps_free(&d);

    /* Real files through /proc/self/root: dependencies by that name. */
    kc__deps_begin(&d);
    int fd = open(via, O_RDONLY);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_lt(open(gone, O_RDONLY), 0);
    kc__deps_end();
    cr_assert(!d.unkeyable && !d.writes);
    cr_assert_eq(kind_in(&d, via), KC_DEP_FILE);
    cr_assert_eq(kind_in(&d, gone), KC_DEP_ABSENT);
    cr_assert_eq(kc__deps_finish(&d), 0);
    both(&d.v[0], true, "a file read through /proc/self/root");
    kc__deps_free(&d);

    /* Read, a pseudo-file and a FIFO are unkeyable; so is a real file
     * opened through a directory handle. */
    const char *const what[] = {"/proc/self/comm", fifo, "a.h"};
    for (int i = 0; i < 3; i++) {
        int dir = open(root, O_RDONLY | O_DIRECTORY);
        cr_assert_geq(dir, 0);
        kc__deps_begin(&d);
        fd = i == 2 ? openat(dir, what[i], O_RDONLY) : open(what[i], O_RDONLY | O_NONBLOCK);
        kc__deps_end();
        cr_assert_geq(fd, 0, "%s", what[i]);
        close(fd);
        close(dir);
        cr_assert(d.unkeyable, "%s read: unkeyable", what[i]);
        cr_assert_eq(d.n, 0, "%s: no dependency", what[i]);
        kc__deps_free(&d);
    }

    /* Written: a pseudo-file only (no file changes), a regular file below
     * /dev/shm (tmpfs) a side effect; absent there, an absent dependency. */
    kc__deps_begin(&d);
    fd = open("/proc/self/comm", O_WRONLY);
    kc__deps_end();
    if (fd >= 0)
        close(fd);
    cr_assert(!d.unkeyable && !d.writes);
    kc__deps_free(&d);
    char shm[64] = "/dev/shm/kc-deps-XXXXXX";
    if (mkdtemp(shm) != NULL) {
        char f[128], none[128];
        snprintf(f, sizeof f, "%s/out", shm);
        snprintf(none, sizeof none, "%s/none.h", shm);
        kc__deps_begin(&d);
        fd = open(f, O_WRONLY | O_CREAT, 0600);
        cr_assert_lt(open(none, O_RDONLY), 0);
        kc__deps_end();
        cr_assert_geq(fd, 0);
        close(fd);
        cr_assert(d.writes, "a file written below /dev/shm is a side effect");
        cr_assert_eq(kind_in(&d, none), KC_DEP_ABSENT);
        kc__deps_free(&d);
        unlink(f);
        rmdir(shm);
    }
}

/* shim/bundled.c: which directories count as filled by the shim's own
 * install (empty, ours, private, no symlink), and the map made from one:
 * a dependency below it holds iff its digest is the map's, without a read;
 * a path the map lacks is checked on disk; a file in the tree that no
 * install makes (a symlink) gives no map. */
Test(deps, bundled_empty_dirs_and_the_map)
{
    char d[300], store[300], p[PATH_MAX];
    struct stat st;
    snprintf(d, sizeof d, "%s/dir", root);
    snprintf(store, sizeof store, "%s/store", root);
    cr_assert_eq(mkdir(d, 0700), 0);
    cr_assert_eq(mkdir(store, 0700), 0);
    cr_assert(kc__bundled_empty(d, &st), "an empty 0700 directory of ours");
    cr_assert(kc__bundled_same(d, &st));
    cr_assert_eq(chmod(d, 0750), 0);
    cr_assert(!kc__bundled_empty(d, &st), "group bits");
    cr_assert_eq(chmod(d, 0700), 0);
    snprintf(p, sizeof p, "%s/link", root);
    cr_assert_eq(symlink(d, p), 0);
    cr_assert(!kc__bundled_empty(p, &st), "a symlink to it");
    snprintf(p, sizeof p, "%s/missing", root);
    cr_assert(!kc__bundled_empty(p, &st), "no directory");
    put("dir/h.h", "int h;\n");
    cr_assert(!kc__bundled_empty(d, &st), "not empty");
    cr_assert_eq(mkdir(strcat(strcpy(p, d), "/sub"), 0755), 0);
    put("dir/sub/g.h", "int g;\n");
    put("dir/.nvrtc_headers_version", "timestamp 1\n");

    kc_digest id = {.lo = 1, .hi = 2}, other = {.lo = 3, .hi = 4};
    const struct kc__pristine *m = kc__pristine_get(store, &id, d, false);
    cr_assert_not_null(m, "made from the directory");
    kc_digest got;
    cr_assert(!kc__pristine_find(m, ".nvrtc_headers_version", &got), "the marker is left out");
    cr_assert(!kc__pristine_find(m, "nope.h", &got));
    cr_assert(kc__pristine_find(m, "sub/g.h", &got));
    struct kc__dep g = dep_at("dir/sub/g.h", KC_DEP_FILE);
    cr_assert(got.lo == g.digest.lo && got.hi == g.digest.hi, "the file's own digest");
    char hex[33];
    kc__digest_hex(&id, hex);
    snprintf(p, sizeof p, "%s/bundled/%s", store, hex);
    cr_assert_eq(stat(p, &st), 0, "written as %s", p);
    cr_assert_eq(st.st_mode & 0777, 0600);

    /* Below DIR, checked through the map: the file is not looked at. */
    struct kc__dep b = {.path = strdup("\001sub/g.h"), .kind = KC_DEP_FILE, .digest = g.digest};
    put("dir/sub/g.h", "int changed;\n");
    struct kc__dirs dirs = {.bundled = d, .pristine = m};
    cr_assert(kc__dep_holds(&b, &dirs));
    cr_assert_eq(dirs.bundled_mapped, 1);
    cr_assert_eq(dirs.bundled_read, 0);
    b.digest.lo ^= 1;
    cr_assert(!kc__dep_holds(&b, &dirs), "another digest than the map's");
    kc__dirs_close(&dirs);
    /* Without the map, the file is read. */
    b.digest.lo ^= 1;
    struct kc__dirs plain = {.bundled = d};
    cr_assert(!kc__dep_holds(&b, &plain), "what the file holds now");
    cr_assert_eq(plain.bundled_read, 1);
    kc__dirs_close(&plain);
    free(b.path);
    free(g.path);

    /* The same map, loaded, for this identity only; none made from a tree
     * with a symlink. */
    cr_assert_eq(kc__pristine_get(store, &id, d, false), m);
    snprintf(p, sizeof p, "%s/sub/s.h", d);
    cr_assert_eq(symlink("g.h", p), 0);
    cr_assert_null(kc__pristine_get(store, &other, d, false));
    cr_assert_null(kc__pristine_get(store, &other, d, true), "read-only: none made");
}
