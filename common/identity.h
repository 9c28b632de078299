/*
 * identity.h: hashing for keys and the identities kcache keys by: framed
 * streaming XXH3-128, the identity of an ELF file or a loaded object, and
 * the NVRTC and driver-JIT namespaces built from them. libc (and libdl)
 * only.
 */
#ifndef KCACHE_COMMON_IDENTITY_H
#define KCACHE_COMMON_IDENTITY_H

#include "digest.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Streaming XXH3-128 with framing: every field is length-prefixed so
 * ("ab","c") and ("a","bc") hash differently. */
struct kc__hasher;
struct kc__hasher *kc__hasher_new(void);
void kc__hasher_free(struct kc__hasher *h);
void kc__hash_bytes(struct kc__hasher *h, const void *p, size_t n);
void kc__hash_str(struct kc__hasher *h, const char *s); /* NULL hashes as absent */
void kc__hash_u64(struct kc__hasher *h, uint64_t v);
kc_digest kc__hash_digest(struct kc__hasher *h);
/* A new hasher in h's state (h unchanged), or NULL (out of memory): a
 * prefix hashed once, continued in several ways. Freed by kc__hasher_free. */
struct kc__hasher *kc__hasher_dup(const struct kc__hasher *h);
/* Copies n bytes from src to dst (not overlapping) and hashes them as
 * kc__hash_bytes(h, src, n) would, in one pass: each chunk is hashed from
 * dst while the copy has it in cache. h NULL: the copy alone. */
void kc__hash_copy(struct kc__hasher *h, void *dst, const void *src, size_t n);

/* struct stat, for the prototype below. */
struct stat;

/* XXH3-128 of the first before->st_size bytes of the open file fd, read with
 * pread in bounded chunks (never mapped: a file truncated under a mapping
 * faults with SIGBUS in the reader). `before` is the file's fstat taken by
 * the caller before the call. 0; -ESTALE when the file changed while it was
 * read (a short read, or size, mtime or ctime no longer those of `before`):
 * the digest would not be of any one version of the file; -ENOMEM; or the
 * read's negative errno. *out is written only on 0. */
int kc__digest_fd(int fd, const struct stat *before, kc_digest *out);
/* Whether two stats are of one file in one state: device, inode, size,
 * mtime and ctime. */
bool kc__same_file_state(const struct stat *a, const struct stat *b);
void kc__digest_hex(const kc_digest *d, char out[33]);

/* The GNU build-id of the ELF file at `path` (or, without one, a digest of
 * its contents): reads the ELF header, program headers and notes, and the
 * whole file only when it has no build-id. 0 or negative errno. */
int kc__file_identity(const char *path, kc_digest *out);

/* The name of the loaded object holding `addr`, as dladdr's dli_fname
 * gives it (the loader's name; the main program's is argv[0]), found
 * without dladdr's walk of the object's symbol table; NULL when no loaded
 * object holds addr. Valid while the object stays loaded. */
const char *kc__loaded_name(const void *addr);

/* The identity of the loaded object holding `addr`, as kc__file_identity
 * gives for its file: the build-id read from the notes already mapped (no
 * system call), else the file's identity. 0 or negative errno. */
int kc__loaded_identity(const void *addr, kc_digest *out);

/* Calls each(name, arg) for every function the loaded object holding
 * `addr` exports (defined global or weak functions of its dynamic symbol
 * table, read from memory), in table order, until one returns non-zero.
 * Returns that value, 0 when all were seen, or -ENOENT when the object or
 * its table cannot be found. */
int kc__loaded_exports(const void *addr, int (*each)(const char *name, void *arg), void *arg);

/* NVRTC's namespace, "nvrtc:<major>.<minor>-<16 hex digits>-f<format>",
 * and the identity digest behind it (*id, when not NULL): the version and
 * the build-ids of the libnvrtc holding `compile` (the real
 * nvrtcCompileProgram) and of the libnvrtc-builtins loaded or beside it.
 * An entry of one NVRTC build never serves another. 0, or -ENOMEM. */
int kc__nvrtc_namespace(const void *compile, int major, int minor, int format, char *ns, size_t len,
                        kc_digest *id);

/* libNVVM's namespace, "nvvm:<major>.<minor>-<16 hex digits>-f<format>",
 * and the identity digest behind it (*id, when not NULL): nvvmVersion
 * (major, minor), nvvmIRVersion (ir[4]: major, minor, debug major, debug
 * minor) and the build-id of the libnvvm holding `compile` (the real
 * nvvmCompileProgram). An entry of one libNVVM build never serves another.
 * 0, or -ENOMEM. */
int kc__nvvm_namespace(const void *compile, int major, int minor, const int ir[4], int format,
                       char *ns, size_t len, kc_digest *id);

/* The JIT namespace of a device: "jit:" and 16 hex digits of the digest of
 * its compute capability, the driver's version and libcuda's build-id, so
 * an entry for one device and driver never serves another. The digest goes
 * to *fp when fp is not NULL (cuLink* keys hash it). 0, or -ENOMEM. */
int kc__jit_namespace(int major, int minor, int version, const kc_digest *lib, char *ns, size_t len,
                      kc_digest *fp);

#endif
