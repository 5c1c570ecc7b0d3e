/* Times every cblas_sgemm call of a process, per shape, and prints the totals at exit: what the
 * GEMMs cost inside a real run (cold operands, the passes between them), which a hot-loop
 * microbenchmark of the same shapes does not show. Preloaded, so nothing is rebuilt:
 *
 *   gcc -O2 -shared -fPIC scripts/sgemm_timing.c -o /tmp/sgemm_timing.so -ldl
 *   LD_PRELOAD=/tmp/sgemm_timing.so build/bin/gpt train ... --threads 1
 *
 * stderr, at exit: per (transposes, m, n, k) as cblas_sgemm received them (row-major: "NT" is
 * A times B transposed, a Linear's forward), the calls, their total time and GFLOP/s, shapes under
 * a million multiply-adds left out of the list but not of the total. Single-threaded callers only
 * (no locking); one clock read either side of each call. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                         int);

struct shape_time {
  int trans_a, trans_b, m, n, k;
  long calls;
  double seconds;
};

enum { kMaxShapes = 256, kCblasTrans = 112 };
static struct shape_time shapes[kMaxShapes];
static int shape_count;
static sgemm_fn real_sgemm;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void report(void) {
  double seconds = 0.0, flops = 0.0;
  for (int i = 0; i < shape_count; ++i) {
    const struct shape_time* s = &shapes[i];
    const double f = 2.0 * s->m * s->n * s->k * (double)s->calls;
    if ((double)s->m * s->n * s->k >= 1e6)
      fprintf(stderr, "sgemm %c%c m=%5d n=%5d k=%5d calls=%6ld %9.1f ms %6.1f GFLOP/s\n",
              s->trans_a == kCblasTrans ? 'T' : 'N', s->trans_b == kCblasTrans ? 'T' : 'N', s->m, s->n, s->k,
              s->calls, s->seconds * 1e3, f / s->seconds / 1e9);
    seconds += s->seconds;
    flops += f;
  }
  fprintf(stderr, "sgemm total %.1f ms, %.1f GFLOP/s\n", seconds * 1e3, seconds > 0 ? flops / seconds / 1e9 : 0.0);
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  if (real_sgemm == NULL) {
    real_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    atexit(report);
  }
  const double start = now();
  real_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const double seconds = now() - start;
  int i = 0;
  while (i < shape_count && !(shapes[i].trans_a == trans_a && shapes[i].trans_b == trans_b && shapes[i].m == m &&
                              shapes[i].n == n && shapes[i].k == k))
    ++i;
  if (i == shape_count) {
    if (shape_count == kMaxShapes) return;  /* more shapes than slots: the rest go uncounted */
    shapes[shape_count++] = (struct shape_time){trans_a, trans_b, m, n, k, 0, 0.0};
  }
  shapes[i].calls += 1;
  shapes[i].seconds += seconds;
}
