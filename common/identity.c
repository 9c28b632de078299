/*
 * identity.c: hashing for keys (framed streaming XXH3-128), the identity of
 * an ELF file or a loaded object (its GNU build-id, or a digest of its
 * contents), and the namespaces built from them (identity.h). The shim
 * keys with these; the tool names this machine's namespaces with the same
 * code.
 */
#include "identity.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

struct kc__hasher {
    XXH3_state_t st;
    void *raw; /* what malloc returned */
};

/* XXH3's state is 64-byte aligned (its vector code may load it so), but
 * never from aligned_alloc: a host may replace malloc and free only (cicc
 * exports its own), and free would then be handed glibc's block. */
static struct kc__hasher *hasher_alloc(void)
{
    void *raw = malloc(sizeof(struct kc__hasher) + 63);
    if (raw == NULL)
        return NULL;
    struct kc__hasher *h = (struct kc__hasher *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    h->raw = raw;
    return h;
}

struct kc__hasher *kc__hasher_new(void)
{
    struct kc__hasher *h = hasher_alloc();
    if (h != NULL)
        XXH3_128bits_reset(&h->st);
    return h;
}

void kc__hasher_free(struct kc__hasher *h)
{
    if (h != NULL)
        free(h->raw);
}

void kc__hash_u64(struct kc__hasher *h, uint64_t v)
{
    XXH3_128bits_update(&h->st, &v, sizeof v);
}

void kc__hash_bytes(struct kc__hasher *h, const void *p, size_t n)
{
    kc__hash_u64(h, (uint64_t)n);
    if (n > 0)
        XXH3_128bits_update(&h->st, p, n);
}

void kc__hash_str(struct kc__hasher *h, const char *s)
{
    if (s == NULL) {
        kc__hash_u64(h, UINT64_MAX);
        return;
    }
    kc__hash_bytes(h, s, strlen(s));
}

struct kc__hasher *kc__hasher_dup(const struct kc__hasher *h)
{
    struct kc__hasher *d = hasher_alloc();
    if (d != NULL)
        XXH3_copyState(&d->st, &h->st);
    return d;
}

/* 64 KiB: a chunk copied is still in the core's L2 when it is hashed. */
#define HASH_COPY_CHUNK (64u << 10)

void kc__hash_copy(struct kc__hasher *h, void *dst, const void *src, size_t n)
{
    if (h == NULL) {
        memcpy(dst, src, n);
        return;
    }
    kc__hash_u64(h, (uint64_t)n);
    for (size_t off = 0; off < n; off += HASH_COPY_CHUNK) {
        size_t m = n - off < HASH_COPY_CHUNK ? n - off : HASH_COPY_CHUNK;
        memcpy((char *)dst + off, (const char *)src + off, m);
        XXH3_128bits_update(&h->st, (const char *)dst + off, m);
    }
}

kc_digest kc__hash_digest(struct kc__hasher *h)
{
    XXH128_hash_t r = XXH3_128bits_digest(&h->st);
    return (kc_digest){.lo = r.low64, .hi = r.high64};
}

/* 64 KiB: below malloc's mmap threshold, so a buffer costs no system call. */
#define DIGEST_CHUNK (64u << 10)

bool kc__same_file_state(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

int kc__digest_fd(int fd, const struct stat *before, kc_digest *out)
{
    uint64_t size = before->st_size > 0 ? (uint64_t)before->st_size : 0;
    size_t cap = size < DIGEST_CHUNK ? (size_t)size : DIGEST_CHUNK;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (buf == NULL)
        return -ENOMEM;
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    int rc = 0;
    for (uint64_t off = 0; off < size;) {
        size_t want = size - off < cap ? (size_t)(size - off) : cap;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            goto out;
        }
        if (r == 0) {
            rc = -ESTALE; /* truncated under us */
            goto out;
        }
        XXH3_128bits_update(&st, buf, (size_t)r);
        off += (uint64_t)r;
    }
    struct stat after;
    if (fstat(fd, &after) != 0) {
        rc = -errno;
        goto out;
    }
    if (!kc__same_file_state(before, &after)) {
        rc = -ESTALE;
        goto out;
    }
    XXH128_hash_t r = XXH3_128bits_digest(&st);
    *out = (kc_digest){.lo = r.low64, .hi = r.high64};
out:
    free(buf);
    return rc;
}

void kc__digest_hex(const kc_digest *d, char out[33])
{
    static const char hex[] = "0123456789abcdef";
    uint64_t parts[2] = {d->hi, d->lo};
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 16; i++)
            out[p * 16 + i] = hex[(parts[p] >> (60 - 4 * i)) & 0xf];
    out[32] = '\0';
}

/* Looks for NT_GNU_BUILD_ID among the notes of one PT_NOTE segment (its
 * p_filesz bytes at `m`). 0 with *out set to the digest of the id, or
 * -ENOENT. A malformed note ends the segment, as the loader would. */
static int note_build_id(const unsigned char *m, size_t size, kc_digest *out)
{
    size_t off = 0;
    while (size - off >= sizeof(Elf64_Nhdr)) {
        Elf64_Nhdr n;
        memcpy(&n, m + off, sizeof n);
        size_t name = (n.n_namesz + 3) & ~3u, desc = (n.n_descsz + 3) & ~3u;
        size_t body = off + sizeof n;
        if (name > size - body || desc > size - body - name)
            break;
        if (n.n_type == NT_GNU_BUILD_ID && n.n_namesz == 4 && memcmp(m + body, "GNU", 4) == 0 &&
            n.n_descsz > 0) {
            *out = kc_digest_of(m + body + name, n.n_descsz);
            return 0;
        }
        off = body + name + desc;
    }
    return -ENOENT;
}

/* Reads exactly n bytes at off. 0, -EIO on a short read, or -errno. */
static int pread_full(int fd, void *buf, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -EIO;
        got += (size_t)r;
    }
    return 0;
}

/* The first bytes of an ELF file, read at once, and the file's size. */
struct elf_file {
    int fd;
    uint64_t size;
    unsigned char head[4096];
    size_t got; /* bytes of head read */
};

/* The bytes of [off, off + len), or NULL when they lie outside the file or
 * cannot be read: in head, else read into *buf (malloc'd, the caller
 * frees). */
static const unsigned char *ef_bytes(const struct elf_file *e, uint64_t off, uint64_t len,
                                     unsigned char **buf)
{
    if (off > e->size || len > e->size - off)
        return NULL;
    if (off <= e->got && len <= e->got - off)
        return e->head + off;
    free(*buf);
    *buf = malloc(len ? len : 1);
    if (*buf == NULL || pread_full(e->fd, *buf, len, (off_t)off) != 0)
        return NULL;
    return *buf;
}

/* Looks for NT_GNU_BUILD_ID in the PT_NOTE segments of the ELF64 file open
 * at fd (size bytes), reading only its header, program headers and notes
 * (one read when they lie in its first 4 KiB). 0 with *out set; -ENOENT
 * when the file has none (or is not ELF64); another negative errno when it
 * could not be read. The checks are those of a parse of the whole file
 * mapped: a region outside the file is not looked at. */
static int file_build_id(int fd, uint64_t size, kc_digest *out)
{
    struct elf_file e = {.fd = fd, .size = size};
    ssize_t r;
    do
        r = pread(fd, e.head, sizeof e.head, 0);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return -errno;
    e.got = (size_t)r;
    Elf64_Ehdr eh;
    unsigned char *buf = NULL, *notebuf = NULL;
    const unsigned char *p = ef_bytes(&e, 0, sizeof eh, &buf);
    if (p != NULL)
        memcpy(&eh, p, sizeof eh);
    free(buf);
    buf = NULL;
    if (p == NULL || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr))
        return -ENOENT;
    uint64_t phlen = (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr);
    if (eh.e_phoff > size || phlen > size - eh.e_phoff)
        return -ENOENT;
    const unsigned char *phs = ef_bytes(&e, eh.e_phoff, phlen, &buf);
    int rc = phs == NULL ? -EIO : -ENOENT;
    for (int i = 0; phs != NULL && i < eh.e_phnum; i++) {
        Elf64_Phdr ph;
        memcpy(&ph, phs + (size_t)i * sizeof ph, sizeof ph);
        if (ph.p_type != PT_NOTE || ph.p_offset > size || ph.p_filesz > size - ph.p_offset)
            continue;
        const unsigned char *n = ef_bytes(&e, ph.p_offset, ph.p_filesz, &notebuf);
        if (n == NULL) {
            rc = -EIO;
            break;
        }
        if (note_build_id(n, ph.p_filesz, out) == 0) {
            rc = 0;
            break;
        }
    }
    free(buf);
    free(notebuf);
    return rc;
}

int kc__file_identity(const char *path, kc_digest *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        int e = errno ? -errno : -EINVAL;
        close(fd);
        return e;
    }
    int rc = file_build_id(fd, (uint64_t)st.st_size, out);
    if (rc != -ENOENT) {
        close(fd);
        return rc;
    }
    /* No build-id: the contents are the identity (read, not mapped: a file
     * replaced in place under a mapping faults with SIGBUS). */
    rc = kc__digest_fd(fd, &st, out);
    close(fd);
    return rc;
}

struct mapped_note {
    const void *addr; /* an address inside the object */
    const char *name; /* the object's name as the loader has it, once found */
    int rc;           /* -ENOENT until found in memory */
    kc_digest id;
};

/* Whether one of the object's loaded segments holds addr (as dladdr tells
 * the object apart, without its walk of the symbol table). */
static bool holds(const struct dl_phdr_info *info, uintptr_t addr)
{
    /* Every segment lies at or above the load bias (p_vaddr is unsigned),
     * unless the bias is negative (a prelinked object loaded below its
     * addresses): an object based above addr is ruled out without reading
     * its program headers, a page of its own each (in a Python process,
     * a hundred objects: ~30 us of cache and TLB misses). */
    if (info->dlpi_addr <= UINTPTR_MAX / 2 && addr < info->dlpi_addr)
        return false;
    const ElfW(Phdr) *ph = info->dlpi_phdr;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (ph[i].p_type == PT_LOAD && addr >= info->dlpi_addr + ph[i].p_vaddr &&
            addr - (info->dlpi_addr + ph[i].p_vaddr) < ph[i].p_memsz)
            return true;
    return false;
}

static int find_name(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct mapped_note *a = arg;
    (void)size;
    if (!holds(info, (uintptr_t)a->addr))
        return 0;
    a->name = info->dlpi_name;
    return 1;
}

const char *kc__loaded_name(const void *addr)
{
    struct mapped_note a = {.addr = addr};
    if (addr == NULL)
        return NULL;
    /* One pass over the loaded objects' program headers: dladdr walks the
     * object's symbol table too (~10k instructions on libkcache.so). The
     * main program has no name there: dladdr's is argv[0]. */
    dl_iterate_phdr(find_name, &a);
    if (a.name != NULL && a.name[0] != '\0')
        return a.name;
    Dl_info info;
    return dladdr(addr, &info) != 0 ? info.dli_fname : NULL;
}

/* For the object `info` describes (the one holding a->addr), its name
 * and the build-id from the notes the loader mapped. Each PT_NOTE, in
 * order, must lie in the file-backed part of a PT_LOAD at the same file
 * offset, so the bytes read are exactly the ones file_build_id() would
 * read; one that does not leaves a->rc at -ENOENT (the caller reads the
 * file). */
static void read_mapped_note(const struct dl_phdr_info *info, struct mapped_note *a)
{
    const ElfW(Phdr) *ph = info->dlpi_phdr;
    a->name = info->dlpi_name;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (ph[i].p_type != PT_NOTE)
            continue;
        bool mapped = false;
        for (int j = 0; j < info->dlpi_phnum && !mapped; j++) {
            const ElfW(Phdr) *l = &ph[j];
            mapped = l->p_type == PT_LOAD && ph[i].p_vaddr >= l->p_vaddr &&
                     ph[i].p_offset >= l->p_offset &&
                     ph[i].p_vaddr - l->p_vaddr == ph[i].p_offset - l->p_offset &&
                     ph[i].p_vaddr - l->p_vaddr <= l->p_filesz &&
                     ph[i].p_filesz <= l->p_filesz - (ph[i].p_vaddr - l->p_vaddr);
        }
        if (!mapped)
            return; /* not readable here: the file decides */
        const unsigned char *m = (const unsigned char *)(info->dlpi_addr + ph[i].p_vaddr);
        if (note_build_id(m, ph[i].p_filesz, &a->id) == 0) {
            a->rc = 0;
            return;
        }
    }
}

/* dl_iterate_phdr callback: read_mapped_note for the object holding
 * a->addr; other objects' notes are not touched. */
static int find_mapped_note(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct mapped_note *a = arg;
    (void)size;
    if (!holds(info, (uintptr_t)a->addr))
        return 0;
    read_mapped_note(info, a);
    return 1;
}

/* What kc__loaded_identity makes of a pass's answer: the build-id read in
 * memory, else the file's identity by the object's name. */
static int mapped_identity(const struct mapped_note *a, kc_digest *out)
{
    if (a->rc == 0) {
        *out = a->id;
        return 0;
    }
    if (a->name == NULL)
        return -ENOENT; /* in no loaded object */
    const char *name = kc__loaded_name(a->addr);
    return name != NULL ? kc__file_identity(name, out) : -ENOENT;
}

int kc__loaded_identity(const void *addr, kc_digest *out)
{
    struct mapped_note a = {.addr = addr, .rc = -ENOENT};
    if (addr == NULL)
        return -EINVAL;
    /* One pass finds the object and reads its notes (no dladdr). */
    dl_iterate_phdr(find_mapped_note, &a);
    return mapped_identity(&a, out);
}

/* Whether a loaded object's name is libnvrtc-builtins' (by its base name). */
static bool is_builtins(const char *name)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    return strncmp(base, "libnvrtc-builtins", 17) == 0;
}

/* One pass over the loaded objects for NVRTC's identity: the object
 * holding its compile function (its name and mapped build-id, as
 * kc__loaded_identity's pass) and the first libnvrtc-builtins loaded. In
 * a Python process (a hundred objects and more) each pass costs ~15k
 * instructions; three were made. */
struct nvrtc_scan {
    struct mapped_note lib;
    bool lib_seen;
    char *builtins; /* 4096 bytes; "" until found */
};

static int nvrtc_scan_one(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct nvrtc_scan *sc = arg;
    (void)size;
    if (sc->builtins[0] == '\0' && is_builtins(info->dlpi_name))
        snprintf(sc->builtins, 4096, "%s", info->dlpi_name);
    if (!sc->lib_seen && holds(info, (uintptr_t)sc->lib.addr)) {
        read_mapped_note(info, &sc->lib);
        sc->lib_seen = true;
    }
    return sc->lib_seen && sc->builtins[0] != '\0';
}

int kc__nvrtc_namespace(const void *compile, int major, int minor, int format, char *ns, size_t len,
                        kc_digest *id)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL)
        return -ENOMEM;
    kc__hash_str(h, "nvrtc-identity");
    kc__hash_u64(h, (uint64_t)major << 32 | (uint32_t)minor);
    char path[4096] = "";
    struct nvrtc_scan sc = {.lib = {.addr = compile, .rc = -ENOENT}, .builtins = path};
    const char *lib = NULL;
    if (compile != NULL) {
        dl_iterate_phdr(nvrtc_scan_one, &sc);
        /* kc__loaded_name: the loader's name, else dladdr's (the main
         * program has none there). */
        lib =
            sc.lib.name != NULL && sc.lib.name[0] != '\0' ? sc.lib.name : kc__loaded_name(compile);
    }
    kc_digest d;
    if (lib != NULL && mapped_identity(&sc.lib, &d) == 0) {
        kc__hash_bytes(h, &d, sizeof d);
        /* libnvrtc-builtins: loaded, or beside libnvrtc. */
        if (path[0] == '\0') {
            const char *slash = strrchr(lib, '/');
            int dir = slash ? (int)(slash - lib) + 1 : 0;
            snprintf(path, sizeof path, "%.*slibnvrtc-builtins.so.%d.%d", dir, lib, major, minor);
        }
    } else {
        path[0] = '\0';
        kc__hash_str(h, "unknown-libnvrtc");
    }
    if (path[0] != '\0' && kc__file_identity(path, &d) == 0)
        kc__hash_bytes(h, &d, sizeof d);
    else
        kc__hash_str(h, "unknown-builtins");
    kc_digest digest = kc__hash_digest(h);
    kc__hasher_free(h);
    snprintf(ns, len, "nvrtc:%d.%d-%016llx-f%d", major, minor, (unsigned long long)digest.lo,
             format);
    if (id != NULL)
        *id = digest;
    return 0;
}

int kc__nvvm_namespace(const void *compile, int major, int minor, const int ir[4], int format,
                       char *ns, size_t len, kc_digest *id)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL)
        return -ENOMEM;
    kc__hash_str(h, "nvvm-identity");
    kc__hash_u64(h, (uint64_t)major << 32 | (uint32_t)minor);
    for (int i = 0; i < 4; i++)
        kc__hash_u64(h, (uint64_t)(uint32_t)ir[i]);
    kc_digest d;
    if (compile != NULL && kc__loaded_identity(compile, &d) == 0)
        kc__hash_bytes(h, &d, sizeof d);
    else
        kc__hash_str(h, "unknown-libnvvm");
    kc_digest digest = kc__hash_digest(h);
    kc__hasher_free(h);
    snprintf(ns, len, "nvvm:%d.%d-%016llx-f%d", major, minor, (unsigned long long)digest.lo,
             format);
    if (id != NULL)
        *id = digest;
    return 0;
}

int kc__jit_namespace(int major, int minor, int version, const kc_digest *lib, char *ns, size_t len,
                      kc_digest *fp)
{
    struct kc__hasher *fh = kc__hasher_new();
    if (fh == NULL)
        return -ENOMEM;
    kc__hash_u64(fh, (uint64_t)major);
    kc__hash_u64(fh, (uint64_t)minor);
    kc__hash_u64(fh, (uint64_t)version);
    kc__hash_bytes(fh, lib, sizeof *lib);
    kc_digest d = kc__hash_digest(fh);
    kc__hasher_free(fh);
    char hex[33];
    kc__digest_hex(&d, hex);
    snprintf(ns, len, "jit:%.16s", hex);
    if (fp != NULL)
        *fp = d;
    return 0;
}

/* ---- exports of a loaded object ------------------------------------------------ */

/* The number of dynamic symbols, from DT_HASH's nchain or by walking
 * DT_GNU_HASH's chains to their last entry; 0 when neither is there. */
static size_t dynsym_count(const ElfW(Word) * hash, const uint32_t *gnu)
{
    if (hash != NULL)
        return hash[1];
    if (gnu == NULL)
        return 0;
    uint32_t nbuckets = gnu[0], symoff = gnu[1], bloom = gnu[2];
    const uint32_t *buckets = gnu + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t b = 0; b < nbuckets; b++)
        if (buckets[b] > last)
            last = buckets[b];
    if (last < symoff)
        return symoff;
    while ((chain[last - symoff] & 1) == 0)
        last++;
    return (size_t)last + 1;
}

int kc__loaded_exports(const void *addr, int (*each)(const char *name, void *arg), void *arg)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (addr == NULL || dladdr1(addr, &info, (void **)&lm, RTLD_DL_LINKMAP) == 0 || lm == NULL ||
        lm->l_ld == NULL)
        return -ENOENT;
    const ElfW(Sym) *sym = NULL;
    const char *str = NULL;
    const ElfW(Word) *hash = NULL;
    const uint32_t *gnu = NULL;
    uintptr_t base = (uintptr_t)lm->l_addr;
    /* The loader relocates these entries in place where the dynamic
     * section is writable; where it is not they are still link-time
     * addresses. */
#define KC__DYNPTR(d) ((d) < base ? (d) + base : (d))
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        uintptr_t p = KC__DYNPTR((uintptr_t)d->d_un.d_ptr);
        if (d->d_tag == DT_SYMTAB)
            sym = (const ElfW(Sym) *)p;
        else if (d->d_tag == DT_STRTAB)
            str = (const char *)p;
        else if (d->d_tag == DT_HASH)
            hash = (const ElfW(Word) *)p;
        else if (d->d_tag == DT_GNU_HASH)
            gnu = (const uint32_t *)p;
    }
#undef KC__DYNPTR
    if (sym == NULL || str == NULL)
        return -ENOENT;
    size_t n = dynsym_count(hash, gnu);
    for (size_t i = 1; i < n; i++) {
        const ElfW(Sym) *s = &sym[i];
        if (s->st_shndx == SHN_UNDEF || s->st_name == 0 ||
            (ELF64_ST_BIND(s->st_info) != STB_GLOBAL && ELF64_ST_BIND(s->st_info) != STB_WEAK))
            continue;
        int t = ELF64_ST_TYPE(s->st_info);
        if (t != STT_FUNC && t != STT_GNU_IFUNC)
            continue;
        int rc = each(str + s->st_name, arg);
        if (rc != 0)
            return rc;
    }
    return 0;
}
