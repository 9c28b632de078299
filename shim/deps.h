/*
 * Header tracking: while a compile runs on a thread, the libc calls NVRTC
 * uses to find and read headers (open, fopen, __xstat, stat, access) are
 * recorded, so the files a compile read and the paths it probed and did not
 * find can be checked on every later lookup (ccache's direct mode). What a
 * call reached decides, not where its path lies: a regular file or
 * directory on a real filesystem is a dependency by the path the compile
 * named (/dev/shm/..., /proc/self/cwd/... too); the kernel's own objects
 * (devices, FIFOs, sockets, files of /proc, /sys) are no input when only
 * probed or when the runtime reads them for itself (the driver's device
 * nodes and /proc files), and make the compile pass through when read
 * otherwise.
 */
#ifndef KCACHE_DEPS_H
#define KCACHE_DEPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "../store/store.h"

enum kc__dep_kind {
    KC_DEP_ABSENT = 0,  /* probed, not found */
    KC_DEP_FILE = 1,    /* read: content digest */
    KC_DEP_DIR = 2,     /* exists, a directory */
    KC_DEP_OTHER = 3,   /* exists, stat'ed only (not read) */
    KC_DEP_CWD = 4,     /* the working directory was this one (kc__cwd): the
                           compile named paths under it that may be absolute
                           as given (kc__deps_note_cwd) */
    KC_DEP_WRITTEN = 5, /* opened for writing (a tool's run only) */
    KC_DEP_CREATED = 6, /* made by the open (O_CREAT|O_EXCL; a tool's run only) */
};

struct kc__dep {
    char *path; /* as the compile named it */
    int kind;
    kc_digest digest; /* KC_DEP_FILE only */
    struct stat st;   /* as seen when the compile opened it */
    /* KC_DEP_FILE: the file's identity when its digest was taken (device,
     * inode, size, mtime and ctime in ns), or all zero. A lookup whose stat
     * matches it exactly trusts the digest without reading the file: any
     * write changes ctime, which no user can set back. Zero when the file
     * had changed within 2 s of recording (the clock's granularity could
     * hide a second write). */
    uint64_t fp[5];
};

struct kc__deps {
    struct kc__dep *v;
    size_t n, cap;
    bool writes; /* something was opened for writing: side effects */
    bool failed; /* out of memory or a file changed under the compile */
    /* The compile read a file kcache cannot key (a device node, FIFO or
     * socket, a file of /proc or /sys, one opened by a directory handle)
     * that is not its runtime's own (deps.c's runtime_own): it passes
     * through (KC_PASS_unkeyable). */
    bool unkeyable;
    bool process; /* a tool's run: every thread's calls, writes named */
    /* The filesystems met, by device, and whether each is one of the
     * kernel's pseudo filesystems (asked once each, then remembered). */
    struct kc__fs {
        dev_t dev;
        bool pseudo;
    } fs[8];
    unsigned fs_n;
    /* NVRTC's bundled headers directory of the compile (--use-bundled-
     * headers=DIR), or NULL: NVRTC's own writes under it are no side
     * effect, and a file read under it is recorded as KC_DEP_BUNDLED
     * followed by its path below DIR, checked later below the DIR of the
     * request looked up. */
    const char *bundled;
};

/* The first byte of a dependency path below the bundled headers directory. */
#define KC_DEP_BUNDLED '\x01'

/* Appends a zeroed entry for `path` (copied) of `kind` to d. Returns it,
 * or NULL when out of memory (d unchanged). */
struct kc__dep *kc__deps_push(struct kc__deps *d, const char *path, int kind);

/* Starts recording on this thread into d (zeroed by the caller). */
void kc__deps_begin(struct kc__deps *d);

/* Starts recording every thread's calls into d (zeroed by the caller), for
 * the rest of the process: a compiler tool's run (tool.c). Files opened
 * for writing are recorded too, as KC_DEP_WRITTEN. A set already recording
 * (an nvcc tree's, tree.c) goes on recording every call beside d. */
void kc__deps_begin_process(struct kc__deps *d);

/* Stops kc__deps_begin_process's recording: once it returns, no thread
 * adds to the set. */
void kc__deps_end_process(void);

/* Stops recording on this thread. */
void kc__deps_end(void);

/* Computes the content digests of the files read, checking each is
 * unchanged since the compile opened it. 0, or -ESTALE when one changed
 * (the result must not be cached), or another negative errno. */
int kc__deps_finish(struct kc__deps *d);

void kc__deps_free(struct kc__deps *d);

/* Directory handles kept for one check of a dependency set (zeroed by the
 * caller, closed with kc__dirs_close). At most KC__DIRS_OPEN are open at
 * once, and none near the process's fd limit; paths point into the set. */
#define KC__DIRS_SLOTS 128
#define KC__DIRS_OPEN 32
struct kc__dirs {
    struct kc__dir_slot {
        const char *dir; /* not NUL-terminated: len bytes */
        size_t len;      /* 0: free */
        uint64_t hash;
        int fd; /* or -ENOENT / -ENOTDIR, or not opened yet (deps.c) */
    } slot[KC__DIRS_SLOTS];
    int open, fd_limit;
    const char *bundled; /* the bundled headers directory of the lookup, or NULL */
    /* What `bundled` holds when the shim's own install just filled it from
     * empty (bundled.c): its files are checked against this map, never
     * read. NULL: they are stat'ed and read. */
    const struct kc__pristine *pristine;
    /* Set when `bundled` was filled in an earlier call of this process
     * (kc__pristine_recall): a file answers by the map only while its stat
     * proves it unchanged since (kc__pristine_unchanged). */
    const struct kc__pristine_proof *proof;
    char parent_ok[256]; /* the last directory below it proved unchanged ("" none) */
    /* KC_DEP_FILE dependencies below `bundled`: checked, answered by the
     * pristine map, read (digested) for the check. */
    uint64_t bundled_checked, bundled_mapped, bundled_read;
};
void kc__dirs_close(struct kc__dirs *ds);

/* NVRTC's bundled headers as its install writes them into an empty
 * directory, for one NVRTC identity (bundled.c): each file's path below
 * DIR and its content digest. */
struct kc__pristine;

/* The digest of the file `rel` (a path below DIR as a KC_DEP_BUNDLED
 * dependency names it, without its first byte) in the map: false when the
 * map has no such file (the caller then looks at the file itself). */
bool kc__pristine_find(const struct kc__pristine *m, const char *rel, kc_digest *out);

/* The map of the NVRTC of identity `id` for `dir`, a bundled headers
 * directory the shim's own install has just filled from empty (this call:
 * kc__bundled_empty before it, kc__bundled_same after). Loaded once per
 * process from the store's (`store`) DIR/bundled/<id>; when there is none, made from
 * `dir` (every file read) and written there (not for a read-only store). A
 * map there that fails a check (not the owner's only, corrupt, another
 * identity's) is ignored with one warning and made again: NULL for this
 * call, as when there is no map. */
const struct kc__pristine *kc__pristine_get(const char *store, const kc_digest *id, const char *dir,
                                            bool readonly);

/* Fills `dir` (empty and private: kc__bundled_empty) with what NVRTC's
 * install of identity `id` writes, holding NVRTC's install lock
 * (dir/.nvrtc_install.lock, as its install takes it): from a ready copy
 * the owner made for this umask (checked, then moved in, on the store's
 * filesystem), else from the store's copy (reflinks where the filesystem
 * has them, else copies), each file checked against the map before it is
 * added; the version marker last. A fill only adds: nothing in `dir` is
 * removed or replaced. Unless `readonly`, asks the owner for the next
 * ready copy. 0 with *map, that map; -EBUSY when another process holds
 * the lock or `dir` holds anything but it (another process installs into
 * it, or has: NVRTC's install waits for it, and `dir` is not this call's
 * from empty); another error: `dir` holds the lock and files the fill
 * checked, no marker, and NVRTC's install completes it into exactly its
 * own (-ENOENT when the store has no copy or map; a copy that fails its
 * check is dropped, one warning). */
int kc__pristine_fill(const char *store, const kc_digest *id, const char *dir, bool readonly,
                      const struct kc__pristine **map);

/* Keeps in the store a copy of `dir`, which NVRTC's install has just filled
 * from empty and whose map is m (kc__pristine_get), unless it has one, and
 * asks the owner for ready copies of it. */
void kc__pristine_keep(const char *store, const kc_digest *id, const char *dir,
                       const struct kc__pristine *m);

/* When a DIR of this process went from empty to NVRTC's bytes (an install
 * or a fill): its device, and the coarse realtime clock read right after,
 * with the system call itself. */
struct kc__pristine_proof {
    dev_t dev;
    struct timespec since;
};

/* Remembers `dir` (st: its stat before the fill) as filled with the files
 * of map `m` at `since`, when its filesystem keeps timestamps from that
 * clock (ext2/3/4, XFS, Btrfs, tmpfs, overlayfs, F2FS: local, nanosecond
 * granularity); at most 16 per process, the oldest forgotten. */
void kc__pristine_remember(const char *dir, const struct stat *st, const struct kc__pristine *m,
                           const struct timespec *since);

/* The coarse realtime clock (the one inode timestamps come from), from
 * the kernel: no interposed clock_gettime (libfaketime) is asked. */
void kc__pristine_clock(struct timespec *ts);

/* Whether `dir`, as a later call finds it, is remembered and still that
 * directory (device and inode), ours and private: then *map is its map and
 * *proof when it was filled (copies: the table may forget it meanwhile). */
bool kc__pristine_recall(const char *dir, const struct kc__pristine **map,
                         struct kc__pristine_proof *proof);

/* Whether the file `rel` below DIR (path: DIR/rel) is provably what the
 * fill left there: a regular file on DIR's device whose ctime, and that
 * of every directory between DIR and it, is earlier than pd's time and
 * has sub-microsecond digits (the filesystem keeps them); pd: the
 * fill's proof. Any write,
 * rename, link or unlink after the fill sets a later ctime, which user
 * space cannot set back. parent_ok (256 bytes): the memo of the last
 * directory so proved. */
bool kc__pristine_unchanged(const struct kc__pristine_proof *pd, const char *rel, const char *path,
                            char *parent_ok);

/* Whether `dir` is an empty directory (not a symlink) of ours that no other
 * user can enter (mode 0700 or less): what mkdtemp makes. *st: its stat. */
bool kc__bundled_empty(const char *dir, struct stat *st);

/* Whether `dir` is still that directory (`before`), ours and private. */
bool kc__bundled_same(const char *dir, const struct stat *before);

/* Whether the dependency still holds: the path is still absent, still a
 * directory, or still has the same content. A file whose stat matches the
 * dependency's fingerprint is not read; otherwise its content is hashed
 * through an in-process memo keyed by (path, device, inode, size, mtime,
 * ctime), so an unchanged file is read once per process at most. `dirs`
 * (may be NULL) keeps directory handles across the checks of one set. */
bool kc__dep_holds(const struct kc__dep *dep, struct kc__dirs *dirs);

/* The fingerprint a dependency records (device, inode, size, mtime and
 * ctime in ns) for a file whose content is read now and described by st,
 * or all zero when it changed within 2 s of now (a second write within the
 * clock's granularity could keep those times). */
void kc__dep_fingerprint(const struct stat *st, uint64_t fp[5]);

/* The working directory as NVRTC (LLVM) names it: $PWD when it is
 * absolute and names the same directory as ".", else getcwd(). 0 or
 * -errno (removed, longer than len). */
int kc__cwd(char *buf, size_t len);

/* After kc__deps_finish: paths the compile named under the working
 * directory (NVRTC 13.5 joins it with every relative name it looks up:
 * the program name, include directories, header names) are made relative
 * again, so they are checked where each lookup runs, as that NVRTC would
 * look them up there. When the request itself names the directory
 * (`ambiguous`: an absolute include path or name under it), such a path
 * may be absolute as given: a KC_DEP_CWD dependency on the directory is
 * added instead, so the set holds only there. 0 or -errno. */
int kc__deps_note_cwd(struct kc__deps *d, bool ambiguous);

/* The content digest of a regular file, through the memo. 0 or -errno. */
int kc__file_digest(const char *path, const struct stat *st, kc_digest *out);

#endif
