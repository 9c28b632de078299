/*
 * help.c: the tool's help (help.h): `kcache --help`, `kcache help [TOPIC]`
 * and `kcache COMMAND --help`.
 *
 * docs/man/kcache.1.scd says the same: its COMMANDS section lists each
 * synopsis below, word for word (tests/docs/test_man.py compares them).
 */
#include "help.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

struct cmd_doc {
    const char *name;     /* the topic: `kcache help NAME` */
    const char *synopsis; /* one or more lines "kcache ...", '\n'-separated */
    const char *summary;  /* one line for `kcache --help` */
    const char *text;     /* what it does, for `kcache help NAME` */
};

static const struct cmd_doc docs[] = {
    {"stats", "kcache stats [--json | --openmetrics]",
     "entries, bytes, hits, misses and time saved; the remote's counters",
     "Entries and bytes per namespace; hits, misses, pass-throughs (with their\n"
     "reasons) and stores per backend; compile time saved; size on disk vs raw vs\n"
     "unique bytes; with KCACHE_REMOTE set, the remote's hits, misses, uploads,\n"
     "errors, timeouts and why it failed. --json for programs; --openmetrics for a\n"
     "node exporter's textfile collector.\n"},
    {"ls", "kcache ls [--namespace NS]", "list entries, one per line",
     "List the entries, one per line:\n"
     "  KEY NAMESPACE KIND SIZE STORED HITS LAST-HIT [pending]\n"
     "'pending' marks an entry still in the spool (the owner has not drained it).\n"},
    {"show", "kcache show KEY", "one entry's header",
     "One entry's header. KEY is the hex key as `kcache ls` prints it, or a\n"
     "unique prefix of at least 4 hex digits.\n"},
    {"verify", "kcache verify [--quiet]", "re-check every record; purge bad ones",
     "Re-check every record against its digest; report and purge bad ones.\n"
     "A progress bar on standard error when it is a terminal; --quiet: none.\n"},
    {"gc", "kcache gc [--max-size SIZE] [--quiet]", "evict least-recently-hit entries, compact",
     "Evict least-recently-hit entries until the store is at most SIZE (default:\n"
     "KCACHE_MAXSIZE), then compact. SIZE is a number with an optional K, M, G or\n"
     "T suffix (powers of 1024). A progress bar (of the bytes to free) on standard\n"
     "error when it is a terminal; --quiet: none.\n"},
    {"clear", "kcache clear", "remove every entry", "Remove every entry of the store.\n"},
    {"config", "kcache config [--markdown]", "every KCACHE_* variable: value and origin",
     "Every KCACHE_* setting: its effective value and where it came from\n"
     "(default, environment, command line); the libraries the shim last served\n"
     "with this store (NVRTC, nvJitLink, libNVVM, libcuda: each process records\n"
     "the ones it used, at exit); warnings for malformed values and unknown\n"
     "variables. --markdown prints the table of every variable, its kcache-run\n"
     "flag, default and meaning (README.md's configuration table).\n"},
    {"owner", "kcache owner [--idle-ms N]", "run the store's owner (the store starts it)",
     "Run the owner process: drain the spool, evict, compact, make the ready\n"
     "copies of NVRTC's bundled headers hosts asked for; exit after N ms idle\n"
     "(default 5000). The store starts it on demand; there is no need to run it\n"
     "by hand.\n"},
    {"keygen", "kcache keygen PATH", "a key pair for signing remote entries and bundles",
     "Make a key pair for signing remote entries and bundles: the secret key in\n"
     "PATH (mode 0600), the public key in PATH.pub (missing directories are made\n"
     "0700). Neither is overwritten.\n"},
    {"remote",
     "kcache remote ping\n"
     "kcache remote stats [--json]\n"
     "kcache remote prune --build ID | --namespace NS | --manifests [--quiet]",
     "reach the remote (KCACHE_REMOTE): ping, stats, prune",
     "ping: reach every KCACHE_REMOTE server: latency, version, role, and a\n"
     "signed entry written, read back and deleted.\n"
     "stats: the remote's entries and bytes per namespace and kcache build, over\n"
     "every server (this kcache's build is marked, as `kcache --version` names\n"
     "it; the row \"manifests\" is every build's manifests).\n"
     "prune: delete the remote's entries of one kcache build (after an upgrade)\n"
     "or of one namespace, with a progress bar on standard error when it is a\n"
     "terminal (--quiet: none). --manifests deletes the manifests, which every\n"
     "build shares (every node then compiles each kernel again); --build 0 is\n"
     "refused.\n"},
    {"push", "kcache push [--namespace NS] [--quiet]", "upload what this node compiled (backfill)",
     "Upload to KCACHE_REMOTE the entries this node compiled itself, signed with\n"
     "KCACHE_REMOTE_SIGNING_KEY: a backfill after the remote was set up, or was\n"
     "down. Entries served by the remote or imported from a bundle are not\n"
     "uploaded; a valid value the remote holds is never replaced.\n"
     "A progress bar on standard error when it is a terminal; --quiet: none.\n"},
    {"export",
     "kcache export -o FILE [--namespace GLOB]... [--hit-since DURATION] [--max-size SIZE]\n"
     "    [--sign KEY] [--compress zstd[:LEVEL]|lz4|none] [--quiet]",
     "a bundle of the store's entries for another machine",
     "Write a bundle of the store's entries for another machine (-o - : standard\n"
     "output). --namespace selects by pattern (repeatable), --hit-since by last\n"
     "hit (like 90m, 12h or 7d), --max-size keeps the most recently used that\n"
     "fit. Signed with --sign KEY, else KCACHE_REMOTE_SIGNING_KEY when set.\n"
     "A progress bar on standard error when it is a terminal; --quiet: none.\n"},
    {"import", "kcache import FILE [--trust-unsigned] [--dry-run] [--only-usable] [--quiet]",
     "verify a bundle, then add the entries the store lacks",
     "Check every byte of a bundle, its digests and its signature (against\n"
     "KCACHE_REMOTE_TRUSTED_KEYS), then add the entries the store lacks and print\n"
     "what each namespace brought and whether this machine can use it.\n"
     "--trust-unsigned accepts an unsigned bundle; --dry-run checks without\n"
     "importing; --only-usable skips another GPU's or NVRTC's entries.\n"
     "A progress bar on standard error when it is a terminal; --quiet: none.\n"},
    {"bundle", "kcache bundle show FILE", "a bundle's header",
     "A bundle's header: namespaces, counts, sizes, signer.\n"},
    {"why", "kcache why [--json] [--last N] [NAME | KEY]", "why a recent miss compiled",
     "For a recent miss (the last one, the last N, a program's NAME or 4 or more\n"
     "hex digits of its KEY): the nearest earlier compile of the same program and\n"
     "library and which input differs: a header file's content, a header now\n"
     "found or gone, an in-memory header, an option, the NVRTC, nvJitLink or\n"
     "libNVVM library, kcache's build, the working directory of a cwd-keyed\n"
     "compile; or no earlier compile of it, or the same inputs whose entry has\n"
     "left the store (or is still there, not served to that call); and entries the\n"
     "remote offered that were refused (KCACHE_REMOTE_TRUSTED_KEYS). The shim\n"
     "records each miss in KCACHE_DIR/why/ (the last 1000). --json for programs.\n"},
    {"help", "kcache help [COMMAND]", "this help, or one command's",
     "This help, or one command's (also: kcache COMMAND --help).\n"},
};

static const char general_options[] =
    "Options:\n"
    "  --dir DIR              cache directory (overrides KCACHE_DIR)\n"
    "  -h, --help             show this help and exit\n"
    "  -V, --version          show the version and exit\n";

static const char tail[] = "Exit status: 0 on success, 1 on a runtime error, 2 on a usage error.\n"
                           "The manual: man kcache (and man kcache-run).\n";

static void put_synopsis(FILE *f, const char *syn, const char *first, const char *more)
{
    const char *p = syn;
    while (*p != '\0') {
        size_t n = strcspn(p, "\n");
        fprintf(f, "%s%.*s\n", p == syn ? first : more, (int)n, p);
        p += n;
        if (*p == '\n')
            p++;
    }
}

void kc_tool_help_all(FILE *f)
{
    fputs("Usage: kcache [--dir DIR] COMMAND [OPTIONS]\n"
          "\n"
          "Inspect and maintain the kcache artifact store.\n"
          "\n"
          "Commands:\n",
          f);
    for (size_t i = 0; i < sizeof docs / sizeof *docs; i++) {
        /* Each synopsis line without "kcache ", the summary beside the last
         * one when it fits, else under it. */
        const char *p = docs[i].synopsis;
        while (*p != '\0') {
            size_t n = strcspn(p, "\n");
            const char *line = p;
            if (strncmp(line, "kcache ", 7) == 0) {
                line += 7;
                n -= 7;
            }
            p = line + n;
            if (*p == '\n')
                p++;
            bool last = *p == '\0';
            if (!last)
                fprintf(f, "  %.*s\n", (int)n, line);
            else if (n <= 22)
                fprintf(f, "  %-22.*s %s\n", (int)n, line, docs[i].summary);
            else
                fprintf(f, "  %.*s\n  %-22s %s\n", (int)n, line, "", docs[i].summary);
        }
    }
    fputs("\n", f);
    fputs(general_options, f);
    fputs("\n"
          "`kcache help COMMAND` (or `kcache COMMAND --help`) shows one command's\n"
          "whole synopsis and what it does.\n",
          f);
    fputs(tail, f);
}

int kc_tool_help(FILE *f, const char *topic)
{
    if (topic == NULL) {
        kc_tool_help_all(f);
        return 0;
    }
    for (size_t i = 0; i < sizeof docs / sizeof *docs; i++) {
        if (strcmp(docs[i].name, topic) != 0)
            continue;
        put_synopsis(f, docs[i].synopsis, "Usage: ", "       ");
        fprintf(f, "\n%s\n", docs[i].text);
        fputs("Every command also takes --dir DIR (the cache directory, instead of\n"
              "KCACHE_DIR).\n",
              f);
        fputs(tail, f);
        return 0;
    }
    return -1;
}

const char *kc_tool_help_topics(void)
{
    return "stats, ls, show, verify, gc, clear, config, owner, keygen, remote, push, export, "
           "import, bundle, help";
}
