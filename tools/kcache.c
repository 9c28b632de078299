/* kcache.c: being written */
#include <stdio.h>
int main(void) { fprintf(stderr, "kcache: not yet\n"); return 1; }
