/* cpu_mem.c: the CPU device's memory. Device, pinned, mapped and managed memory are all host
   memory, aligned as cudaMalloc's (256 bytes); a sorted table of the blocks answers what a
   pointer belongs to (cuPointerGetAttribute, cuMemGetAddressRange). Under CUDALUA_CPU_CHECK each
   block ends where an inaccessible page begins, so that a kernel reading or writing past its
   end faults (cpu_exec.c names the block); its start is then aligned to the largest power of
   two up to 256 that divides its size, so the end is exact for any element size. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
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

int cpu_check_on(void) {
  static int on = -1;
  if (on < 0) {
    const char *c = getenv("CUDALUA_CPU_CHECK");
    on = c && *c && strcmp(c, "0") != 0;
  }
  return on;
}

/* n bytes ending at a PROT_NONE page; *map, *maplen: the mapping to unmap */
static void *guarded(size_t n, void **map, size_t *maplen) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), align = n ? n & -n : 256;
  if (align > 256) align = 256;
  size_t len = (n + page - 1) / page * page + page;
  if (len < n) return NULL;
  char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return NULL;
  char *guard = m + len - page;
  if (mprotect(guard, page, PROT_NONE)) { munmap(m, len); return NULL; }
  *map = m, *maplen = len;
  return (void *)(((uintptr_t)guard - n) & ~(uintptr_t)(align - 1));
}

CUresult cpu_alloc(void **p, size_t n, int kind) {
  size_t size = n ? (n + 255) / 256 * 256 : 256, maplen = 0;
  void *map = NULL, *m = cpu_check_on() ? guarded(n, &map, &maplen) : aligned_alloc(256, size);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  if (nblocks == cap) {
    size_t nc = cap ? cap * 2 : 64;
    cpu_block *nb = realloc(blocks, nc * sizeof *nb);
    if (!nb) {
      pthread_mutex_unlock(&lock);
      if (map) munmap(map, maplen); else free(m);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    blocks = nb, cap = nc;
  }
  size_t i = above((uintptr_t)m);
  memmove(blocks + i + 1, blocks + i, (nblocks - i) * sizeof *blocks);
  blocks[i] = (cpu_block){(uintptr_t)m, n ? n : 1, kind, map, maplen};
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
  cpu_block b = blocks[i - 1];
  used -= (b.size + 255) / 256 * 256;
  memmove(blocks + i - 1, blocks + i, (nblocks - i) * sizeof *blocks);
  nblocks--;
  pthread_mutex_unlock(&lock);
  if (b.map) munmap(b.map, b.maplen); else free(p);
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

/* the guarded block whose end p lies just past (on its guard page) */
int cpu_find_past(uintptr_t p, cpu_block *out) {
  pthread_mutex_lock(&lock);
  size_t i = above(p);
  int ok = i > 0 && blocks[i - 1].map && p >= blocks[i - 1].base + blocks[i - 1].size &&
           p < (uintptr_t)blocks[i - 1].map + blocks[i - 1].maplen;
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
