/* shim.c: being written */
#include "shim.h"
