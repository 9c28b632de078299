/* deps.c: being written */
#include "shim.h"
