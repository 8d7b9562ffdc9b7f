#include <stdio.h>
int cuslice_test_fn(void);
int main(void) {
    printf("R value=%d\n", cuslice_test_fn());
    return 0;
}
