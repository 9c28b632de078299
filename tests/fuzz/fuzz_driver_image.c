/*
 * Fuzz target: the driver path's image handling in shim/driver.c, which is
 * #included here so its static functions can be called: the PTX test
 * (looks_like_ptx), fatbinary unwrapping and the fatbinary walk that decides
 * whether a load needs the JIT (fatbin_unwrap, fatbin_kind), the stored JIT
 * record parser (record_parse), the JIT option sorter (jit_req_parse) and
 * the log-buffer filler (log_fill). Everything else driver.c calls is
 * stubbed in driver_stubs.c.
 *
 * The driver API passes images without a length, so the model is: the host
 * owns exactly the bytes the fuzzer gave (an exact-size heap copy), a PTX
 * image is NUL-terminated, and a fatbinary's header does not claim more
 * bytes than it has (a header that does makes the driver read past the
 * image too; the hostile-input test checks the shim answers it as the
 * driver does). Under those rules no read may leave the copy.
 *
 * Input: byte 0 picks the device (compute capability), byte 1 the number of
 * JIT options, the rest is the image. An image that starts with the wrapper
 * magic gets its data pointer (at offset 8) aimed at its own offset 16.
 */
#include "driver.c"

#include "fuzz.h"

static void fuzz_options(const uint8_t *d, size_t n, unsigned count)
{
    CUjit_option opt[80];
    void *val[80];
    char ibuf[32], ebuf[32];
    if (count > 80)
        count = 80;
    for (unsigned i = 0; i < count; i++) {
        uint8_t o = n ? d[(2 * i) % n] : 0;
        uint8_t v = n ? d[(2 * i + 1) % n] : 0;
        opt[i] = (CUjit_option)(o % 40);
        val[i] = (void *)(uintptr_t)v;
        if (opt[i] == CU_JIT_INFO_LOG_BUFFER)
            val[i] = ibuf;
        if (opt[i] == CU_JIT_ERROR_LOG_BUFFER)
            val[i] = ebuf;
        if (opt[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ||
            opt[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
            val[i] = (void *)(uintptr_t)(v % (sizeof ibuf + 1));
    }
    struct jit_req r;
    struct kc__hasher *h = kc__hasher_new();
    if (jit_req_parse(count, opt, val, &r, h)) {
        KC_FUZZ_ASSERT(r.n <= 64);
        /* The linker gets four more options: they must fit. */
        KC_FUZZ_ASSERT(r.n + 4 <= sizeof r.opt / sizeof r.opt[0]);
        /* A log filled into the host's buffers stays inside them. */
        static const char log[] = "info: 123 bytes of registers used by a kernel named k";
        req_finish(&r, val, log, sizeof log - 1, 0);
    }
    kc__hasher_free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    static const int ccs[][2] = {{9, 0}, {8, 0}, {8, 6}, {7, 5}, {10, 0}, {12, 0}, {5, 2}, {0, 0}};
    int major = ccs[data[0] % 8][0], minor = ccs[data[0] % 8][1];
    unsigned nopt = data[1];
    const uint8_t *img = data + 2;
    size_t n = size - 2;

    /* PTX: a NUL-terminated copy. */
    char *s = malloc(n + 1);
    if (!s)
        abort();
    memcpy(s, img, n);
    s[n] = 0;
    (void)looks_like_ptx(s);
    free(s);

    /* Fatbinary. */
    unsigned char *p = kc_fuzz_dup(img, n);
    if (n >= 16) {
        uint32_t magic;
        memcpy(&magic, p, 4);
        if (magic == FATBIN_WRAPPER_MAGIC) {
            const void *inner = p + 16;
            memcpy(p + 8, &inner, sizeof inner);
        }
        const unsigned char *fb = fatbin_unwrap(p);
        size_t avail = n - (size_t)(fb - p);
        struct fatbin_header fh;
        if (avail >= sizeof fh) {
            memcpy(&fh, fb, sizeof fh);
            if (fh.magic == FATBIN_MAGIC && (uint64_t)fh.header_size + fh.fat_size <= avail) {
                size_t len = 0;
                enum image_kind k = fatbin_kind(fb, &len, major, minor);
                if (k == IMG_FATBIN_JIT)
                    KC_FUZZ_ASSERT(len == fh.header_size + fh.fat_size && len <= avail);
            }
        }
    }

    /* The stored JIT record. */
    const char *info;
    size_t ilen, clen;
    const void *cubin;
    if (record_parse(p, n, &info, &ilen, &cubin, &clen) == 0) {
        KC_FUZZ_ASSERT(16 + ilen + clen == n);
        KC_FUZZ_ASSERT(clen >= 64 && !memcmp(cubin, "\177ELF", 4));
    }
    free(p);

    fuzz_options(img, n, nopt);
    return 0;
}

int kc_fuzz_seeds(const char *dir)
{
    int count = 0;
    char name[64];
    /* Images: a PTX text, the fatbinaries the driver tests build (when the
     * build tree has them, passed through KCACHE_FUZZ_FIXTURES). */
    static const char ptx[] = "\0\0//\n.version 8.8\n.target sm_80\n.address_size 64\n"
                              ".visible .entry k() { ret; }\n";
    if (kc_fuzz_write_seed(dir, "ptx", ptx, sizeof ptx) == 0)
        count++;
    const char *fx = getenv("KCACHE_FUZZ_FIXTURES");
    static const char *files[] = {"kptx.fatbin", "ksass.fatbin"};
    for (unsigned i = 0; fx && i < 2; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", fx, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        unsigned char *b = malloc(1 << 20);
        b[0] = (unsigned char)i; /* 9.0, then 8.0 */
        b[1] = 0;
        size_t got = fread(b + 2, 1, (1 << 20) - 2, f);
        fclose(f);
        snprintf(name, sizeof name, "%s", files[i]);
        if (kc_fuzz_write_seed(dir, name, b, got + 2) == 0)
            count++;
        free(b);
    }
    /* A fatbinary made here: header, one PTX entry for sm_80, one SASS
     * entry for sm_90 (payload bytes are not parsed), and the same behind
     * the wrapper. */
    unsigned char fb[2 + 16 + 2 * (sizeof(struct fatbin_entry) + 16)];
    memset(fb, 0, sizeof fb);
    fb[0] = 1; /* device 8.0 */
    fb[1] = 0;
    struct fatbin_header h = {FATBIN_MAGIC, 1, 16, 2 * (sizeof(struct fatbin_entry) + 16)};
    memcpy(fb + 2, &h, sizeof h);
    struct fatbin_entry e = {.kind = 1, .header_size = sizeof e, .padded_size = 16, .arch = 80};
    memcpy(fb + 2 + 16, &e, sizeof e);
    e.kind = 2;
    e.arch = 90;
    memcpy(fb + 2 + 16 + sizeof e + 16, &e, sizeof e);
    if (kc_fuzz_write_seed(dir, "fatbin", fb, sizeof fb) == 0)
        count++;
    unsigned char wr[sizeof fb + 16];
    memcpy(wr, fb, 2);
    uint32_t wm = FATBIN_WRAPPER_MAGIC, one = 1;
    memset(wr + 2, 0, 16);
    memcpy(wr + 2, &wm, 4);
    memcpy(wr + 6, &one, 4);
    memcpy(wr + 18, fb + 2, sizeof fb - 2);
    if (kc_fuzz_write_seed(dir, "fatbin-wrapped", wr, sizeof wr) == 0)
        count++;
    /* A stored JIT record (what record_make writes), with JIT options in
     * the first bytes the option sorter reads. */
    unsigned char cub[80] = "\177ELF";
    size_t rlen;
    void *rec = record_make("info log\n", 9, cub, sizeof cub, &rlen);
    unsigned char *rb = malloc(rlen + 2);
    rb[0] = 0;
    rb[1] = 6;
    memcpy(rb + 2, rec, rlen);
    if (kc_fuzz_write_seed(dir, "jit-record", rb, rlen + 2) == 0)
        count++;
    free(rb);
    free(rec);
    return count;
}
