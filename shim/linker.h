/*
 * The link cache's engine, shared by the nvJitLink hooks (link.c) and the
 * driver linker's (culink.c). Not installed, not exported.
 *
 * Every handle the host creates gets a session: the key so far, and the
 * inputs added. The key is a chain: the link's identity and options, then
 * one step per input in order (type, name, content digest; for an input
 * added by file, its path and the content read when the host added it,
 * listed in a manifest of the path's step). A file is read at the add, as
 * the library reads it, and the real handle is given those bytes under
 * the path (never the path later), so the link is of what the file held
 * then, whatever happens to it before the library would have read a
 * deferred one. A step the store knows
 * (some earlier link added the same inputs in the same order and the add
 * succeeded) is deferred: the host gets the success the library gave, and
 * the real handle is not given the input yet, since adding PTX is where the
 * library compiles it. At the completion the whole chain names the replay
 * record: a hit answers from it, and the real handle never links. The first
 * step the store does not know, any call the record cannot answer, and a
 * miss at the completion materialize the session: the deferred inputs are
 * given to the real handle in order, and from then on the real library
 * answers (a miss is still stored at the completion).
 *
 * Single flight: a session that misses a step takes that step's lock and
 * holds it until it completes (or is destroyed), so concurrent processes
 * linking the same inputs wait for the first and are then served its
 * result. A process holding any step lock never waits for another lock (no
 * cycle of waits), and every wait is bounded by KCACHE_LOCK_TIMEOUT.
 */
#ifndef KCACHE_SHIM_LINKER_H
#define KCACHE_SHIM_LINKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deps.h"
#include "linkrec.h"
#include "shim.h"
#include "why.h"

/* One input the host added. */
struct kc__link_input {
    int by_file;      /* added by file name */
    int type;         /* the API's input type */
    char *name;       /* data: the input's name (may be NULL); file: the path */
    const void *data; /* data: the bytes (the host's, or the session's copy);
                         file: the bytes read at the add (the session's), or
                         NULL for the path as the host gave it */
    size_t size;
    unsigned n_opt; /* cuLink: the input's JIT options (integer values only) */
    int *opt;
    void **val;
    void *real; /* the real function the host called, when the API has variants */
};

struct kc__link_sess;

/* What the engine needs of an API. */
struct kc__link_ops {
    const char *what; /* for messages: "nvJitLink", "cuLink" */
    int success;      /* the API's success code */
    /* Gives one input to the real handle; the library's code. Called with
     * the guard held and the session locked. */
    int (*add)(struct kc__link_sess *s, const struct kc__link_input *in);
    /* Completes the real handle of a served session the host goes on using
     * (adds or completes again): the result is discarded, the host's own
     * call follows. */
    void (*complete_quietly)(struct kc__link_sess *s);
    /* Optional: around that catch-up (the deferred inputs given, then the
     * quiet completion), keeps what the host can see of the handle (the
     * driver writes its logs and their sizes into the host's option
     * values): begin returns what end puts back (and frees). */
    void *(*quiet_begin)(struct kc__link_sess *s);
    void (*quiet_end)(struct kc__link_sess *s, void *saved);
};

enum kc__link_state {
    KC_LINK_DEFER,  /* every input so far is known to the store; the real
                       handle holds none of those deferred */
    KC_LINK_LIVE,   /* the real handle holds every input; cacheable */
    KC_LINK_PASS,   /* not cacheable: every call goes to the library */
    KC_LINK_SERVED, /* completed from the store: answers from `served` */
};

struct kc__link_step {
    int by_file;
    int known;         /* the store knew it: nothing to write for it */
    kc_digest base;    /* by file: the step without the file's content */
    kc_digest p;       /* the chain after this step */
    kc_digest content; /* by file: the content digest the chain used */
    size_t dep;        /* by file: its entry in `files` */
};

struct kc__link_sess {
    void *h; /* the real handle */
    const struct kc__link_ops *ops;
    pthread_mutex_t mu; /* held by every call on the session */
    int refs;
    bool gone; /* removed from the table */
    enum kc__link_state state;
    enum kc_pass_reason why; /* why it went KC_LINK_PASS (the stats line's reasons) */
    char ns[128];
    kc_digest prefix;           /* the chain so far */
    struct kc__link_input *def; /* deferred inputs, data copied */
    size_t n_def, cap_def;
    bool def_given; /* the deferred inputs were given to the real handle */
    struct kc__link_step *steps;
    size_t n_steps, cap_steps;
    struct kc__deps files; /* one entry per input added by file */
    int lock_fd;           /* a step's single-flight lock held, or -1 */
    int final_fd;          /* the completion's, or -1 */
    uint64_t work_ns;      /* time the real library spent on this link */
    struct kc__lrec *served;
    struct kc_why wrec; /* what went into the key (`kcache why`), or empty */
    uint64_t why_refused;
    void *priv; /* the API's, freed with the session */
    struct kc__link_sess *next;
};

/* Whether links are cached (KCACHE_LINK, KCACHE_DISABLE). */
bool kc__link_enabled(void);

/* Creates the session of handle h in namespace ns with the chain's start
 * p0 (identity and options), and registers it (a stale session of the same
 * handle, destroyed unseen, is dropped). `cacheable` false: a session that
 * only counts pass-throughs, for the reason `why`. priv (may be NULL) is freed with it. Returns
 * 0 or -ENOMEM (priv is freed then too). */
int kc__link_new(void *h, const struct kc__link_ops *ops, const char *ns, const kc_digest *p0,
                 bool cacheable, enum kc_pass_reason why, void *priv);

/* The session of h made by `ops`' API, referenced and locked; NULL when h
 * has none (a handle of the other API is none: the library answers).
 * Release with kc__link_put. */
struct kc__link_sess *kc__link_get(void *h, const struct kc__link_ops *ops);
void kc__link_put(struct kc__link_sess *s);

/* Removes h's session from the table (the host destroys h) and returns it
 * referenced and locked, or NULL. After the real destroy: kc__link_put
 * frees it, or kc__link_restore puts it back when the destroy failed. */
struct kc__link_sess *kc__link_take(void *h, const struct kc__link_ops *ops);
void kc__link_restore(struct kc__link_sess *s);

/* An add on a session (locked, guard held). `usual` false: arguments the
 * engine does not defer (the library decides what they mean): the session
 * is materialized and passes through. Returns the code for the host: the
 * recorded success of a deferred step, else the library's own. */
int kc__link_add(struct kc__link_sess *s, const struct kc__link_input *in, bool usual);

/* Gives the real handle everything the host did (the deferred inputs; for a
 * served session also the completion), so the library can answer a call
 * the session cannot. The session is LIVE or PASS afterwards. */
void kc__link_materialize(struct kc__link_sess *s, bool for_good);

/* kc__link_materialize(s, true), noting why: the library answers every
 * call from here on. The first reason a session is given is kept. */
void kc__link_pass(struct kc__link_sess *s, enum kc_pass_reason why);

/* The completion, first half (session locked, guard held). Returns true on
 * a hit: the session is SERVED, its record in s->served, counted. False:
 * the caller completes for real and calls kc__link_complete_end; the
 * session is then LIVE (a miss to capture) or PASS. */
bool kc__link_complete_begin(struct kc__link_sess *s, uint64_t t_enter);

/* The completion, second half: with `rec` (the capture of a LIVE
 * session's result, owned by the call; NULL when it could not be taken or
 * the code is not one to cache) stores the record and the steps, counts,
 * and releases the locks. took_ns: the real completion's time. */
void kc__link_complete_end(struct kc__link_sess *s, int rc, struct kc__lrec *rec, bool cacheable,
                           uint64_t took_ns);

/* Chain helpers for the APIs' keys. */
struct kc__hasher *kc__link_hasher(const char *api);

/* The hook tables of nvJitLink (link.c) and of the driver's cuLink*
 * (culink.c), registered with KC__FAMILY. */
extern const struct kc__hook kc__link_hooks[];
extern const struct kc__hook kc__culink_hooks[];

/* The hook of a name no table lists but the nvJitLink family's pattern
 * takes (__nvJitLink<Fn>_<major>_<minor> of a release later than its
 * table), given one of a few spare slots on first sight; NULL for any other
 * name. */
const struct kc__hook *kc__link_hook_pattern(const char *name);

#endif
