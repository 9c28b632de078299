/*
 * exec_client: one NVRTC compile, for tests/security/test_exec.py.
 *
 * Usage: exec_client [--chdir DIR | --no-compile]
 *
 * Changes the working directory to DIR (when given) before the first NVRTC
 * call, compiles a small kernel, and prints "rc=<code>" and the PTX on
 * stdout, so runs with and without the kcache shim compare byte for byte.
 * stderr gets one line "exec_client: secure=<AT_SECURE>", which tells the
 * test whether the process ran in secure-execution mode. With --no-compile
 * it exits after that line, having called no NVRTC function (a process
 * that never reaches a hook).
 *
 * Built twice: linked against libnvrtc (the shim comes in by LD_PRELOAD),
 * and linked against libkcache.so ahead of libnvrtc, with an absolute rpath,
 * for a set-user-ID copy (a secure-execution process ignores LD_PRELOAD
 * paths; this is how /etc/ld.so.preload reaches it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <nvrtc.h>

static const char source[] =
    "extern \"C\" __global__ void exec_axpy(float a, const float *x, float *y, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        y[i] = a * x[i] + y[i];\n"
    "}\n";

int main(int argc, char **argv)
{
    fprintf(stderr, "exec_client: secure=%lu\n", getauxval(AT_SECURE));
    if (argc == 3 && strcmp(argv[1], "--chdir") == 0) {
        if (chdir(argv[2]) != 0) {
            perror("exec_client: chdir");
            return 2;
        }
    } else if (argc == 2 && strcmp(argv[1], "--no-compile") == 0) {
        return 0;
    } else if (argc != 1) {
        fprintf(stderr, "usage: exec_client [--chdir DIR | --no-compile]\n");
        return 2;
    }
    nvrtcProgram prog;
    nvrtcResult rc = nvrtcCreateProgram(&prog, source, "exec_axpy.cu", 0, NULL, NULL);
    if (rc != NVRTC_SUCCESS) {
        printf("create rc=%d\n", (int)rc);
        return 1;
    }
    rc = nvrtcCompileProgram(prog, 0, NULL);
    printf("rc=%d\n", (int)rc);
    size_t n = 0;
    if (rc == NVRTC_SUCCESS && nvrtcGetPTXSize(prog, &n) == NVRTC_SUCCESS) {
        char *ptx = malloc(n + 1);
        if (ptx != NULL && nvrtcGetPTX(prog, ptx) == NVRTC_SUCCESS)
            fwrite(ptx, 1, n, stdout);
        free(ptx);
    }
    nvrtcDestroyProgram(&prog);
    return fflush(stdout) == 0 ? 0 : 1;
}
