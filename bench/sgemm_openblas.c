/* OpenBLAS side of bench/compare.py: GFLOP/s of single-threaded cblas_sgemm in
 * the forward layout (C = A . B^T, row-major), n x n x n, and the kernel
 * OpenBLAS picked. Built and run by compare.py; not part of the library. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

char *openblas_get_corename(void);
void openblas_set_num_threads(int);

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  openblas_set_num_threads(1);
  printf("{\"core\":\"%s\",\"results\":[", openblas_get_corename());
  for (int i = 1; i < argc; i++) {
    int n = atoi(argv[i]);
    float *a = malloc((size_t)n * n * 4), *b = malloc((size_t)n * n * 4),
          *c = malloc((size_t)n * n * 4);
    if (!a || !b || !c) return 1;
    for (size_t k = 0; k < (size_t)n * n; k++) {
      a[k] = (float)(k % 17) * 0.1f;
      b[k] = (float)(k % 13) * 0.05f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    int reps = 0;
    double t0 = now_s(), el;
    do {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                  n);
      reps++;
      el = now_s() - t0;
    } while (el < 0.3);
    printf("%s{\"n\":%d,\"gflops\":%.2f}", i > 1 ? "," : "", n, 2.0 * n * n * (double)n * reps / el / 1e9);
    free(a);
    free(b);
    free(c);
  }
  printf("]}\n");
  return 0;
}
