/* bench/cpu_baseline.c: the plain C loop the CPU device's saxpy is held to (issue 29: "a
   kernel without __syncthreads ≤ 2x a plain C loop over the same data on the same cores").
   y = a*x + y over 2^24 floats, split in equal slices over T threads (T: CUDALUA_CPU_THREADS,
   else the CPUs online, as the CPU device's pool), best of 20 rounds after a warm-up.
   Prints "cpu_saxpy_c_ms <ms>". Build: cc -O2 -pthread bench/cpu_baseline.c */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define N (1 << 24)
static float *x, *y;
static int T;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static void *slice(void *arg) {
  long k = (long)arg;
  size_t lo = (size_t)N * k / T, hi = (size_t)N * (k + 1) / T;
  for (size_t i = lo; i < hi; i++) y[i] = 2.5f * x[i] + y[i];
  return NULL;
}

/* threads made for each round, as the pool's wake-up is part of the CPU device's time too */
static double round_ms(void) {
  pthread_t th[1024];
  double t0 = now_ms();
  for (long k = 1; k < T; k++) pthread_create(&th[k], NULL, slice, (void *)k);
  slice((void *)0);
  for (long k = 1; k < T; k++) pthread_join(th[k], NULL);
  return now_ms() - t0;
}

int main(void) {
  const char *e = getenv("CUDALUA_CPU_THREADS");
  T = e && atoi(e) > 0 ? atoi(e) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (T > 1024) T = 1024;
  x = aligned_alloc(256, sizeof(float) * N), y = aligned_alloc(256, sizeof(float) * N);
  for (size_t i = 0; i < N; i++) x[i] = (float)(i % 1000) * 0.001f, y[i] = 1.0f;
  double best = 1e30;
  round_ms();
  for (int r = 0; r < 20; r++) {
    double ms = round_ms();
    if (ms < best) best = ms;
  }
  printf("info_cpu_threads %d\ncpu_saxpy_c_ms %.3f\n", T, best);
  return y[N / 2] > 0 ? 0 : 1;   /* (keeps the loop's result used) */
}
