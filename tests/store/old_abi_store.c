/*
 * A store library of ABI 1, the table before the data path and the
 * administration were split (test_tier_abi.py): its kc_store_api() answers
 * a table whose first member, the ABI, is 1. The shim must refuse it
 * without reading any other member.
 */
struct old_table {
    int abi;
};

static const struct old_table table = {1};

const struct old_table *kc_store_api(void)
{
    return &table;
}
