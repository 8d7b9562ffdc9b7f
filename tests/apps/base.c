/* libbase.so: the definition an interposer chains to with RTLD_NEXT. */
int cuslice_test_fn(void) { return 42; }
