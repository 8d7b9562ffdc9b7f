/* A "driver" that has cuInit and cuDriverGetVersion and nothing else: the
 * shim must answer CUDA_ERROR_NOT_FOUND for everything it lacks. */
int cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }
int cuDriverGetVersion(int *v) { *v = 12000; return 0; }
