"""compare.py: what CuPy and Numba take for the launches of bench/raw.c and bench/core.lua
(the empty kernel, the 4-argument kernel), and CuPy for the 256 MiB copies. Same method: N
back-to-back launches on one stream then a synchronize, median of REPS repetitions. Prints one
"key value" line per measurement; a library that is missing or fails is reported and skipped.

Env: BENCH_LAUNCHES (default 100000), BENCH_REPS (default 5), BENCH_NUMBA_LAUNCHES (default
10000, with 3 repetitions: Numba's launches are slow enough that N of them, REPS times, would
take most of the time budget).
"""
import os
import statistics
import sys
import time
import traceback

# Numba warns about 1-block grids on every new launch site; the launches here are meant small
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

N = int(os.environ.get("BENCH_LAUNCHES", "100000"))
REPS = int(os.environ.get("BENCH_REPS", "5"))
N_NUMBA = int(os.environ.get("BENCH_NUMBA_LAUNCHES", "10000"))
COPY_BYTES = 256 << 20

# the same kernels as bench/raw.c and bench/core.lua
KSRC = ('extern "C" __global__ void empty() {}\n'
        'extern "C" __global__ void four(float *a, const float *b, int n, double s) {}\n')


def out(key, value):
    print(f"{key} {value:.4f}", flush=True)


def note(msg):
    print(f"# {msg}", flush=True)


def per_launch(body, sync, n, reps=REPS):
    """median µs per launch of body(n) (n launches) followed by sync()"""
    body(min(n, 1000))
    sync()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        body(n)
        sync()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def bandwidth(copy, sync):
    copy()
    sync()
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        copy()
        sync()
        times.append(COPY_BYTES / (time.perf_counter() - t0) / 1e9)
    return statistics.median(times)


def bench_cupy():
    try:
        import numpy as np
        import cupy as cp
        import cupyx
    except Exception as e:  # noqa: BLE001
        note(f"cupy unavailable: {e!r}")
        return
    try:
        note(f"cupy {cp.__version__}")
        mod = cp.RawModule(code=KSRC)
        empty, four = mod.get_function("empty"), mod.get_function("four")
        a = cp.zeros(1024, dtype=cp.float32)
        b = cp.zeros(1024, dtype=cp.float32)
        args4 = (a, b, np.int32(1024), np.float64(2.5))
        sync = cp.cuda.Device().synchronize
        grid, block = (1,), (1,)

        def launch_empty(m):
            for _ in range(m):
                empty(grid, block, ())

        def launch_four(m):
            for _ in range(m):
                four(grid, block, args4)

        out("cupy_launch_empty_us", per_launch(launch_empty, sync, N))
        out("cupy_launch_four_us", per_launch(launch_four, sync, N))

        # 1 MiB device alloc + free (CuPy's memory pool; freed when the last reference goes)
        def alloc_free(m):
            for _ in range(m):
                x = cp.empty(1 << 20, dtype=cp.uint8)
                del x

        out("cupy_alloc_free_us", per_launch(alloc_free, sync, N))

        nel = COPY_BYTES // 4
        d = cp.empty(nel, dtype=cp.float32)
        pinned = cupyx.empty_pinned((nel,), dtype=np.float32)
        pinned[:] = 1
        pageable = np.ones(nel, dtype=np.float32)
        out("cupy_h2d_pinned_gbs", bandwidth(lambda: d.set(pinned), sync))
        out("cupy_d2h_pinned_gbs", bandwidth(lambda: d.get(out=pinned), sync))
        out("cupy_h2d_pageable_gbs", bandwidth(lambda: d.set(pageable), sync))
        out("cupy_d2h_pageable_gbs", bandwidth(lambda: d.get(out=pageable), sync))
    except Exception:  # noqa: BLE001
        note("cupy failed: " + traceback.format_exc().replace("\n", " | "))


def bench_numba():
    try:
        import numpy as np
        if not hasattr(np, "row_stack"):  # the numba-cuda there predates numpy 2.5
            np.row_stack = np.vstack
        from numba import cuda
    except Exception as e:  # noqa: BLE001
        note(f"numba unavailable: {e!r}")
        return
    try:
        import numba
        note(f"numba {numba.__version__}")

        @cuda.jit("void()")
        def empty():
            pass

        @cuda.jit("void(float32[:], float32[:], int32, float64)")
        def four(a, b, n, s):
            pass

        a = cuda.device_array(1024, dtype=np.float32)
        b = cuda.device_array(1024, dtype=np.float32)
        n, s = np.int32(1024), np.float64(2.5)
        sync = cuda.synchronize

        def launch_empty(m):
            for _ in range(m):
                empty[1, 1]()

        def launch_empty_cfg(m):
            k = empty[1, 1]
            for _ in range(m):
                k()

        def launch_four(m):
            for _ in range(m):
                four[1, 1](a, b, n, s)

        def launch_four_cfg(m):
            k = four[1, 1]
            for _ in range(m):
                k(a, b, n, s)

        out("numba_launch_empty_us", per_launch(launch_empty, sync, N_NUMBA, 3))
        out("numba_launch_empty_cfg_us", per_launch(launch_empty_cfg, sync, N_NUMBA, 3))
        out("numba_launch_four_us", per_launch(launch_four, sync, N_NUMBA, 3))
        out("numba_launch_four_cfg_us", per_launch(launch_four_cfg, sync, N_NUMBA, 3))

        # 1 MiB device alloc + free (Numba's default memory manager: cuMemAlloc, frees deferred)
        def alloc_free(m):
            for _ in range(m):
                x = cuda.device_array(1 << 20, dtype=np.uint8)
                del x

        out("numba_alloc_free_us", per_launch(alloc_free, sync, max(N_NUMBA // 5, 1), 3))
    except Exception:  # noqa: BLE001
        note("numba failed: " + traceback.format_exc().replace("\n", " | "))


if __name__ == "__main__":
    which = sys.argv[1:] or ["cupy", "numba"]
    if "cupy" in which:
        bench_cupy()
    if "numba" in which:
        bench_numba()
