/*
 * Hashing for keys: framed streaming XXH3-128, and the identity of an ELF
 * file (its GNU build-id, or a digest of its contents).
 */
#include "shim.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

struct kc__hasher {
    XXH3_state_t st;
};

struct kc__hasher *kc__hasher_new(void)
{
    struct kc__hasher *h = malloc(sizeof *h);
    if (h != NULL)
        XXH3_128bits_reset(&h->st);
    return h;
}

void kc__hasher_free(struct kc__hasher *h)
{
    free(h);
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

kc_digest kc__hash_digest(struct kc__hasher *h)
{
    XXH128_hash_t r = XXH3_128bits_digest(&h->st);
    return (kc_digest){.lo = r.low64, .hi = r.high64};
}

kc_digest kc__digest_of(const void *p, size_t n)
{
    XXH128_hash_t r = XXH3_128bits(p, n);
    return (kc_digest){.lo = r.low64, .hi = r.high64};
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

/* Looks for NT_GNU_BUILD_ID in the PT_NOTE segments of a mapped ELF64 file. */
static int elf_build_id(const unsigned char *m, size_t size, kc_digest *out)
{
    if (size < sizeof(Elf64_Ehdr) || memcmp(m, ELFMAG, SELFMAG) != 0 || m[EI_CLASS] != ELFCLASS64)
        return -ENOENT;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)m;
    if (eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phoff > size ||
        (size - eh->e_phoff) / sizeof(Elf64_Phdr) < eh->e_phnum)
        return -ENOENT;
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(m + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_NOTE || ph[i].p_offset > size || ph[i].p_filesz > size - ph[i].p_offset)
            continue;
        size_t off = ph[i].p_offset, end = off + ph[i].p_filesz;
        while (end - off >= sizeof(Elf64_Nhdr)) {
            const Elf64_Nhdr *n = (const Elf64_Nhdr *)(m + off);
            size_t name = (n->n_namesz + 3) & ~3u, desc = (n->n_descsz + 3) & ~3u;
            size_t body = off + sizeof *n;
            if (name > end - body || desc > end - body - name)
                break;
            if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 &&
                memcmp(m + body, "GNU", 4) == 0 && n->n_descsz > 0) {
                *out = kc__digest_of(m + body + name, n->n_descsz);
                return 0;
            }
            off = body + name + desc;
        }
    }
    return -ENOENT;
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
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -errno;
    if (elf_build_id(m, (size_t)st.st_size, out) != 0)
        *out = kc__digest_of(m, (size_t)st.st_size);
    munmap(m, (size_t)st.st_size);
    return 0;
}

uint64_t kc__self_build(void)
{
    static uint64_t build;
    uint64_t b = __atomic_load_n(&build, __ATOMIC_RELAXED);
    if (b != 0)
        return b;
    Dl_info info;
    kc_digest d = {0, 1};
    if (dladdr((void *)kc__self_build, &info) != 0 && info.dli_fname != NULL)
        kc__file_identity(info.dli_fname, &d);
    b = d.lo ? d.lo : 1;
    __atomic_store_n(&build, b, __ATOMIC_RELAXED);
    return b;
}
