/* store.c: being written */
#include "store.h"
#define KC_API __attribute__((visibility("default")))
static const struct kc_store_api api = {.abi = KC_STORE_ABI};
KC_API const struct kc_store_api *kc_store_api(void) { return &api; }
