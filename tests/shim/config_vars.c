/*
 * kc-config-vars: prints the configuration table (common/config.c
 * kc_config_vars), one variable a line: "NAME KIND VALUE", KIND one of
 * setting, internal, harness, and VALUE what kc_config_get answers for it
 * ("(unset)" for NULL; "-" for a harness entry, which kcache never reads),
 * after a first line "secure N": getauxval(AT_SECURE), which tells whether
 * the process runs in secure-execution mode. For test_config_table.py,
 * which also runs it set-user-ID.
 */
#include "config.h"

#include <stdio.h>
#include <sys/auxv.h>

int main(void)
{
    static const char *kinds[] = {"setting", "internal", "harness"};
    printf("secure %lu\n", getauxval(AT_SECURE));
    for (int i = 0; i < kc_config_n_vars; i++) {
        const struct kc_config_var *v = &kc_config_vars[i];
        const char *val = "-";
        if (v->kind != KC_VAR_HARNESS) {
            val = kc_config_get(i);
            if (val == NULL)
                val = "(unset)";
        }
        printf("%s %s %s\n", v->name, kinds[v->kind], val);
    }
    return fflush(stdout) == 0 ? 0 : 1;
}
