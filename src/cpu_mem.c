/* cpu_mem.c: the CPU device's memory. Device, pinned, mapped and managed memory are all host
   memory, aligned as cudaMalloc's (256 bytes); a sorted table of the blocks answers what a
   pointer belongs to (cuPointerGetAttribute, cuMemGetAddressRange). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_dev.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cpu_block *blocks;
static size_t nblocks, cap, used;

/* the first block whose base is above p */
static size_t above(uintptr_t p) {
  size_t lo = 0, hi = nblocks;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (blocks[mid].base <= p) lo = mid + 1; else hi = mid;
  }
  return lo;
}

CUresult cpu_alloc(void **p, size_t n, int kind) {
  size_t size = n ? (n + 255) / 256 * 256 : 256;
  void *m = aligned_alloc(256, size);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  if (nblocks == cap) {
    size_t nc = cap ? cap * 2 : 64;
    cpu_block *nb = realloc(blocks, nc * sizeof *nb);
    if (!nb) { pthread_mutex_unlock(&lock); free(m); return CUDA_ERROR_OUT_OF_MEMORY; }
    blocks = nb, cap = nc;
  }
  size_t i = above((uintptr_t)m);
  memmove(blocks + i + 1, blocks + i, (nblocks - i) * sizeof *blocks);
  blocks[i] = (cpu_block){(uintptr_t)m, n ? n : 1, kind};
  nblocks++;
  used += size;
  pthread_mutex_unlock(&lock);
  *p = m;
  return CUDA_SUCCESS;
}

CUresult cpu_free(void *p) {
  if (!p) return CUDA_SUCCESS;
  pthread_mutex_lock(&lock);
  size_t i = above((uintptr_t)p);
  if (i == 0 || blocks[i - 1].base != (uintptr_t)p) { pthread_mutex_unlock(&lock); return CUDA_ERROR_INVALID_VALUE; }
  used -= (blocks[i - 1].size + 255) / 256 * 256;
  memmove(blocks + i - 1, blocks + i, (nblocks - i) * sizeof *blocks);
  nblocks--;
  pthread_mutex_unlock(&lock);
  free(p);
  return CUDA_SUCCESS;
}

int cpu_find(uintptr_t p, cpu_block *out) {
  pthread_mutex_lock(&lock);
  size_t i = above(p);
  int ok = i > 0 && p < blocks[i - 1].base + blocks[i - 1].size;
  if (ok) *out = blocks[i - 1];
  pthread_mutex_unlock(&lock);
  return ok;
}

size_t cpu_mem_used(void) {
  pthread_mutex_lock(&lock);
  size_t u = used;
  pthread_mutex_unlock(&lock);
  return u;
}
