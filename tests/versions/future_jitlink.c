/*
 * future_jitlink: a stand-in for an nvJitLink release later than kcache's
 * table (tests/versions/test_versions.py). Built as libnvJitLink_future.so
 * against nvJitLink 13.5, it exports the versioned names of a release
 * KC_FUTURE ("13_9"), each forwarding to 13.5's, as a later library would
 * export its own; with -DKC_FUTURE_EXTRA it also exports an entry point no
 * kcache knows (a getter of a newer output), which must make its links
 * pass through.
 */
#include <nvJitLink.h>

#define CAT3(a, b, c) a##b##c
#define XCAT3(a, b, c) CAT3(a, b, c)
#define FUT(fn) XCAT3(__nvJitLink, fn, KC_FUTURE)
#define REAL(fn) __nvJitLink##fn##_13_5

#define EXPORT __attribute__((visibility("default")))

EXPORT nvJitLinkResult FUT(Create)(nvJitLinkHandle *h, uint32_t n, const char **o)
{
    return REAL(Create)(h, n, o);
}
EXPORT nvJitLinkResult FUT(Destroy)(nvJitLinkHandle *h)
{
    return REAL(Destroy)(h);
}
EXPORT nvJitLinkResult FUT(AddData)(nvJitLinkHandle h, nvJitLinkInputType t, const void *d,
                                    size_t s, const char *n)
{
    return REAL(AddData)(h, t, d, s, n);
}
EXPORT nvJitLinkResult FUT(AddFile)(nvJitLinkHandle h, nvJitLinkInputType t, const char *p)
{
    return REAL(AddFile)(h, t, p);
}
EXPORT nvJitLinkResult FUT(Complete)(nvJitLinkHandle h)
{
    return REAL(Complete)(h);
}
#define GETTERS(G, T)                                                                              \
    EXPORT nvJitLinkResult FUT(G##Size)(nvJitLinkHandle h, size_t * s)                             \
    {                                                                                              \
        return REAL(G##Size)(h, s);                                                                \
    }                                                                                              \
    EXPORT nvJitLinkResult FUT(G)(nvJitLinkHandle h, T p)                                          \
    {                                                                                              \
        return REAL(G)(h, p);                                                                      \
    }
GETTERS(GetLinkedCubin, void *)
GETTERS(GetLinkedPtx, char *)
GETTERS(GetLinkedLTOIR, void *)
GETTERS(GetErrorLog, char *)
GETTERS(GetInfoLog, char *)

#ifdef KC_FUTURE_EXTRA
EXPORT nvJitLinkResult nvJitLinkGetLinkedFutureIRSize(nvJitLinkHandle h, size_t *s)
{
    return REAL(GetLinkedLTOIRSize)(h, s);
}
#endif
