/* An empty shared object: something harmless to put in LD_PRELOAD. */
int kc_tool_test_dummy(void);
int kc_tool_test_dummy(void)
{
    return 0;
}
