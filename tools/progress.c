/*
 * progress.c: the tool's progress bar (progress.h).
 */
#include "progress.h"
#include "cli.h"

#include "../common/clock.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define REDRAW_NS 100000000ull /* at most 10 lines a second */
#define BAR_MAX 24
#define BAR_MIN 8
#define TAIL_ROOM 36 /* " 100%  12345 entries/s  12:34 left" */

bool kc_tool_progress_wanted(bool quiet)
{
    return !quiet && isatty(STDERR_FILENO);
}

static int term_cols(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 80;
}

void kc_tool_progress_begin(struct kc_tool_progress *p, const char *what, bool bytes, bool on)
{
    memset(p, 0, sizeof *p);
    p->what = what;
    p->bytes = bytes;
    p->on = on;
    if (on) {
        p->cols = term_cols();
        p->t0 = kc_mono_ns();
    }
}

/* A count, as the line shows it. */
static const char *count(const struct kc_tool_progress *p, uint64_t n, char *buf, size_t len)
{
    if (p->bytes)
        return kc_tool_human_size(n, buf, len);
    snprintf(buf, len, "%" PRIu64, n);
    return buf;
}

/* Seconds as M:SS, or H:MM:SS from an hour. */
static void duration(double s, char *buf, size_t len)
{
    uint64_t t = s > 359999.0 ? 359999 : (uint64_t)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, len, "%" PRIu64 ":%02" PRIu64 ":%02" PRIu64, t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, len, "%" PRIu64 ":%02" PRIu64, t / 60, t % 60);
}

/* Entries (or bytes) a second: since the stage's first count, once that is
 * 50 ms old (what came before it, opening and counting, is not the work's
 * pace); for a stage's last line, since the stage began when there is no
 * better; 0 when unknown. */
static double rate_of(const struct kc_tool_progress *p, uint64_t now, bool last)
{
    if (now - p->t1 >= 50000000ull && p->done > p->done1)
        return (double)(p->done - p->done1) * 1e9 / (double)(now - p->t1);
    if (last && now > p->t0 && p->done > 0)
        return (double)p->done * 1e9 / (double)(now - p->t0);
    return 0.0;
}

/* Cuts s to at most max bytes at a word's end (a space), never inside a
 * word: what is left of a line too wide for the terminal. */
static size_t cut_words(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    size_t n = max;
    while (n > 0 && s[n] != ' ')
        n--;
    while (n > 0 && s[n - 1] == ' ')
        n--;
    return n;
}

/* Draws the line; `last`: the stage ended (its work done and written). A
 * count that reached its total before the stage ended says "--:-- left":
 * the work is counted but not finished (an export's last bytes still
 * going to a slow reader). The line fits the terminal: the parts that
 * matter least (the bar, the rate, the time left, the count) are left out
 * in that order until it does, and what still does not fit is cut at a
 * word's end. */
static void draw(struct kc_tool_progress *p, uint64_t now, bool last)
{
    char line[512], d[32], t[32], rate[48], left[32] = "";
    double r = rate_of(p, now, last);
    /* What is counted: bytes, or entries (an export's first stage: bodies). */
    const char *unit = p->stage != NULL && strcmp(p->stage, "bodies") == 0 ? "bodies" : "entries";
    if (r <= 0.0)
        snprintf(rate, sizeof rate, "-- %s/s", p->bytes ? "B" : unit);
    else if (p->bytes)
        snprintf(rate, sizeof rate, "%s/s", kc_tool_human_size((uint64_t)r, t, sizeof t));
    else
        snprintf(rate, sizeof rate, r >= 100.0 ? "%.0f %s/s" : "%.1f %s/s", r, unit);
    char head[160];
    snprintf(head, sizeof head, "%s%s%s: ", p->what, p->stage ? " " : "", p->stage ? p->stage : "");
    int n;
    size_t max = p->cols > 1 ? (size_t)p->cols - 1 : sizeof line - 1;
    if (p->total == 0) {
        /* A stage that cannot know its total: the count and the rate. */
        n = snprintf(line, sizeof line, "%s%s%s%s  %s", head, count(p, p->done, d, sizeof d),
                     p->bytes ? "" : " ", p->bytes ? "" : unit, rate);
        if (n > 0 && (size_t)n > max)
            n = snprintf(line, sizeof line, "%s%s%s%s", head, count(p, p->done, d, sizeof d),
                         p->bytes ? "" : " ", p->bytes ? "" : unit);
    } else {
        uint64_t done = p->done < p->total ? p->done : p->total;
        int pct = (int)(done * 100 / p->total);
        if (done == p->total && last)
            duration(0, left, sizeof left);
        else if (done < p->total && r > 0.0)
            /* Work still going never says 0:00: at least a second. */
            duration((double)(p->total - done) / r < 1.0 ? 1.0 : (double)(p->total - done) / r,
                     left, sizeof left);
        else
            snprintf(left, sizeof left, "--:--");
        /* done as wide as total, and room for the widest tail: the bar
         * keeps its width from one line to the next. */
        char dt[80];
        count(p, p->total, t, sizeof t);
        int dl =
            snprintf(dt, sizeof dt, "%*s/%s", (int)strlen(t), count(p, p->done, d, sizeof d), t);
        int room = p->cols - 1 - (int)strlen(head) - dl - TAIL_ROOM - 3;
        int bw = room > BAR_MAX ? BAR_MAX : room;
        char bar[BAR_MAX + 3] = "";
        if (bw >= BAR_MIN) {
            int fill = (int)(done * (uint64_t)bw / p->total);
            bar[0] = ' ';
            bar[1] = '[';
            for (int i = 0; i < bw; i++)
                bar[2 + i] = i < fill ? '#' : '-';
            bar[2 + bw] = ']';
            bar[3 + bw] = '\0';
        }
        /* The full line, then with less, until one fits. */
        n = snprintf(line, sizeof line, "%s%s%s %3d%%  %s  %s left", head, dt, bar, pct, rate,
                     left);
        if (n > 0 && (size_t)n > max)
            n = snprintf(line, sizeof line, "%s%s %3d%%  %s left", head, dt, pct, left);
        if (n > 0 && (size_t)n > max)
            n = snprintf(line, sizeof line, "%s%s %3d%%", head, dt, pct);
        if (n > 0 && (size_t)n > max)
            n = snprintf(line, sizeof line, "%s%3d%%", head, pct);
    }
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    len = cut_words(line, len, max); /* one line: \r returns to its start */
    /* One write: \r, the line, blanks over what a longer one left. */
    char out[sizeof line + 512];
    size_t o = 0;
    out[o++] = '\r';
    memcpy(out + o, line, len);
    o += len;
    for (size_t i = len; i < p->len && o < sizeof out; i++)
        out[o++] = ' ';
    fwrite(out, 1, o, stderr);
    fflush(stderr);
    p->len = len;
    p->drawn_at = now;
    p->shown = true;
    p->dirty = false;
}

void kc_tool_progress(uint64_t done, uint64_t total, void *arg)
{
    struct kc_tool_progress *p = arg;
    if (p == NULL || !p->on)
        return;
    uint64_t now = kc_mono_ns();
    if (!p->recorded) {
        p->t1 = now;
        p->done1 = done;
    } else if (p->done == done && p->total == total) {
        return; /* nothing new to show */
    }
    p->done = done;
    p->total = total;
    p->recorded = true;
    p->dirty = true;
    /* The line that says 100% is drawn at once (and only once out of
     * turn: a total that grows with the count does not redraw each time). */
    bool finished = total > 0 && done >= total;
    bool now_full = finished && !p->full_drawn;
    if (!p->shown || now - p->drawn_at >= REDRAW_NS || now_full) {
        draw(p, now, false);
        p->full_drawn = p->full_drawn || finished;
    }
}

/* The stage's last count drawn, and its newline. */
static void finish(struct kc_tool_progress *p)
{
    if (!p->on || !p->recorded)
        return;
    /* The stage's end: its last line says so (0:00 left at its total). */
    draw(p, kc_mono_ns(), true);
    fputc('\n', stderr);
    fflush(stderr);
    p->shown = false;
    p->recorded = false;
    p->len = 0;
}

void kc_tool_progress_stage(const char *stage, void *arg)
{
    struct kc_tool_progress *p = arg;
    if (p == NULL || !p->on)
        return;
    finish(p);
    p->stage = stage;
    p->done = p->total = 0;
    p->dirty = false;
    p->full_drawn = false;
    p->t0 = kc_mono_ns();
}

void kc_tool_progress_end(struct kc_tool_progress *p)
{
    finish(p);
    p->on = false;
}
