/* hash.c: being written */
#include "shim.h"
