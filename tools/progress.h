/*
 * progress.h: the progress bar of the tool's long commands (export,
 * import, verify, gc, push, remote prune), drawn on stderr when it is a
 * terminal and --quiet is not given:
 *
 *   verify: 1234/5000 [######------------------]  24%  812 entries/s  0:05 left
 *
 * done/total, a bar, the rate (entries/s, or bytes/s for a count of
 * bytes) and the time left, redrawn in place (\r) at most 10 times a
 * second; a stage whose total is unknown (an import from a pipe) shows
 * the count and the rate.
 * Each line ends with a newline once its work is done. A count at its
 * total before the stage ends says "--:-- left" (counted, still being
 * written); the stage's last line says "0:00 left". Callers count what is
 * done, not what is handed on: an export's records once their bytes were
 * written, an import's bytes as they are read. A line fits the
 * terminal: on a narrow one the bar, then the rate, the time left and the
 * count are left out, and a word is never cut. Nothing is written when
 * the bar is off, or when no progress was ever reported.
 */
#ifndef KCACHE_TOOLS_PROGRESS_H
#define KCACHE_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kc_tool_progress {
    const char *what;   /* the command, as the line starts: "verify", "remote prune" */
    const char *stage;  /* NULL, or the stage after it: "check", "write" */
    bool on;            /* drawing at all */
    bool bytes;         /* the counts are bytes, not entries */
    uint64_t t0;        /* when the stage began (monotonic ns) */
    uint64_t t1, done1; /* its first count, and when it came: the rate's start */
    uint64_t drawn_at;  /* when the line was last drawn */
    uint64_t done, total;
    bool recorded;   /* a count was reported in this stage */
    bool dirty;      /* ... and not drawn yet */
    bool shown;      /* a line of this stage is on the terminal, unfinished */
    bool full_drawn; /* the stage's 100% line was drawn */
    size_t len;      /* the length of the line drawn last */
    int cols;        /* the terminal's width */
};

/* Whether a command draws its bar: stderr is a terminal and it was not
 * given --quiet. */
bool kc_tool_progress_wanted(bool quiet);

/* Starts a bar for `what` (a string that outlives it), counting bytes or
 * entries; `on` false: the calls below write nothing. */
void kc_tool_progress_begin(struct kc_tool_progress *p, const char *what, bool bytes, bool on);

/* kc_progress_fn (store.h): done of total (0: unknown); arg is the bar. */
void kc_tool_progress(uint64_t done, uint64_t total, void *arg);

/* kc_progress_stage_fn (store.h): ends the stage before (its last count
 * drawn, a newline) and starts `stage` (a string that outlives it). */
void kc_tool_progress_stage(const char *stage, void *arg);

/* Ends the bar: the last count drawn, and the newline. Before the
 * command's own output and errors. */
void kc_tool_progress_end(struct kc_tool_progress *p);

#endif
