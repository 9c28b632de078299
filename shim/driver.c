/* driver.c: being written */
#include "shim.h"
const struct kc__hook kc__driver_hooks[] = {{0}};
