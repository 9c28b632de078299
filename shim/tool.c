/*
 * Compilers run as processes: a known CUDA compiler tool's run served whole.
 *
 * LD_PRELOAD is inherited, so the shim is inside every ptxas a program
 * starts (Triton on every kernel, XLA, nvcc). Before the tool's main runs,
 * kc__tool_start decides whether this process is one (a name comparison
 * first, nothing more in any other process), keys the run by everything
 * that decides its outputs, and on a hit writes the outputs, replays
 * standard output and standard error and exits with the stored status: the
 * tool never runs. On a miss the tool runs as a child of this process
 * (fork: the tool's main runs in the child), which is watched: its
 * standard streams are copied through as they come, every file it opens
 * is recorded (deps.c, every thread), and only a run that exited, read
 * nothing but its named inputs and wrote nothing but its named outputs is
 * stored. Anything else passes through with a reason and is never stored.
 *
 * A tool is described by a table: its names, the environment variables it
 * reads, its options (which take a value, which name the output, which
 * kcache refuses, which make the tool record its command line in what it
 * writes). A new tool is a table.
 */
#include "deps.h"
#include "flight.h"
#include "shim.h"
#include "tool.h"
#include "toolrun.h"
#include "why.h"

#include "../common/buf.h"
#include "../common/clock.h"
#include "../common/config.h"
#include "../common/identity.h"
#include "../common/log.h"
#include "../common/why.h"
#include "../store/local/local.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BACKEND "tool"

/* ---- the tools ------------------------------------------------------------------------ */

enum opt_kind {
    O_FLAG,    /* no value: kept in the key as written */
    O_VAL,     /* a value: kept in the key as written */
    O_OUT,     /* a value, an output file: its path is not in the key */
    O_IN,      /* a value, an input file: its content is in the key, not
                  its path */
    O_SPEC,    /* a value "key=v,...,file=PATH" (fatbinary's images): PATH
                  an input file, the rest kept as written */
    O_REFUSE,  /* kcache leaves the run to the tool (help, an options file, a
                  form it does not parse) */
    O_RECORDS, /* no value; the tool then records its command line in its
                  output (a witness: ptxas -g), so every argument is kept
                  as written */
    O_CWD,     /* no value; the tool then records its working directory in
                  its output (a witness: cicc -g): it is keyed */
    O_LIBDIR,  /* a value, a directory libraries are searched in (nvlink's
                  -L): kept as written, the search keyed (lib_key) */
    O_OUTNEW,  /* an output the tool may leave as it is when a file is
                  there (nvlink's --register-link-binaries kept a file of
                  junk in one witness, wrote over it in another): a run
                  where something is there passes through */
    O_LIB,     /* a value, a library searched for (nvlink's -lNAME): kept
                  as written, what the search finds keyed (lib_key) */
};

struct opt {
    const char *lng, *shrt;
    enum opt_kind kind;
};

/* A name an output records as text, and nothing else of it (a witness:
 * the tool run twice with other names, the outputs compared byte for
 * byte). The output is kept with the name cut out of its one line
 * `pre NAME post`, and a replay puts the run's own name there, so a
 * temporary name (nvcc's tmpxft_...) makes no miss. A name with a
 * character the tool might escape is keyed as written instead. */
struct recorded {
    const char *opt; /* the option whose value is the name (long spelling) */
    const char *pre, *post;
    const char *out; /* the output option whose file records it */
};

struct tool {
    const char *const *names; /* the executable's file names */
    const char *id;           /* in the namespace */
    const char *const *env;   /* variables the tool reads that change what
                                 it does (debugging knobs): a run with one
                                 set passes through */
    const char *const *inert; /* variables it reads that decide no output
                                 (a test checks that every getenv call of
                                 the tool names one of the two lists) */
    const struct opt *opts;
    int max_positional;              /* input files named alone */
    const char *const *inert_files;  /* files it reads that decide no output */
    const struct recorded *recorded; /* or NULL */
    /* A flag that makes an input option name an output instead (cicc's
     * --gen_module_id_file: --module_id_file_name is then written), or
     * NULL. */
    const char *gen_flag, *gen_opt;
    /* The variable that adds directories to the library search (nvlink:
     * LIBRARY_PATH), or NULL. */
    const char *libpath_env;
};

/* ptxas 12.x and 13.x (`ptxas --help`). The cache-modifier options
 * (-dlcm, ...) are refused: whether they take a value is not documented. */
static const struct opt ptxas_opts[] = {
    {"--Ofast-compile", "-Ofc", O_VAL},
    {"--allow-expensive-optimizations", "-allow-expensive-optimizations", O_VAL},
    {"--compile-as-tools-patch", "-astoolspatch", O_FLAG},
    {"--compile-only", "-c", O_FLAG},
    {"--compiler-annotations", "-annotate", O_FLAG},
    {"--def-load-cache", "-dlcm", O_REFUSE},
    {"--def-store-cache", "-dscm", O_REFUSE},
    {"--device-debug", "-g", O_RECORDS},
    {"--device-function-maxrregcount", "-func-maxrregcount", O_VAL},
    {"--device-stack-protector", "-device-stack-protector", O_VAL},
    {"--disable-optimizer-constants", "-disable-optimizer-consts", O_FLAG},
    {"--disable-warnings", "-w", O_FLAG},
    {"--dont-merge-basicblocks", "-no-bb-merge", O_FLAG},
    {"--entry", "-e", O_VAL},
    {"--extensible-whole-program", "-ewp", O_FLAG},
    {"--fmad", "-fmad", O_VAL},
    {"--force-load-cache", "-flcm", O_REFUSE},
    {"--force-store-cache", "-fscm", O_REFUSE},
    {"--g-tensor-memory-access-check", "-g-tmem-access-check", O_FLAG},
    {"--generate-line-info", "-lineinfo", O_FLAG},
    {"--gno-tensor-memory-access-check", "-gno-tmem-access-check", O_FLAG},
    {"--gpu-name", "-arch", O_VAL},
    {"--help", "-h", O_REFUSE},
    {"--input-as-string", "-ias", O_VAL},
    {"--legacy-bar-warp-wide-behavior", "-legacy-bar-warp-wide-behavior", O_FLAG},
    {"--list-version", "-version-ls", O_REFUSE},
    {"--machine", "-m", O_VAL},
    {"--make-errors-visible-at-exit", "-make-errors-visible-at-exit", O_FLAG},
    {"--maxntid", "-maxntid", O_VAL},
    {"--maxrregcount", "-maxrregcount", O_VAL},
    {"--minnctapersm", "-minnctapersm", O_VAL},
    {"--opt-level", "-O", O_VAL},
    {"--optimize-float-atomics", "-opt-fp-atomics", O_FLAG},
    {"--options-file", "-optf", O_REFUSE},
    {"--output-file", "-o", O_OUT},
    {"--override-directive-values", "-override-directive-values", O_FLAG},
    {"--position-independent-code", "-pic", O_VAL},
    {"--preserve-relocs", "-preserve-relocs", O_FLAG},
    {"--register-usage-level", "-regUsageLevel", O_VAL},
    /* Not in --help; Triton 3.9 passes it to every ptxas 12.x and 13.x. */
    {"--regAllocOptLevel", "-regAllocOptLevel", O_VAL},
    {"--return-at-end", "-ret-end", O_FLAG},
    {"--sanitize", "-sanitize", O_VAL},
    {"--sp-bounds-check", "-sp-bounds-check", O_FLAG},
    {"--split-compile", "-split-compile", O_VAL},
    {"--suppress-async-bulk-multicast-advisory-warning",
     "-suppress-async-bulk-multicast-advisory-warning", O_FLAG},
    {"--suppress-debug-info", "-suppress-debug-info", O_FLAG},
    {"--suppress-double-demote-warning", "-suppress-double-demote-warning", O_FLAG},
    {"--suppress-sparse-mma-advisory-info", "-suppress-sparse-mma-advisory-info", O_FLAG},
    {"--suppress-stack-size-warning", "-suppress-stack-size-warning", O_FLAG},
    {"--verbose", "-v", O_FLAG},
    {"--version", "-V", O_REFUSE},
    {"--warn-on-double-precision-use", "-warn-double-usage", O_FLAG},
    {"--warn-on-local-memory-usage", "-warn-lmem-usage", O_FLAG},
    {"--warn-on-spills", "-warn-spills", O_FLAG},
    {"--warning-as-error", "-Werror", O_FLAG},
    {NULL, NULL, O_FLAG},
};

static const char *const ptxas_names[] = {"ptxas", "ptxas-blackwell", NULL};
static const char *const ptxas_env[] = {"CAN_FINALIZE_DEBUG", "DUMP_KNOBS_TO_FILE", NULL};
/* ptxas 13.4: make's jobserver (how many threads work, not what they
 * make) and OpenSSL's CPU dispatch. */
static const char *const ptxas_inert[] = {"MAKEFLAGS", "OPENSSL_ia32cap", NULL};
static const char *const no_names[] = {NULL};

/* fatbinary 13.0 (`fatbinary --help`, and what nvcc 13.0 passes: -64,
 * --cicc-cmdline, -link). It reads its images and writes the fatbinary
 * (--create) and the C file that embeds it (--embedded-fatbin); no path
 * reaches either (a witness: the same images at other paths and names
 * give the same bytes); no variable read (a getenv trace). */
static const struct opt fatbinary_opts[] = {
    {"--32", "-32", O_FLAG},
    {"--64", "-64", O_FLAG},
    {"--cicc-cmdline", "-cicc-cmdline", O_VAL},
    {"--cmdline", "-cmdline", O_VAL},
    {"--compress", "-compress", O_VAL},
    {"--compress-all", "-compress-all", O_FLAG},
    {"--compress-mode", "-compress-mode", O_VAL},
    {"--create", "-create", O_OUT},
    {"--debug", "-g", O_FLAG},
    {"--device-c", "-c", O_FLAG},
    {"--embedded-fatbin", "-fatbin", O_OUT},
    {"--help", "-h", O_REFUSE},
    {"--ident", "-ident", O_VAL},
    {"--image2", "-image2", O_SPEC},
    {"--image3", "-image3", O_SPEC},
    {"--link", "-link", O_FLAG},
    {"--no-asm", "-no-asm", O_FLAG},
    {"--options-file", "-optf", O_REFUSE},
    {"--version", "-V", O_REFUSE},
    {NULL, NULL, O_FLAG},
};
static const char *const fatbinary_names[] = {"fatbinary", NULL};

/* cicc 13.0 (nvvm/bin/cicc): no --help; the options are those nvcc 13.0
 * passes (`nvcc --dryrun` with -G, -lineinfo, --use_fast_math, -rdc,
 * --extended-lambda, --expt-relaxed-constexpr, -std=c++NN, -maxrregcount,
 * -Xcicc -O2, -ftz). It reads the preprocessed source and the module id
 * file, and writes the PTX (-o), the host-side C file, the device file and
 * the stub. Witnesses (the same run at other paths, names and working
 * directories, outputs compared byte for byte): no input's path and no
 * output's path reaches any output, except the stub, which records its own
 * path and the --include_file_name on a line each (cut out and put back,
 * see struct recorded), and -g, which records the working directory in
 * the PTX (keyed). libdevice is inside cicc 13.0 (strace: no file of
 * nvvm/libdevice is opened), so the executable's content covers it. It
 * opens /etc/localtime (no output differs by the time of day or TZ: the
 * witnesses ran minutes apart) and a scratch file in TMPDIR it removes.
 * With --gen_module_id_file (nvcc -cubin, -ptx) it writes the module id
 * file instead of reading it: the same bytes at other names, paths and
 * working directories (a witness). */
static const struct opt cicc_opts[] = {
    {"--allow_managed", "--allow_managed", O_FLAG},
    {"--c++11", "--c++11", O_FLAG},
    {"--c++14", "--c++14", O_FLAG},
    {"--c++17", "--c++17", O_FLAG},
    {"--c++20", "--c++20", O_FLAG},
    {"--c++23", "--c++23", O_FLAG},
    {"--debug_mode", "--debug_mode", O_FLAG},
    {"--device-c", "--device-c", O_FLAG},
    {"--device-hidden-visibility", "--device-hidden-visibility", O_FLAG},
    {"--display_error_number", "--display_error_number", O_FLAG},
    {"--extended-lambda", "--extended-lambda", O_FLAG},
    {"--gen_c_file_name", "--gen_c_file_name", O_OUT},
    {"--gen_device_file_name", "--gen_device_file_name", O_OUT},
    {"--gen_div_approx_ftz", "--gen_div_approx_ftz", O_FLAG},
    {"--gen_module_id_file", "--gen_module_id_file", O_FLAG},
    {"--gnu_version", "--gnu_version", O_VAL},
    {"--include_file_name", "--include_file_name", O_VAL},
    {"--module_id_file_name", "--module_id_file_name", O_IN},
    {"--no-version-ident", "--no-version-ident", O_FLAG},
    {"--orig_src_file_name", "--orig_src_file_name", O_VAL},
    {"--orig_src_path_name", "--orig_src_path_name", O_VAL},
    {"--relaxed_constexpr", "--relaxed_constexpr", O_FLAG},
    {"--static-host-stub", "--static-host-stub", O_FLAG},
    {"--stub_file_name", "--stub_file_name", O_OUT},
    {"-O", "-O", O_VAL},
    {"-arch", "-arch", O_VAL},
    {"-fast-math", "-fast-math", O_FLAG},
    {"-fmad", "-fmad", O_VAL},
    {"-ftz", "-ftz", O_VAL},
    {"-g", "-g", O_CWD},
    {"-generate-line-info", "-generate-line-info", O_FLAG},
    {"-m64", "-m64", O_FLAG},
    {"-maxreg", "-maxreg", O_VAL},
    {"-o", "-o", O_OUT},
    {"-prec_div", "-prec_div", O_VAL},
    {"-prec_sqrt", "-prec_sqrt", O_VAL},
    {"-tused", "-tused", O_FLAG},
    {NULL, NULL, O_FLAG},
};
static const char *const cicc_names[] = {"cicc", NULL};
/* cicc 13.0's getenv calls (a trace): the EDG front end's and NVVM's
 * knobs, and LLVM's producer string, change what it does; the rest are
 * its allocator, where its scratch file goes, and $PWD (whose use, like
 * the working directory's, a witness shows only under -g: keyed then). */
static const char *const cicc_env[] = {"AS_SECURE_LOG_FILE",
                                       "EDG_BASE",
                                       "EDG_MODULES_PATH",
                                       "LIBNVVM_DISABLE_CONCURRENT_API",
                                       "LLVM_OVERRIDE_PRODUCER",
                                       "NOCOLOR",
                                       "NVVMCCWIZ",
                                       "NVVM_IR_VER_CHK",
                                       "NV_NVVM_VERSION",
                                       "USR_INCLUDE",
                                       "bar",
                                       NULL};
static const char *const cicc_inert[] = {"MALLOC_CONF", "PWD",    "TEMP", "TEMPDIR",
                                         "TMP",         "TMPDIR", NULL};
static const char *const cicc_files[] = {"/etc/localtime", NULL};
static const struct recorded cicc_recorded[] = {
    {"--stub_file_name", "\n# 1 \"", "\"\n", "--stub_file_name"},
    {"--include_file_name", "\n#include \"", "\"\n", "--stub_file_name"},
    {NULL, NULL, NULL, NULL},
};

/* nvlink 13.0 (`nvlink --help`, and what nvcc 13.0 passes for -rdc:
 * -cpu-arch, --host-ccbin, which it does not run). It reads its inputs and
 * the libraries -lNAME names, which it finds by looking for libNAME.so,
 * then libNAME.a, in each -L directory and each of $LIBRARY_PATH (strace):
 * every such place is keyed, found or not (lib_key). It writes the cubin
 * (-o) and the registration file (--register-link-binaries: served only
 * where no file is there, O_OUTNEW); no path reaches either (a witness: other names, directories,
 * working directories). -g and -lto pass through (not witnessed). */
static const struct opt nvlink_opts[] = {
    {"--Ofast-compile", "-Ofc", O_VAL},
    {"--arch", "-arch", O_VAL},
    {"--cpu-arch", "-cpu-arch", O_VAL},
    {"--debug", "-g", O_REFUSE},
    {"--disable-infos", "-disable-infos", O_FLAG},
    {"--disable-warnings", "-w", O_FLAG},
    {"--dlto", "-dlto", O_REFUSE},
    {"--extra-warnings", "-extrawarn", O_FLAG},
    {"--help", "-h", O_REFUSE},
    {"--host-ccbin", "--host-ccbin", O_VAL},
    {"--library", "-l", O_LIB},
    {"--library-path", "-L", O_LIBDIR},
    {"--link-time-opt", "-lto", O_REFUSE},
    {"--machine", "-m", O_VAL},
    {"--maxrregcount", "-maxrregcount", O_VAL},
    {"--options-file", "-optf", O_REFUSE},
    {"--output-file", "-o", O_OUT},
    {"--preserve-relocs", "-preserve-relocs", O_FLAG},
    {"--register-link-binaries", "--register-link-binaries", O_OUTNEW},
    {"--suppress-arch-warning", "-suppress-arch-warning", O_FLAG},
    {"--suppress-debug-info", "-suppress-debug-info", O_FLAG},
    {"--suppress-stack-size-warning", "-suppress-stack-size-warning", O_FLAG},
    {"--verbose", "-v", O_FLAG},
    {"--version", "-V", O_REFUSE},
    {"--warning-as-error", "-Werror", O_FLAG},
    {NULL, NULL, O_FLAG},
};
static const char *const nvlink_names[] = {"nvlink", NULL};
/* nvlink 13.0's getenv calls (a trace): ptxas's finalizer knob, and the
 * library search path (keyed). */
static const char *const nvlink_env[] = {"CAN_FINALIZE_DEBUG", NULL};
static const char *const nvlink_inert[] = {"LIBRARY_PATH", NULL};

static const struct tool tools[] = {
    {ptxas_names, "ptxas", ptxas_env, ptxas_inert, ptxas_opts, 1, no_names, NULL, NULL, NULL, NULL},
    {fatbinary_names, "fatbinary", no_names, no_names, fatbinary_opts, 0, no_names, NULL, NULL,
     NULL, NULL},
    {cicc_names, "cicc", cicc_env, cicc_inert, cicc_opts, 1, cicc_files, cicc_recorded,
     "--gen_module_id_file", "--module_id_file_name", NULL},
    {nvlink_names, "nvlink", nvlink_env, nvlink_inert, nvlink_opts, 32 /* MAX_IN */, no_names, NULL,
     NULL, NULL, "LIBRARY_PATH"},
};

/* The tool this executable's file name names, or NULL: the whole cost of
 * the check in every other process. */
static const struct tool *tool_named(const char *argv0)
{
    if (argv0 == NULL)
        return NULL;
    const char *base = strrchr(argv0, '/');
    base = base != NULL ? base + 1 : argv0;
    for (size_t t = 0; t < sizeof tools / sizeof tools[0]; t++)
        for (const char *const *n = tools[t].names; *n != NULL; n++)
            if (strcmp(base, *n) == 0)
                return &tools[t];
    return NULL;
}

/* ---- a run: its arguments parsed ------------------------------------------------------ */

#define MAX_IN 32
#define MAX_OUT 8
#define MAX_LIB 8
#define MAX_REC 4

/* Per argument, what it is to the key. */
enum role {
    R_KEPT = 0, /* kept as written */
    R_IN,       /* an input's path (from off on): its content is keyed */
    R_OUT,      /* an output's path (from off on): left out */
    R_NAMED,    /* a name an output records (from off on): cut out of that
                   output, put back on a replay; left out */
};

struct run {
    const struct tool *tool;
    int argc;
    char **argv;
    const char *inputs[MAX_IN];  /* files read, named by the arguments */
    kc_digest in_digest[MAX_IN]; /* their contents (run_key) */
    int n_inputs, n_positional;
    kc_digest identity;           /* the executable's */
    kc_digest base;               /* the run's key */
    const char *outputs[MAX_OUT]; /* the output files, in argument order */
    const struct opt *out_opt[MAX_OUT];
    int n_outputs;
    const char *named[MAX_REC];   /* per tool->recorded: the name cut out, or
                                     NULL (absent, or keyed as written) */
    bool records_args;            /* the output records the command line */
    bool records_cwd;             /* the output records the working directory */
    const char *libdirs[MAX_LIB]; /* -L, in order */
    const char *libs[MAX_LIB];    /* -l, in order */
    int n_libdirs, n_libs;
    char **places; /* where the search looks for each library (lib_key) */
    int n_places;
    unsigned char *role; /* per argument: enum role */
    unsigned short *off; /* per argument: where the path or name starts */
};

static const struct opt *opt_find(const struct opt *opts, const char *a, size_t n)
{
    for (const struct opt *o = opts; o->lng != NULL; o++)
        if ((strlen(o->lng) == n && strncmp(a, o->lng, n) == 0) ||
            (strlen(o->shrt) == n && strncmp(a, o->shrt, n) == 0))
            return o;
    return NULL;
}

/* Whether a tool writes `name` into its output as it is: nothing a
 * C-like quoting would escape, nothing a key could confuse. */
static bool plain_name(const char *name)
{
    if (name[0] == '\0' || strlen(name) >= PATH_MAX)
        return false;
    for (const char *p = name; *p != '\0'; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr("._/+-", *p) != NULL))
            return false;
    return true;
}

/* The index in tool->recorded of what names option o's value, or -1. */
static int recorded_of(const struct tool *t, const struct opt *o)
{
    for (int j = 0; t->recorded != NULL && t->recorded[j].opt != NULL && j < MAX_REC; j++)
        if (strcmp(t->recorded[j].opt, o->lng) == 0)
            return j;
    return -1;
}

/* Parses the arguments. KC_PASS_* reason when the run is left to the tool,
 * or -1 when kcache can key it. */
static int parse(struct run *r)
{
    r->role = calloc((size_t)r->argc + 1, 1);
    r->off = calloc((size_t)r->argc + 1, sizeof *r->off);
    if (r->role == NULL || r->off == NULL)
        return KC_PASS_internal;
    bool gen = false;
    for (int i = 1; i < r->argc && r->tool->gen_flag != NULL; i++)
        gen |= strcmp(r->argv[i], r->tool->gen_flag) == 0;
    for (int i = 1; i < r->argc; i++) {
        const char *a = r->argv[i];
        if (a[0] != '-') {
            if (r->n_inputs == MAX_IN || r->n_positional == r->tool->max_positional)
                return KC_PASS_input;
            r->n_positional++;
            r->inputs[r->n_inputs++] = a;
            r->role[i] = R_IN;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t n = eq != NULL ? (size_t)(eq - a) : strlen(a);
        const struct opt *o = opt_find(r->tool->opts, a, n);
        const char *v = eq != NULL ? eq + 1 : NULL;
        if (o == NULL && a[1] != '-' && a[1] != '\0' && a[2] != '\0') {
            /* A one-letter option with its value attached: -O3, -m64. */
            o = opt_find(r->tool->opts, a, 2);
            if (o != NULL && o->kind != O_VAL && o->kind != O_OUT && o->kind != O_IN &&
                o->kind != O_LIB && o->kind != O_LIBDIR)
                o = NULL;
            v = a + 2;
        }
        if (o == NULL || o->kind == O_REFUSE)
            return KC_PASS_option;
        if (o->kind == O_FLAG || o->kind == O_RECORDS || o->kind == O_CWD) {
            if (eq != NULL)
                return KC_PASS_option;
            r->records_args |= o->kind == O_RECORDS;
            r->records_cwd |= o->kind == O_CWD;
            continue;
        }
        /* A value: after '=', attached, or the next argument. */
        int vi = i;
        if (v == NULL) {
            if (i + 1 >= r->argc)
                return KC_PASS_option;
            v = r->argv[++i];
            vi = i;
        }
        size_t at = (size_t)(v - r->argv[vi]);
        enum opt_kind kind = gen && strcmp(o->lng, r->tool->gen_opt) == 0 ? O_OUT : o->kind;
        if (kind == O_SPEC) {
            /* "kind=elf,sm=90,file=PATH": the file last (a path may hold
             * a comma; fatbinary would split it). */
            const char *f = strstr(v, "file=");
            while (f != NULL && f != v && f[-1] != ',')
                f = strstr(f + 1, "file=");
            if (f == NULL || strchr(f, ',') != NULL || f[5] == '\0')
                return KC_PASS_option;
            at = (size_t)(f + 5 - r->argv[vi]);
            v = f + 5;
        }
        if (at > USHRT_MAX)
            return KC_PASS_option;
        if (kind == O_LIBDIR || kind == O_LIB) {
            /* One each (not a comma list); a library by its name alone. */
            bool dir = kind == O_LIBDIR;
            if (v[0] == '\0' || strchr(v, ',') != NULL || (!dir && strchr(v, '/') != NULL) ||
                (dir ? r->n_libdirs : r->n_libs) == MAX_LIB)
                return KC_PASS_option;
            if (dir)
                r->libdirs[r->n_libdirs++] = v;
            else
                r->libs[r->n_libs++] = v;
            continue;
        }
        if (kind == O_IN || kind == O_SPEC) {
            if (r->n_inputs == MAX_IN || v[0] == '\0')
                return KC_PASS_input;
            r->inputs[r->n_inputs++] = v;
            r->role[vi] = R_IN;
            r->off[vi] = (unsigned short)at;
            continue;
        }
        if (kind == O_OUTNEW) {
            struct stat st;
            if (lstat(v, &st) == 0 || errno != ENOENT)
                return KC_PASS_order; /* the tool would leave it as it is */
            kind = O_OUT;
        }
        if (kind == O_OUT) {
            if (r->n_outputs == MAX_OUT || v[0] == '\0')
                return KC_PASS_option;
            for (int k = 0; k < r->n_outputs; k++)
                if (r->out_opt[k] == o)
                    return KC_PASS_option; /* which one the tool takes */
            r->out_opt[r->n_outputs] = o;
            r->outputs[r->n_outputs++] = v;
            r->role[vi] = R_OUT;
            r->off[vi] = (unsigned short)at;
        }
        int j = recorded_of(r->tool, o);
        if (j >= 0) {
            if (r->named[j] != NULL)
                return KC_PASS_option;
            if (plain_name(v)) {
                r->named[j] = v;
                if (o->kind == O_VAL) {
                    r->role[vi] = R_NAMED;
                    r->off[vi] = (unsigned short)at;
                }
            } else if (kind == O_OUT) {
                r->role[vi] = R_KEPT; /* its path is keyed as written */
            }
        }
    }
    /* An output, named; the inputs named (or the PTX given as a string). */
    if (r->n_outputs == 0)
        return KC_PASS_input;
    return -1;
}

/* ---- the key ---------------------------------------------------------------------------- */

/* The content digest of a regular file `path`, read whole. 0, or negative
 * errno (-EINVAL: not a regular file). */
static int file_digest(const char *path, kc_digest *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = fstat(fd, &st) != 0 ? -errno : !S_ISREG(st.st_mode) ? -EINVAL : 0;
    if (rc == 0)
        rc = kc__digest_fd(fd, &st, out);
    close(fd);
    return rc;
}

/* Adds the library search to the key: the search path variable as set,
 * and for each library each place the tool looks (libNAME.so, then
 * libNAME.a, in each -L directory, then each of the variable's), found (a
 * regular file: its content) or not. Every place is keyed whether or not
 * the tool would stop before it, so no order of search need be assumed;
 * the places are kept for report_check. KC_PASS_* reason, or -1. */
static int lib_key(struct run *r, struct kc__hasher *h)
{
    const char *env = r->tool->libpath_env != NULL ? getenv(r->tool->libpath_env) : NULL;
    kc__hash_str(h, env);
    if (r->n_libs == 0)
        return -1;
    const char *dirs[MAX_LIB + 16];
    int nd = 0;
    for (int i = 0; i < r->n_libdirs; i++)
        dirs[nd++] = r->libdirs[i];
    char envcopy[PATH_MAX];
    if (env != NULL) {
        if (strlen(env) >= sizeof envcopy)
            return KC_PASS_option;
        strcpy(envcopy, env);
        for (char *p = envcopy, *e; p != NULL; p = e) {
            e = strchr(p, ':');
            if (e != NULL)
                *e++ = '\0';
            if (p[0] == '\0' || nd == (int)(sizeof dirs / sizeof dirs[0]))
                return KC_PASS_option; /* the working directory, or too many */
            dirs[nd++] = p;
        }
    }
    r->places = calloc((size_t)(r->n_libs * nd * 2) + 1, sizeof *r->places);
    if (r->places == NULL)
        return KC_PASS_internal;
    static const char *const ext[] = {".so", ".a"};
    for (int l = 0; l < r->n_libs; l++)
        for (int d = 0; d < nd; d++)
            for (int x = 0; x < 2; x++) {
                char path[PATH_MAX];
                if ((size_t)snprintf(path, sizeof path, "%s/lib%s%s", dirs[d], r->libs[l],
                                     ext[x]) >= sizeof path)
                    return KC_PASS_input;
                if ((r->places[r->n_places] = strdup(path)) == NULL)
                    return KC_PASS_internal;
                r->n_places++;
                kc__hash_str(h, path);
                kc_digest dg = {0};
                int rc = file_digest(path, &dg);
                if (rc == -ENOENT || rc == -ENOTDIR) {
                    kc__hash_u64(h, 0);
                    continue;
                }
                if (rc != 0)
                    return KC_PASS_input; /* not a regular file, unreadable */
                kc__hash_u64(h, 1);
                kc__hash_bytes(h, &dg, sizeof dg);
            }
    return -1;
}

static void run_free(struct run *r)
{
    free(r->role);
    free(r->off);
    for (int i = 0; i < r->n_places; i++)
        free(r->places[i]);
    free(r->places);
}

/* The run's key: the tool's identity and name, every argument in order
 * (an input's path replaced by its content, an output's path and a name
 * an output records left out, unless the output records the command
 * line), the working directory when the output records it, the tool's
 * variables, and whether standard output and error are one stream.
 * KC_PASS_* reason when it cannot be keyed, or -1. */
static int run_key(struct run *r, const kc_digest *identity, bool merged, kc_digest *out)
{
    for (const char *const *e = r->tool->env; *e != NULL; e++) {
        const char *v = getenv(*e);
        if (v != NULL)
            return KC_PASS_option; /* the tool's debugging knobs */
    }
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL)
        return KC_PASS_internal;
    kc__hash_str(h, "kcache tool run 2");
    kc__hash_str(h, r->tool->id);
    kc__hash_bytes(h, identity, sizeof *identity);
    kc__hash_u64(h, (uint64_t)r->argc);
    kc__hash_u64(h, r->records_args);
    kc__hash_u64(h, merged);
    int why = -1, k = 0;
    if (r->records_cwd) {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL)
            why = KC_PASS_input;
        kc__hash_str(h, why < 0 ? cwd : "");
        kc__hash_str(h, getenv("PWD"));
    }
    for (int i = 1; i < r->argc && why < 0; i++) {
        const char *a = r->argv[i];
        /* Each argument tagged by its role: no spelling of one reads as
         * another. The part before a path or name (the option's spelling,
         * "kind=elf,sm=90,file=") is kept. */
        kc__hash_u64(h, r->role[i]);
        if (r->role[i] == R_KEPT || r->records_args) {
            kc__hash_str(h, a);
        } else {
            kc__hash_bytes(h, a, r->off[i]);
            kc__hash_u64(h, r->off[i]);
        }
        if (r->role[i] == R_IN) {
            kc_digest d = {0};
            if (file_digest(a + r->off[i], &d) != 0)
                why = KC_PASS_input;
            r->in_digest[k++] = d;
            kc__hash_bytes(h, &d, sizeof d);
        }
    }
    if (why < 0)
        why = lib_key(r, h);
    *out = kc__hash_digest(h);
    kc__hasher_free(h);
    r->identity = *identity;
    r->base = *out;
    return why;
}

/* The miss's record for `kcache why`: the tool, kcache's build, every
 * argument as keyed (an input by its content, shown by its path). */
static void why_record(const struct run *r, const kc_key *key, const char *why_not, uint64_t took)
{
    struct kc_why w = {0};
    const char *name = r->n_inputs > 0 ? r->inputs[0] : r->outputs[0];
    kc_why_begin(&w, BACKEND, name, &r->base);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    kc_why_add(&w, "library", r->tool->id, &r->identity, exe);
    uint64_t b = kc__self_build();
    kc_digest bd = kc_digest_of(&b, sizeof b);
    char shown[64];
    snprintf(shown, sizeof shown, "build %016llx", (unsigned long long)b);
    kc_why_add(&w, "kcache", "", &bd, shown);
    for (int i = 1, k = 0; i < r->argc; i++) {
        if (r->role[i] == R_IN)
            kc_why_add(&w, "input", "", &r->in_digest[k++], r->argv[i]);
        else if (r->role[i] == R_OUT && !r->records_args)
            kc_why_add(&w, "option", "", NULL, "(an output)");
        else if (r->role[i] == R_NAMED && !r->records_args)
            kc_why_add(&w, "option", "", NULL, "(a name an output records)");
        else
            kc_why_add(&w, "option", "", NULL, r->argv[i]);
    }
    kc__why_finish(&w, &key->id, key->build, why_not, took, 0);
}

/* ---- records ---------------------------------------------------------------------------- */

/* A run's record: u64 magic, i32 exit status, u8 merged, blob standard
 * output, blob standard error, u32 the number of outputs, and per output
 * (in argument order) u8 whether it was written, blob its bytes, u32 the
 * number of names cut out of it and per name u64 where (in the bytes
 * kept, ascending) and u32 which (the tool's recorded[]). Little-endian. */
#define TOOL_MAGIC 0x324c54434bull /* "KCTL" 2 */

struct splice {
    uint64_t at;
    uint32_t which;
};

struct outfile {
    int wrote;
    struct kc_buf bytes;
    struct splice cut[MAX_REC];
    uint32_t n_cut;
};

struct record {
    int status;
    int merged;
    struct kc_buf out, err;
    uint32_t n_files;
    struct outfile file[MAX_OUT];
};

static void record_free(struct record *x)
{
    kc_buf_free(&x->out);
    kc_buf_free(&x->err);
    for (int k = 0; k < MAX_OUT; k++)
        kc_buf_free(&x->file[k].bytes);
}

static int record_encode(const struct record *x, struct kc_buf *b)
{
    kc_buf_put_u64(b, TOOL_MAGIC);
    kc_buf_put_u32(b, (uint32_t)(int32_t)x->status);
    kc_buf_put_u8(b, (uint8_t)x->merged);
    kc_buf_put_blob(b, x->out.p, x->out.len);
    kc_buf_put_blob(b, x->err.p, x->err.len);
    kc_buf_put_u32(b, x->n_files);
    for (uint32_t k = 0; k < x->n_files; k++) {
        const struct outfile *f = &x->file[k];
        kc_buf_put_u8(b, (uint8_t)f->wrote);
        kc_buf_put_blob(b, f->bytes.p, f->bytes.len);
        kc_buf_put_u32(b, f->n_cut);
        for (uint32_t j = 0; j < f->n_cut; j++) {
            kc_buf_put_u64(b, f->cut[j].at);
            kc_buf_put_u32(b, f->cut[j].which);
        }
    }
    return b->err ? -ENOMEM : 0;
}

static int record_decode(const void *p, size_t n, struct record *x)
{
    memset(x, 0, sizeof *x);
    struct kc_rd r;
    kc_rd_init(&r, p, n);
    if (kc_rd_get_u64(&r) != TOOL_MAGIC)
        return -EINVAL;
    x->status = (int)(int32_t)kc_rd_get_u32(&r);
    x->merged = kc_rd_get_u8(&r);
    int rc = kc_rd_get_blob(&r, &x->out);
    if (rc == 0)
        rc = kc_rd_get_blob(&r, &x->err);
    x->n_files = kc_rd_get_u32(&r);
    if (rc == 0 && x->n_files > MAX_OUT)
        rc = -EINVAL;
    for (uint32_t k = 0; rc == 0 && k < x->n_files; k++) {
        struct outfile *f = &x->file[k];
        f->wrote = kc_rd_get_u8(&r);
        rc = kc_rd_get_blob(&r, &f->bytes);
        f->n_cut = kc_rd_get_u32(&r);
        if (rc == 0 && (f->wrote > 1 || f->n_cut > MAX_REC))
            rc = -EINVAL;
        for (uint32_t j = 0; rc == 0 && j < f->n_cut; j++) {
            f->cut[j].at = kc_rd_get_u64(&r);
            f->cut[j].which = kc_rd_get_u32(&r);
            if (f->cut[j].at > f->bytes.len || f->cut[j].which >= MAX_REC ||
                (j > 0 && f->cut[j].at < f->cut[j - 1].at))
                rc = -EINVAL;
        }
    }
    if (rc == 0 && (kc_rd_end(&r) != 0 || x->status < 0 || x->status > 255 || x->merged > 1 ||
                    (x->merged && x->err.len != 0)))
        rc = -EINVAL;
    if (rc != 0)
        record_free(x);
    return rc;
}

/* Cuts the names the run's output k records out of its bytes (f->bytes,
 * as the tool wrote them): each must stand once, on its line. NULL, or
 * why the run is not stored. */
static const char *cut_names(const struct run *r, int k, struct outfile *f)
{
    const struct recorded *rec = r->tool->recorded;
    struct {
        size_t pos, len;
        uint32_t which;
    } found[MAX_REC];
    uint32_t n = 0;
    for (uint32_t j = 0; rec != NULL && rec[j].opt != NULL && j < MAX_REC; j++) {
        if (r->named[j] == NULL || strcmp(rec[j].out, r->out_opt[k]->lng) != 0)
            continue;
        char pat[PATH_MAX + 64];
        int pn = snprintf(pat, sizeof pat, "%s%s%s", rec[j].pre, r->named[j], rec[j].post);
        if (pn < 0 || (size_t)pn >= sizeof pat)
            return "a name its output records is too long";
        const char *hit = NULL;
        size_t count = 0;
        const char *p = (const char *)f->bytes.p, *end = p + f->bytes.len;
        while (p < end) {
            const char *q = memmem(p, (size_t)(end - p), pat, (size_t)pn);
            if (q == NULL)
                break;
            hit = q;
            count++;
            p = q + 1;
        }
        if (count != 1)
            return "its output records a name where kcache does not expect it";
        found[n].pos = (size_t)(hit - (const char *)f->bytes.p) + strlen(rec[j].pre);
        found[n].len = strlen(r->named[j]);
        found[n].which = j;
        n++;
    }
    if (n == 0)
        return NULL;
    /* In order of place (they do not overlap: each is on its own line). */
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && found[j].pos < found[j - 1].pos; j--) {
            __typeof__(found[0]) t = found[j];
            found[j] = found[j - 1];
            found[j - 1] = t;
        }
    struct kc_buf kept = {0};
    size_t from = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (found[i].pos < from)
            return "its output records a name where kcache does not expect it";
        kc_buf_add(&kept, f->bytes.p + from, found[i].pos - from);
        f->cut[i] = (struct splice){kept.len, found[i].which};
        from = found[i].pos + found[i].len;
    }
    kc_buf_add(&kept, f->bytes.p + from, f->bytes.len - from);
    if (kept.err) {
        kc_buf_free(&kept);
        return "its output was too large to keep";
    }
    kc_buf_free(&f->bytes);
    f->bytes = kept;
    f->n_cut = n;
    return NULL;
}

/* Output k's bytes for this run: the names put back. 0 or -ENOMEM / -EINVAL
 * (a name the record cut that this run does not have). */
static int put_names(const struct run *r, const struct outfile *f, struct kc_buf *b)
{
    size_t from = 0;
    for (uint32_t j = 0; j < f->n_cut; j++) {
        const char *name = r->named[f->cut[j].which];
        if (name == NULL)
            return -EINVAL;
        kc_buf_add(b, f->bytes.p + from, (size_t)f->cut[j].at - from);
        kc_buf_add(b, name, strlen(name));
        from = (size_t)f->cut[j].at;
    }
    kc_buf_add(b, f->bytes.p + from, f->bytes.len - from);
    return b->err ? -ENOMEM : 0;
}

/* ---- replay ------------------------------------------------------------------------------ */

/* Serves the run from x: its output files, its streams, its status.
 * Returns only when the tool must run (a negative errno): nothing was
 * written yet, or outputs the tool then writes again. Otherwise exits. */
static int replay(const struct run *r, const struct record *x, struct kc_counters *c)
{
    if ((int)x->n_files != r->n_outputs)
        return -EINVAL;
    for (int k = 0; k < r->n_outputs; k++) {
        if (x->file[k].wrote)
            continue;
        /* The tool failed before writing: an output there now would be
         * the tool's to keep or remove, which the record does not say. */
        struct stat st;
        if (lstat(r->outputs[k], &st) == 0)
            return -EEXIST;
        /* A failure is the input's only where the output could have been
         * written (stored so): else the tool's own error is another. */
        if (!kc__tool_output_dir_writable(r->outputs[k]))
            return -EACCES;
    }
    for (int k = 0; k < r->n_outputs; k++) {
        if (!x->file[k].wrote)
            continue;
        struct kc_buf b = {0};
        int rc = put_names(r, &x->file[k], &b);
        if (rc == 0)
            rc = kc__tool_output_write(r->outputs[k], &b, true); /* O_TRUNC, in place */
        kc_buf_free(&b);
        if (rc != 0)
            return rc;
    }
    c->hits = 1;
    kc__count(BACKEND, c);
    (void)kc__write_full(STDOUT_FILENO, x->out.p, x->out.len);
    (void)kc__write_full(STDERR_FILENO, x->err.p, x->err.len);
    kc__exit(x->status);
}

/* ---- a miss: the tool runs as a child, watched ----------------------------------------- */

static pid_t child_pid = -1;

/* Set once a signal was passed on to the tool: a tool that catches it
 * (cicc exits 4 on SIGTERM) ends as a failure that is no compile's. */
static volatile sig_atomic_t forwarded;

static void forward(int sig)
{
    forwarded = 1;
    if (child_pid > 0)
        kill(child_pid, sig);
}

/* In the child: what it opened, handed to the parent at exit. */
static struct kc__deps child_deps;
static int report_fd = -1;

static void child_report(void)
{
    kc__deps_end_process(); /* no thread adds to child_deps from here */
    struct kc_buf b = {0};
    kc_buf_put_u8(&b, child_deps.failed || child_deps.unkeyable);
    kc_buf_put_u64(&b, child_deps.n);
    for (size_t i = 0; i < child_deps.n; i++) {
        kc_buf_put_u8(&b, (uint8_t)child_deps.v[i].kind);
        kc_buf_put_u64(&b, strlen(child_deps.v[i].path));
        kc_buf_add(&b, child_deps.v[i].path, strlen(child_deps.v[i].path));
    }
    if (!b.err)
        (void)kc__write_full(report_fd, b.p, b.len);
    kc_buf_free(&b);
    close(report_fd);
}

/* Whether the run named `path` as output k's path (the same string, or
 * the same inode); -1 when none. */
static int output_index(const struct run *r, const char *path)
{
    for (int k = 0; k < r->n_outputs; k++)
        if (kc__tool_same_path(path, r->outputs[k]))
            return k;
    return -1;
}

/* Whether `path` is the working directory. */
static bool is_cwd(const char *path)
{
    struct stat a, b;
    return stat(path, &a) == 0 && stat(".", &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* Checks the child's report: it opened its inputs and its outputs, and
 * nothing else that decides an output (a file of the tool's inert list;
 * the working directory looked at; a scratch file it made and removed).
 * Returns NULL when it did, else what it did (for the log); wrote[k]: output
 * k was opened for writing. */
static const char *report_check(const struct run *r, const struct kc_buf *rep, bool *wrote)
{
    struct kc_rd rd;
    kc_rd_init(&rd, rep->p, rep->len);
    if (rep->len == 0)
        return "the run left no report";
    if (kc_rd_get_u8(&rd) != 0)
        return "the run could not be followed";
    uint64_t n = kc_rd_get_u64(&rd);
    const char *bad = NULL;
    for (int k = 0; k < r->n_outputs; k++)
        wrote[k] = false;
    for (uint64_t i = 0; i < n && bad == NULL; i++) {
        int kind = kc_rd_get_u8(&rd);
        uint64_t len = kc_rd_get_u64(&rd);
        if (len > kc_rd_left(&rd) || len >= PATH_MAX)
            return "a bad report";
        char path[PATH_MAX];
        memcpy(path, kc_rd_take(&rd, (size_t)len), (size_t)len);
        path[len] = '\0';
        if (kind == KC_DEP_WRITTEN || kind == KC_DEP_CREATED) {
            int k = output_index(r, path);
            struct stat st;
            if (k >= 0)
                wrote[k] = true;
            else if (kind == KC_DEP_CREATED && lstat(path, &st) != 0 && errno == ENOENT)
                continue; /* made by the run, gone by its end: scratch */
            else {
                bad = "it wrote a file other than its outputs";
                kc_log(KC_LOG_DEBUG, "%s: %s (%s)", r->tool->id, bad, path);
            }
            continue;
        }
        bool known = false;
        for (int k = 0; k < r->n_outputs && !known; k++)
            known = strcmp(path, r->outputs[k]) == 0;
        for (int k = 0; k < r->n_inputs && !known; k++)
            known = kc__tool_same_path(path, r->inputs[k]);
        for (const char *const *f = r->tool->inert_files; *f != NULL && !known; f++)
            known = strcmp(path, *f) == 0;
        for (int k = 0; k < r->n_places && !known; k++)
            known = strcmp(path, r->places[k]) == 0;
        /* The working directory, and $PWD, which cicc looks at to find it
         * (keyed where an output records it: O_CWD). */
        const char *pwd = getenv("PWD");
        if (!known && kind == KC_DEP_DIR)
            known = is_cwd(path) || (pwd != NULL && strcmp(path, pwd) == 0);
        /* The executable itself (cicc finds its directory): its content
         * is the run's identity. */
        known = known || strcmp(path, "/proc/self/exe") == 0;
        if (!known && kind == KC_DEP_FILE)
            bad = "it read a file other than its inputs";
        else if (!known)
            bad = "it looked for a file other than its inputs";
        if (bad != NULL)
            kc_log(KC_LOG_DEBUG, "%s: %s (%s)", r->tool->id, bad, path);
    }
    if (bad == NULL && kc_rd_end(&rd) != 0)
        return "a bad report";
    return bad;
}

/* Runs the tool in a child and waits for it, copying its streams through.
 * Returns in the child (0: the tool's main runs next). In this process,
 * exits with the child's status once it is stored (or not). */
static int supervise(const struct run *r, bool merged, struct kc_store *st,
                     const struct kc_store_ops *api, const char *ns, const kc_key *key, int flight,
                     bool rheld, struct kc_counters *c)
{
    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, rep[2] = {-1, -1};
    pid_t parent = getpid(), pid = -1;
    if (pipe2(outp, O_CLOEXEC) == 0 && (merged || pipe2(errp, O_CLOEXEC) == 0) &&
        pipe2(rep, O_CLOEXEC) == 0) {
        fflush(NULL);
        pid = fork();
    }
    if (pid < 0) {
        int e = errno;
        int all[] = {outp[0], outp[1], errp[0], errp[1], rep[0], rep[1]};
        for (int i = 0; i < 6; i++)
            if (all[i] >= 0)
                close(all[i]);
        return -e;
    }
    if (pid == 0) {
        /* The child: the tool. It dies with this process. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        kc__flight_release(flight); /* the parent's to hold; this is a copy */
        dup2(outp[1], STDOUT_FILENO);
        dup2(merged ? outp[1] : errp[1], STDERR_FILENO);
        close(outp[0]);
        close(outp[1]);
        if (!merged) {
            close(errp[0]);
            close(errp[1]);
        }
        close(rep[0]);
        report_fd = rep[1];
        kc__tool_child();
        kc__deps_begin_process(&child_deps);
        atexit(child_report);
        return 0;
    }
    /* This process: the tool's streams copied through and kept. */
    close(outp[1]);
    if (!merged)
        close(errp[1]);
    close(rep[1]);
    child_pid = pid;
    struct sigaction sa = {.sa_handler = forward}, old[4];
    sigemptyset(&sa.sa_mask);
    const int fwd[4] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    for (int i = 0; i < 4; i++)
        sigaction(fwd[i], &sa, &old[i]);
    signal(SIGPIPE, SIG_IGN);
    struct record x = {.merged = merged};
    struct kc_buf report = {0};
    struct kc__capture cap[3] = {{outp[0], STDOUT_FILENO, &x.out, false},
                                 {merged ? -1 : errp[0], STDERR_FILENO, &x.err, false},
                                 {rep[0], -1, &report, false}};
    uint64_t t0 = kc_mono_ns();
    char buf[65536];
    bool out_broken = false, err_broken = false;
    kc__tool_pump(pid, cap, 3, &out_broken, &err_broken);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    uint64_t took = kc_mono_ns() - t0;
    for (int i = 0; i < 4; i++)
        sigaction(fwd[i], &old[i], NULL);
    child_pid = -1;

    const char *why_not = NULL;
    bool wrote[MAX_OUT] = {false};
    int n_wrote = 0;
    if (!WIFEXITED(ws))
        why_not = "the tool was killed";
    else if (forwarded)
        why_not = "it was sent a signal";
    else if (cap[0].over || cap[1].over || x.out.err || x.err.err || report.err)
        why_not = "its output was too large to keep";
    else if (out_broken || err_broken)
        why_not = "its standard streams could not be written";
    else
        why_not = report_check(r, &report, wrote);
    for (int k = 0; k < r->n_outputs; k++) {
        /* An output opened and gone by the end (cicc removes its outputs
         * when it fails) is none: a replay then finds none there, or
         * leaves the run to the tool. */
        struct stat ost;
        if (wrote[k] && lstat(r->outputs[k], &ost) != 0 && errno == ENOENT)
            wrote[k] = false;
        n_wrote += wrote[k];
    }
    if (why_not == NULL) {
        x.status = WEXITSTATUS(ws);
        if (x.status == 0 && n_wrote < r->n_outputs)
            why_not = "it exited without writing its outputs";
        else if (x.status != 0 && n_wrote > 0)
            why_not = "it failed after writing an output";
        for (int k = 0; k < r->n_outputs && why_not == NULL && x.status != 0; k++)
            if (!kc__tool_output_dir_writable(r->outputs[k]))
                why_not = "it failed where its output could not be written";
    }
    x.n_files = (uint32_t)r->n_outputs;
    for (int k = 0; k < r->n_outputs && why_not == NULL && n_wrote > 0; k++) {
        struct outfile *f = &x.file[k];
        f->wrote = 1;
        int fd = open(r->outputs[k], O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        struct stat fst;
        if (fd < 0 || fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode))
            why_not = "its output is not a regular file";
        else {
            for (;;) {
                ssize_t got = read(fd, buf, sizeof buf);
                if (got < 0 && errno == EINTR)
                    continue;
                if (got < 0)
                    why_not = "its output could not be read";
                if (got <= 0)
                    break;
                kc_buf_add(&f->bytes, buf, (size_t)got);
            }
            if (f->bytes.err)
                why_not = "its output was too large to keep";
        }
        if (fd >= 0)
            close(fd);
        if (why_not == NULL)
            why_not = cut_names(r, k, f);
    }
    c->misses = 1;
    c->compile_ns = took;
    size_t stored_len = 0;
    if (why_not == NULL && st != NULL && !kc__config()->readonly) {
        struct kc_buf b = {0};
        int prc = record_encode(&x, &b) == 0
                      ? api->put(st, ns, key, NULL, KC_KIND_BLOB, b.p, b.len, took)
                      : -ENOMEM;
        if (prc == 0) {
            c->stores = 1;
            stored_len = b.len;
        } else if (prc != -EDQUOT) {
            c->errors = 1;
            kc_log_once(KC_LOG_WARN, "cannot store a %s run (%s)", r->tool->id, strerror(-prc));
        }
        kc_buf_free(&b);
    } else if (why_not != NULL) {
        kc_log(KC_LOG_DEBUG, "%s run not stored: %s", r->tool->id, why_not);
    }
    if (st != NULL && !kc__config()->readonly)
        why_record(r, key, c->stores ? NULL : why_not ? why_not : "not stored", took);
    /* The cluster's waiters are served once the owner uploads it. */
    kc__flight_remote_release(ns, key, rheld, c->stores != 0, stored_len);
    kc__flight_release(flight);
    record_free(&x);
    kc_buf_free(&report);
    kc__count(BACKEND, c);
    if (WIFSIGNALED(ws)) {
        /* Die as the tool died, so that the caller sees the same status. */
        int sig = WTERMSIG(ws);
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        kill(getpid(), sig);
        _exit(128 + sig);
    }
    kc__exit(WIFEXITED(ws) ? WEXITSTATUS(ws) : 1);
}

/* ---- the entry ------------------------------------------------------------------------- */

struct lookup {
    struct kc_store *st;
    const struct kc_store_ops *api;
    const char *ns;
    const kc_key *key;
    struct kc_counters *c;
    const struct tool *t;
    struct record x; /* what a lookup found */
};

/* Looks the run up in the chain (the remote too): 1 when found (in
 * l->x), 0 when not (a record that does not parse is purged). Also
 * kc__flight_remote's poll. */
static int lookup_once(void *arg)
{
    struct lookup *l = arg;
    void *body = NULL;
    size_t len = 0;
    struct kc_record_info info = {0};
    if (l->api->get(l->st, l->ns, l->key, &body, &len, &info) != 0)
        return 0;
    int drc = record_decode(body, len, &l->x);
    l->api->free(body);
    if (drc != 0) {
        kc_log(KC_LOG_WARN, "a cached %s run could not be read; running it", l->t->id);
        l->api->purge(l->st, l->ns, l->key);
        l->c->errors++;
        return 0;
    }
    l->c->saved_ns = info.saved_ns;
    return 1;
}

static void pass(struct kc_counters *c, int why)
{
    kc__pass_reason(BACKEND, (enum kc_pass_reason)why);
    c->passthrough = 1;
    kc__count(BACKEND, c);
}

/* The tool's namespace: "tool:<id>-<16 hex digits of its identity>-f2". */
static void tool_ns(const struct tool *t, const kc_digest *id, char *ns, size_t n)
{
    char hex[33];
    kc__digest_hex(id, hex);
    snprintf(ns, n, "tool:%s-%.16s-f2", t->id, hex);
}

void kc__tool_start(int argc, char **argv)
{
    const struct tool *t = argc > 0 && argv != NULL ? tool_named(argv[0]) : NULL;
    if (t == NULL)
        return;
    const struct kc_config *cfg = kc__config();
    if (cfg->disable || !cfg->tools)
        return;
    struct kc_counters c = {0};
    struct run r = {.tool = t, .argc = argc, .argv = argv};
    int why = parse(&r);
    if (why >= 0) {
        pass(&c, why);
        run_free(&r);
        return;
    }
    /* The store first (its directory made, before the memo below goes
     * into it); without one the tool runs as it is. */
    const struct kc_store_ops *api = NULL;
    struct kc_store *st = kc__store(&api);
    if (st == NULL) {
        run_free(&r);
        return;
    }
    /* The executable's identity: its build-id, else its contents. */
    kc_digest id;
    if (kc__tool_identity(cfg, &id) != 0) {
        pass(&c, KC_PASS_internal);
        run_free(&r);
        return;
    }
    /* A closed standard stream would be taken by the pipes of a watched
     * run: such a run is left to the tool. */
    if (fcntl(STDOUT_FILENO, F_GETFD) < 0 || fcntl(STDERR_FILENO, F_GETFD) < 0) {
        pass(&c, KC_PASS_input);
        run_free(&r);
        return;
    }
    bool merged = kc__tool_same_stream(STDOUT_FILENO, STDERR_FILENO);
    kc_digest kd;
    why = run_key(&r, &id, merged, &kd);
    if (why >= 0) {
        pass(&c, why);
        run_free(&r);
        return;
    }
    char ns[96];
    tool_ns(t, &id, ns, sizeof ns);
    kc_key key = {.id = kd, .build = kc__self_build()};
    struct lookup lk = {st, api, ns, &key, &c, t, {0}};
    int flight = -1;
    bool rheld = false, found = false;
    for (int round = 0; !cfg->recache && round < 2 && !found; round++) {
        found = lookup_once(&lk) == 1;
        if (!found && round == 0) {
            /* Single flight: one process runs a missed key, the others
             * wait for it and are served its result; then one node of
             * those that share a remote. */
            bool waited = false;
            flight = kc__flight_acquire(&kd, &waited);
            if (flight < 0 && !waited)
                break;
        }
    }
    if (!found && !cfg->recache)
        found = kc__flight_remote(ns, &key, lookup_once, &lk, &rheld) == 1;
    if (found) {
        kc__flight_release(flight);
        int rrc = replay(&r, &lk.x, &c); /* exits on success */
        record_free(&lk.x);
        kc_log(KC_LOG_DEBUG, "a cached %s run cannot be replayed here (%s); running it", t->id,
               strerror(-rrc));
        pass(&c, rrc == -EEXIST ? KC_PASS_order : KC_PASS_input);
        run_free(&r);
        return;
    }
    if (supervise(&r, merged, st, api, ns, &key, flight, rheld, &c) != 0) {
        /* No child could be made: the tool runs here, unwatched. */
        kc__flight_remote_release(ns, &key, rheld, false, 0);
        kc__flight_release(flight);
        pass(&c, KC_PASS_internal);
    }
    run_free(&r);
}
