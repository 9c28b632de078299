/*
 * Unit tests of the identity of ELF files and loaded objects (shim/hash.c):
 * kc__file_identity reads only the header, program headers and notes, and
 * must give what a parse of the whole file mapped gives (ref_identity, the
 * implementation it replaced: stores keyed by it keep hitting);
 * kc__loaded_identity reads the mapped notes and must give the file's
 * identity.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

/* The former implementation: the whole file mapped, then parsed. */
static int ref_build_id(const unsigned char *m, size_t size, kc_digest *out)
{
    if (size < sizeof(Elf64_Ehdr) || memcmp(m, ELFMAG, SELFMAG) != 0 || m[EI_CLASS] != ELFCLASS64)
        return -1;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)m;
    if (eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phoff > size ||
        (size - eh->e_phoff) / sizeof(Elf64_Phdr) < eh->e_phnum)
        return -1;
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(m + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_NOTE || ph[i].p_offset > size ||
            ph[i].p_filesz > size - ph[i].p_offset)
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
                *out = kc_digest_of(m + body + name, n->n_descsz);
                return 0;
            }
            off = body + name + desc;
        }
    }
    return -1;
}

static int ref_identity(const char *path, kc_digest *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        close(fd);
        return -1;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -1;
    if (ref_build_id(m, (size_t)st.st_size, out) != 0)
        *out = kc_digest_of(m, (size_t)st.st_size);
    munmap(m, (size_t)st.st_size);
    return 0;
}

static void same_as_ref(const char *path)
{
    kc_digest a = {0}, b = {0};
    int ra = ref_identity(path, &a);
    int rb = kc__file_identity(path, &b);
    cr_assert_eq(rb == 0, ra == 0, "%s: ref %d, new %d", path, ra, rb);
    if (ra == 0)
        cr_expect(a.lo == b.lo && a.hi == b.hi, "%s: identity differs from the former one", path);
}

static char tmpdir[256];

static void setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/kc-test-hash-XXXXXX", t && t[0] ? t : "/tmp");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void teardown(void)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(hash, .init = setup, .fini = teardown);

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* Every loaded object with a name: its file's identity as before. */
static int each_loaded(struct dl_phdr_info *info, size_t size, void *arg)
{
    if (info->dlpi_name != NULL && info->dlpi_name[0] == '/') {
        same_as_ref(info->dlpi_name);
        ++*(int *)arg;
    }
    return 0;
}

Test(hash, real_files_as_before)
{
    int n = 0;
    dl_iterate_phdr(each_loaded, &n);
    cr_assert_gt(n, 0);
    same_as_ref("/proc/self/exe");
    const char *more[] = {"/usr/local/cuda/lib64/libnvrtc.so",
                          "/usr/local/cuda/lib64/libnvrtc-builtins.so", "/bin/sh", "/etc/passwd"};
    for (size_t i = 0; i < sizeof more / sizeof *more; i++)
        if (access(more[i], R_OK) == 0)
            same_as_ref(more[i]);
}

/* A minimal ELF64 file: header, `phnum` program headers at `phoff`, a note
 * at `noteoff` of `notesz` bytes (a GNU build-id unless `other`), total
 * `size` bytes. */
static void make_elf(const char *path, size_t size, uint64_t phoff, int phnum, uint64_t noteoff,
                     uint64_t notesz, int other)
{
    unsigned char *m = calloc(1, size);
    cr_assert_not_null(m);
    Elf64_Ehdr *eh = (Elf64_Ehdr *)m;
    memcpy(eh->e_ident, ELFMAG, SELFMAG);
    eh->e_ident[EI_CLASS] = ELFCLASS64;
    eh->e_phentsize = sizeof(Elf64_Phdr);
    eh->e_phoff = phoff;
    eh->e_phnum = (Elf64_Half)phnum;
    for (int i = 0; i < phnum; i++) {
        if (phoff + (i + 1) * sizeof(Elf64_Phdr) > size)
            break;
        Elf64_Phdr *ph = (Elf64_Phdr *)(m + phoff) + i;
        ph->p_type = i == phnum - 1 ? PT_NOTE : PT_LOAD;
        ph->p_offset = noteoff;
        ph->p_filesz = notesz;
    }
    if (noteoff + sizeof(Elf64_Nhdr) + 4 + 20 <= size) {
        Elf64_Nhdr *n = (Elf64_Nhdr *)(m + noteoff);
        n->n_namesz = 4;
        n->n_descsz = 20;
        n->n_type = other ? 1 : NT_GNU_BUILD_ID;
        memcpy(m + noteoff + sizeof *n, "GNU", 4);
        for (int i = 0; i < 20; i++)
            m[noteoff + sizeof *n + 4 + i] = (unsigned char)(i * 7 + 1);
    }
    write_file(path, m, size);
    free(m);
}

Test(hash, crafted_files_as_before)
{
    char p[PATH_MAX];
    struct {
        size_t size;
        uint64_t phoff;
        int phnum;
        uint64_t noteoff, notesz;
        int other;
    } c[] = {
        {1024, 64, 2, 512, 44, 0},       /* all in the first read */
        {1024, 64, 2, 512, 44, 1},       /* no build-id: the contents */
        {20000, 64, 2, 9000, 44, 0},     /* note past the first read */
        {20000, 12000, 3, 600, 44, 0},   /* program headers past it */
        {20000, 12000, 3, 15000, 44, 0}, /* both */
        {1024, 64, 2, 512, 4000, 0},     /* note reaching past the end */
        {1024, 64, 2, 5000, 44, 0},      /* note starting past the end */
        {1024, 1000, 2, 512, 44, 0},     /* headers reaching past the end */
        {1024, 5000, 2, 512, 44, 0},     /* headers starting past the end */
        {1024, 64, 0, 512, 44, 0},       /* no program headers */
        {8192, 4000, 2, 4090, 44, 0},    /* both straddling the first read */
        {1024, 64, 2, 512, 10, 0},       /* truncated note */
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        snprintf(p, sizeof p, "%s/elf%zu", tmpdir, i);
        make_elf(p, c[i].size, c[i].phoff, c[i].phnum, c[i].noteoff, c[i].notesz, c[i].other);
        same_as_ref(p);
    }
    /* Not ELF, short, 32-bit, empty, missing. */
    snprintf(p, sizeof p, "%s/text", tmpdir);
    write_file(p, "hello, world\n", 13);
    same_as_ref(p);
    unsigned char e32[200] = {0};
    memcpy(e32, ELFMAG, SELFMAG);
    e32[EI_CLASS] = ELFCLASS32;
    snprintf(p, sizeof p, "%s/elf32", tmpdir);
    write_file(p, e32, sizeof e32);
    same_as_ref(p);
    snprintf(p, sizeof p, "%s/short", tmpdir);
    write_file(p, e32, 40);
    same_as_ref(p);
    snprintf(p, sizeof p, "%s/empty", tmpdir);
    write_file(p, "", 0);
    kc_digest d;
    cr_expect_neq(kc__file_identity(p, &d), 0);
    snprintf(p, sizeof p, "%s/missing", tmpdir);
    cr_expect_neq(kc__file_identity(p, &d), 0);
}

/* The object holding addr (the program itself when file is given). */
static void loaded_as_file(const void *addr, const char *file)
{
    Dl_info info;
    cr_assert_neq(dladdr(addr, &info), 0);
    kc_digest a = {0}, b = {0};
    cr_assert_eq(kc__loaded_identity(addr, &a), 0, "%s", info.dli_fname);
    cr_assert_eq(kc__file_identity(file ? file : info.dli_fname, &b), 0, "%s", info.dli_fname);
    cr_expect(a.lo == b.lo && a.hi == b.hi, "%s: mapped and file identities differ",
              info.dli_fname);
}

Test(hash, loaded_as_file)
{
    loaded_as_file((const void *)malloc, NULL);
    loaded_as_file((const void *)dlsym, NULL);
    loaded_as_file((const void *)same_as_ref, "/proc/self/exe");
    kc_digest d;
    cr_expect_neq(kc__loaded_identity(NULL, &d), 0);
}
