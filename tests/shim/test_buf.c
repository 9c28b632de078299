/*
 * Unit tests of common/buf.c (the one byte buffer, which writes every
 * integer little-endian, and its bounds-checked reader) and of the byte
 * layouts the shim's codec writes through it (shim/codec.c): the same
 * bytes on every host.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "buf.h"
#include "codec.h"

Test(buf, integers_are_written_little_endian)
{
    struct kc_buf b = {0};
    kc_buf_put_u8(&b, 0x01);
    kc_buf_put_u16(&b, 0x0302);
    kc_buf_put_u32(&b, 0x07060504u);
    kc_buf_put_u64(&b, 0x0f0e0d0c0b0a0908ull);
    kc_buf_add(&b, "\x10\x11", 2);
    cr_assert_eq(b.err, 0);
    cr_assert_eq(b.len, 17);
    for (size_t i = 0; i < b.len; i++)
        cr_assert_eq(b.p[i], i + 1, "byte %zu is %#x", i, b.p[i]);
    kc_buf_free(&b);
    cr_assert(b.p == NULL && b.len == 0 && b.cap == 0 && b.err == 0);
}

Test(buf, fixed_offset_helpers_are_little_endian)
{
    unsigned char x[8];
    kc_le_put_u64(x, 0x8877665544332211ull);
    cr_assert(memcmp(x, "\x11\x22\x33\x44\x55\x66\x77\x88", 8) == 0);
    cr_assert_eq(kc_le_get_u64(x), 0x8877665544332211ull);
    cr_assert_eq(kc_le_get_u32(x), 0x44332211u);
    cr_assert_eq(kc_le_get_u16(x), 0x2211);
    kc_le_put_u32(x, 0xa1b2c3d4u);
    cr_assert(memcmp(x, "\xd4\xc3\xb2\xa1", 4) == 0);
    kc_le_put_u16(x, 0xbeef);
    cr_assert(memcmp(x, "\xef\xbe", 2) == 0);
}

Test(buf, grows_past_its_first_allocation)
{
    struct kc_buf b = {0};
    for (uint32_t i = 0; i < 10000; i++)
        kc_buf_put_u32(&b, i);
    cr_assert_eq(b.err, 0);
    cr_assert_eq(b.len, 40000);
    struct kc_rd r;
    kc_rd_init(&r, b.p, b.len);
    for (uint32_t i = 0; i < 10000; i++)
        cr_assert_eq(kc_rd_get_u32(&r), i);
    cr_assert_eq(kc_rd_end(&r), 0);
    kc_buf_free(&b);
}

Test(buf, a_failed_growth_is_sticky_and_changes_nothing)
{
    struct kc_buf b = {0};
    kc_buf_put_u32(&b, 7);
    kc_buf_add(&b, "x", SIZE_MAX); /* no such memory */
    cr_assert_eq(b.err, -ENOMEM);
    cr_assert_eq(b.len, 4);
    kc_buf_put_u32(&b, 8); /* ignored once failed */
    cr_assert_eq(b.len, 4);
    cr_assert_eq(kc_le_get_u32(b.p), 7);
    kc_buf_free(&b);
}

Test(rd, reads_what_the_buffer_wrote)
{
    struct kc_buf b = {0};
    kc_buf_put_u8(&b, 0xab);
    kc_buf_put_u16(&b, 0xcdef);
    kc_buf_put_u32(&b, 0x01234567u);
    kc_buf_put_u64(&b, 0x89abcdef01234567ull);
    kc_buf_add(&b, "tail", 4);
    struct kc_rd r;
    kc_rd_init(&r, b.p, b.len);
    cr_assert_eq(kc_rd_get_u8(&r), 0xab);
    cr_assert_eq(kc_rd_get_u16(&r), 0xcdef);
    cr_assert_eq(kc_rd_get_u32(&r), 0x01234567u);
    cr_assert_eq(kc_rd_get_u64(&r), 0x89abcdef01234567ull);
    cr_assert_eq(kc_rd_left(&r), 4);
    char tail[4];
    cr_assert_eq(kc_rd_get_bytes(&r, tail, 4), 0);
    cr_assert(memcmp(tail, "tail", 4) == 0);
    cr_assert_eq(kc_rd_end(&r), 0);
    kc_buf_free(&b);
}

Test(rd, short_input_fails_cleanly_and_stays_failed)
{
    const unsigned char in[3] = {1, 2, 3};
    struct kc_rd r;
    kc_rd_init(&r, in, sizeof in);
    cr_assert_eq(kc_rd_get_u16(&r), 0x0201);
    cr_assert_eq(kc_rd_get_u16(&r), 0, "one byte left: nothing read");
    cr_assert(r.bad);
    cr_assert_eq(kc_rd_get_u8(&r), 0, "bad stays bad, though a byte is left");
    cr_assert_eq(kc_rd_left(&r), 0);
    cr_assert_null(kc_rd_take(&r, 0));
    cr_assert_eq(kc_rd_end(&r), -EBADMSG);

    unsigned char out[4] = {9, 9, 9, 9};
    kc_rd_init(&r, in, sizeof in);
    cr_assert_eq(kc_rd_get_bytes(&r, out, 4), -EBADMSG);
    cr_assert(memcmp(out, "\0\0\0\0", 4) == 0, "out is zeroed on failure");
    kc_rd_init(&r, in, sizeof in);
    cr_assert_eq(kc_rd_get_u64(&r), 0);
    cr_assert_eq(kc_rd_end(&r), -EBADMSG);
}

Test(rd, unread_bytes_fail_the_end)
{
    const unsigned char in[3] = {1, 2, 3};
    struct kc_rd r;
    kc_rd_init(&r, in, sizeof in);
    kc_rd_get_u16(&r);
    cr_assert_eq(kc_rd_end(&r), -EBADMSG);
    cr_assert_eq(kc_rd_left(&r), 1);
}

Test(rd, null_input)
{
    struct kc_rd r;
    kc_rd_init(&r, NULL, 0);
    cr_assert_eq(kc_rd_end(&r), 0);
    cr_assert_eq(kc_rd_get_u8(&r), 0);
    cr_assert_eq(kc_rd_end(&r), -EBADMSG);
    kc_rd_init(&r, NULL, 5);
    cr_assert_eq(kc_rd_left(&r), 0);
    cr_assert_eq(kc_rd_end(&r), -EBADMSG);
}

/* ---- the codec's layouts ------------------------------------------------ */

Test(codec_layout, replay_record_is_little_endian)
{
    struct kc__replay r = {0};
    r.compile_rc = -2;
    r.out[OUT_PTX].size_rc = 0x01020304;
    r.out[OUT_PTX].size_set = 1;
    r.out[OUT_PTX].size = 3;
    r.out[OUT_PTX].bytes = (char *)"abc";
    r.out[OUT_PTX].nbytes = 3;
    r.pch_required = 0x1122334455667788ull;
    struct kc_buf b = {0};
    cr_assert_eq(kc__replay_encode(&r, &b), 0);
    /* "KCNV" 4, then compile_rc as a little-endian i32. */
    cr_assert(memcmp(b.p, "\x56\x4e\x43\x4b\x34\0\0\0", 8) == 0, "magic");
    cr_assert(memcmp(b.p + 8, "\xfe\xff\xff\xff", 4) == 0, "compile_rc");
    cr_assert(memcmp(b.p + 12, "\x04\x03\x02\x01", 4) == 0, "size_rc");
    cr_assert(memcmp(b.p + 16, "\x01\0\0\0", 4) == 0, "size_set");
    cr_assert(memcmp(b.p + 20, "\x03\0\0\0\0\0\0\0", 8) == 0, "size");
    /* get_rc, size_null_rc, get_null_rc, then the blob: length, bytes. */
    cr_assert(memcmp(b.p + 40, "\x03\0\0\0\0\0\0\0abc", 11) == 0, "PTX blob");
    cr_assert(memcmp(b.p + b.len - 8, "\x88\x77\x66\x55\x44\x33\x22\x11", 8) == 0, "pch_required");
    struct kc__replay *back = kc__replay_decode(b.p, b.len);
    cr_assert_not_null(back);
    cr_assert_eq(back->compile_rc, -2);
    cr_assert_eq(back->out[OUT_PTX].size_rc, 0x01020304);
    cr_assert_eq(back->pch_required, 0x1122334455667788ull);
    kc__replay_free(back);
    kc_buf_free(&b);
}

Test(codec_layout, manifest_is_little_endian)
{
    struct kc__dep dep = {.path = (char *)"a.h",
                          .kind = KC_DEP_FILE,
                          .digest = {0x0102030405060708ull, 0x1112131415161718ull},
                          .fp = {0x21}};
    kc_digest result = {0x3132333435363738ull, 0x4142434445464748ull};
    struct kc_buf b = {0};
    kc__manifest_encode(&b, &result, &dep, 1, NULL);
    cr_assert_eq(b.err, 0);
    const unsigned char want[] = "\x46\x4d\x43\x4b\x33\0\0\0"       /* "KCMF" 3 */
                                 "\x01\0\0\0\0\0\0\0"               /* one set */
                                 "\x38\x37\x36\x35\x34\x33\x32\x31" /* result.lo */
                                 "\x48\x47\x46\x45\x44\x43\x42\x41" /* result.hi */
                                 "\x01\0\0\0\0\0\0\0"               /* one dependency */
                                 "\x01\0\0\0"                       /* KC_DEP_FILE */
                                 "\x03\0\0\0\0\0\0\0a.h"            /* path */
                                 "\x08\x07\x06\x05\x04\x03\x02\x01" /* digest.lo */
                                 "\x18\x17\x16\x15\x14\x13\x12\x11" /* digest.hi */
                                 "\x21\0\0\0\0\0\0\0";              /* fp[0], then four zeros */
    size_t n = sizeof want - 1;
    cr_assert_eq(b.len, n + 32, "length %zu", b.len);
    cr_assert(memcmp(b.p, want, n) == 0);
    for (size_t i = n; i < b.len; i++)
        cr_assert_eq(b.p[i], 0);
    struct kc__manifest *m = kc__manifest_decode(b.p, b.len);
    cr_assert_not_null(m);
    cr_assert(m->n == 1 && m->sets[0].n == 1);
    cr_assert_eq(m->sets[0].result.hi, result.hi);
    cr_assert_eq(m->sets[0].deps[0].digest.lo, dep.digest.lo);
    kc__manifest_free(m);
    kc_buf_free(&b);
}

/* A record of the previous layout ("KCNV" 2, host byte order) is no
 * record now. */
Test(codec_layout, previous_magics_are_refused)
{
    struct kc__replay r = {0};
    struct kc_buf b = {0};
    cr_assert_eq(kc__replay_encode(&r, &b), 0);
    b.p[4] = 0x32;
    cr_assert_null(kc__replay_decode(b.p, b.len));
    kc_buf_free(&b);
    kc_digest result = {1, 2};
    kc__manifest_encode(&b, &result, NULL, 0, NULL);
    cr_assert_not_null(kc__manifest_decode(b.p, b.len));
    b.p[4] = 0x32;
    cr_assert_null(kc__manifest_decode(b.p, b.len));
    kc_buf_free(&b);
}

/* A record of layout 3 ("KCNV" 3: five outputs, no NVVM or Tile IR) is
 * still read, and says which outputs it lacks. */
Test(codec_layout, layout_3_is_read_with_its_missing_outputs)
{
    struct kc__replay r = {0};
    r.compile_rc = 6;
    r.lowered_unknown_rc = 7;
    struct kc_buf b = {0};
    cr_assert_eq(kc__replay_encode(&r, &b), 0);
    /* Every output empty: 36 bytes each after magic and compile_rc. */
    size_t at = 12 + (size_t)N_OUT_V3 * 36, cut = (size_t)(N_OUT - N_OUT_V3) * 36;
    memmove(b.p + at, b.p + at + cut, b.len - at - cut);
    b.len -= cut;
    b.p[4] = 0x33;
    struct kc__replay *back = kc__replay_decode(b.p, b.len);
    cr_assert_not_null(back);
    cr_assert_eq(back->compile_rc, 6);
    cr_assert_eq(back->lowered_unknown_rc, 7);
    cr_assert_eq(back->missing, (1u << OUT_NVVM) | (1u << OUT_TILEIR));
    kc__replay_free(back);
    /* The same bytes as layout 4 are no record. */
    b.p[4] = 0x34;
    cr_assert_null(kc__replay_decode(b.p, b.len));
    kc_buf_free(&b);
}
