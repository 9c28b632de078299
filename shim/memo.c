/* memo.c: being written */
#include "shim.h"
