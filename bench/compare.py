"""compare.py: what CuPy and Numba take for the launches of bench/raw.c and bench/core.lua
(the empty kernel, the 4-argument kernel), and CuPy for the 256 MiB copies. Same method: N
back-to-back launches on one stream then a synchronize, median of REPS repetitions. Prints one
"key value" line per measurement; a library that is missing or fails is reported and skipped.

With the arguments cupy_helpers and numba_helpers it measures the helpers of bench/helpers.lua
instead: reductions (CuPy x.sum(), Numba @cuda.reduce), Numba's forall, its xoroshiro128p RNG
states and the pi kernel written with them, CuPy's captured graph of 1000 empty kernels, and a
launch with a foreign __cuda_array_interface object in Numba.

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


def import_numba_cuda():
    import numpy as np
    if not hasattr(np, "row_stack"):  # the numba-cuda there predates numpy 2.5
        np.row_stack = np.vstack
    from numba import cuda
    return np, cuda


def bench_numba():
    try:
        np, cuda = import_numba_cuda()
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


# ---- the helpers of bench/helpers.lua ----------------------------------------------------------

# "empty" and "bump" as in bench/helpers.lua and bench/raw_helpers.c
HSRC = ('extern "C" __global__ void empty() {}\n'
        'extern "C" __global__ void bump(float *x, int n) {\n'
        '  int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
        '  if (i < n) x[i] += 1.0f;\n'
        '}\n')
BIG = 1 << 28      # float32 elements reduced (1 GiB)
SMALL = 1234       # float64 elements reduced to the host
FORALL_N = 1 << 16
CHAIN = 1000


def forall_block():
    """the block size the occupancy calculator gave bench/raw_helpers.c for bump (else 1024)"""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "raw_helpers.txt")) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k == "diag_forall_block":
                    return int(float(v))
    except OSError:
        pass
    return 1024


def timed_calls(call, m, warm):
    """median µs of m calls of call(), each timed alone, after warm calls"""
    for _ in range(warm):
        call()
    t = []
    for _ in range(m):
        t0 = time.perf_counter()
        call()
        t.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(t)


def section(name, f):
    try:
        f()
    except Exception:  # noqa: BLE001
        note(f"{name} failed: " + traceback.format_exc().replace("\n", " | "))


def bench_cupy_helpers():
    try:
        import numpy as np
        import cupy as cp
    except Exception as e:  # noqa: BLE001
        note(f"cupy unavailable: {e!r}")
        return
    note(f"cupy {cp.__version__}")
    sync = cp.cuda.Device().synchronize
    pool = cp.get_default_memory_pool()

    def reduce_big():
        x = cp.ones(BIG, dtype=cp.float32)
        for _ in range(2):
            v = float(x.sum())
        times = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            v = float(x.sum())
            times.append((time.perf_counter() - t0) * 1e6)
        if abs(v - BIG) > 0.01 * BIG:
            note(f"cupy: sum of 2^28 ones gave {v}")
        us = statistics.median(times)
        out("cupy_reduce_f32_call_us", us)
        out("cupy_reduce_f32_gbs", BIG * 4 / (us * 1e-6) / 1e9)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        K = 20
        times = []
        for _ in range(REPS):
            e0.record()
            for _ in range(K):
                x.sum()
            e1.record()
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / K)
        us = statistics.median(times)
        out("cupy_reduce_f32_kernel_us", us)
        out("cupy_reduce_f32_kernel_gbs", BIG * 4 / (us * 1e-6) / 1e9)
        del x
        sync()
        pool.free_all_blocks()

    def elementwise():
        saxpy = cp.ElementwiseKernel("float32 x, float32 y, float32 a", "float32 z", "z = a * x + y", "saxpy")
        x = cp.full(BIG, 1.5, dtype=cp.float32)
        y = cp.full(BIG, 2, dtype=cp.float32)
        z = cp.empty(BIG, dtype=cp.float32)
        a = np.float32(2.0)
        saxpy(x, y, a, z)
        sync()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        K = 10
        times = []
        for _ in range(REPS * 2):
            e0.record()
            for _ in range(K):
                saxpy(x, y, a, z)
            e1.record()
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) / K)
        if float(z[-1]) != 5.0:
            note(f"cupy: elementwise saxpy gave {float(z[-1])}")
        out("cupy_elementwise_saxpy_gbs", BIG * 12 / (statistics.median(times) * 1e-3) / 1e9)
        del x, y, z
        sync()
        pool.free_all_blocks()

    def reduce_small():
        xs = cp.ones(SMALL, dtype=cp.float64)
        res = []
        us = timed_calls(lambda: res.append(float(xs.sum())), 5000, 500)
        if res[-1] != SMALL:
            note(f"cupy: sum of 1234 ones gave {res[-1]}")
        out("cupy_reduce_small_us", us)

    mod = cp.RawModule(code=HSRC)

    def plain_launch():
        bump = mod.get_function("bump")
        x = cp.zeros(FORALL_N, dtype=cp.float32)
        block = forall_block()
        grid = ((FORALL_N + block - 1) // block,)
        args = (x, np.int32(FORALL_N))

        def body(m):
            for _ in range(m):
                bump(grid, (block,), args)

        out("cupy_forall_plain_us", per_launch(body, sync, N))

    def graphs():
        empty = mod.get_function("empty")
        g1, b1 = (1,), (1,)

        def chain(m):
            for _ in range(m):
                for _ in range(CHAIN):
                    empty(g1, b1, ())

        out("cupy_graph_chain_stream_us", per_launch(chain, sync, 1, REPS * 4) / CHAIN)
        s = cp.cuda.Stream(non_blocking=True)

        def capture():
            with s:
                s.begin_capture()
                for _ in range(CHAIN):
                    empty(g1, b1, ())
                return s.end_capture()   # CuPy instantiates the graph here

        capture()
        times = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            g = capture()
            times.append((time.perf_counter() - t0) * 1e3)
            del g
        out("cupy_graph_build_ms", statistics.median(times))
        g = capture()
        null = cp.cuda.Stream.null
        for _ in range(2):
            g.launch(null)
            sync()
        times = []
        for _ in range(REPS * 4):
            t0 = time.perf_counter()
            g.launch(null)
            sync()
            times.append((time.perf_counter() - t0) / CHAIN * 1e6)
        out("cupy_graph_replay_us", statistics.median(times))

    def host_functions():
        # bench/raw_helpers.c's section 9: cuLaunchHostFunc through CuPy's Stream
        HCHAIN, M = 1000, max(100, N // 50)
        s = cp.cuda.Stream(non_blocking=True)
        calls = [0]

        def bump(arg):
            calls[0] += 1

        def timed(body, per):
            times = []
            for r in range(REPS + 1):
                t0 = time.perf_counter()
                body()
                if r > 0:
                    times.append((time.perf_counter() - t0) / per * 1e6)
            return statistics.median(times)

        def one_by_one():
            for _ in range(M):
                s.launch_host_func(bump, None)
                s.synchronize()

        def hundreds():
            for _ in range(M // 100):
                for _ in range(100):
                    s.launch_host_func(bump, None)
                s.synchronize()

        out("cupy_hostfn_roundtrip_us", timed(one_by_one, M))
        out("cupy_hostfn_batch_us", timed(hundreds, M // 100 * 100))
        # CuPy has no host-node API: the chain is captured (as its test_capture_launch_host_func)
        with s:
            s.begin_capture()
            for _ in range(HCHAIN):
                s.launch_host_func(bump, None)
            g = s.end_capture()
        before = calls[0]

        def replay():
            g.launch(s)
            s.synchronize()

        replay()
        us = timed(replay, HCHAIN)
        if calls[0] - before != (REPS + 2) * HCHAIN:
            note(f"cupy: host nodes ran {calls[0] - before} times")
        out("cupy_hostfn_graph_replay_us", us)

    section("cupy reduce 2^28", reduce_big)
    section("cupy reduce 1234", reduce_small)
    section("cupy elementwise saxpy 2^28", elementwise)

    # the means of the rows and of the columns of an 8192 x 8192 float32 matrix (bench/helpers.lua)
    def axis_means():
        x = cp.full((8192, 8192), 1.5, dtype=cp.float32)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        for key, f in (("cupy_mean_rows_us", lambda: x.mean(axis=1)), ("cupy_mean_cols_us", lambda: x.T.mean(axis=1))):
            f()
            sync()
            times = []
            for _ in range(REPS * 2):
                e0.record()
                for _ in range(10):
                    f()
                e1.record()
                e1.synchronize()
                times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / 10)
            if float(f()[-1]) != 1.5:
                note(f"cupy: {key} gave {float(f()[-1])}")
            out(key, statistics.median(times))
        del x
        sync()
        pool.free_all_blocks()

    section("cupy axis means 8192^2", axis_means)
    section("cupy plain launch", plain_launch)
    section("cupy graphs", graphs)
    section("cupy host functions", host_functions)


def bench_numba_helpers():
    try:
        np, cuda = import_numba_cuda()
        from numba.cuda.random import create_xoroshiro128p_states, xoroshiro128p_uniform_float32
    except Exception as e:  # noqa: BLE001
        note(f"numba unavailable: {e!r}")
        return
    import numba
    note(f"numba {numba.__version__}")
    sync = cuda.synchronize
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT

    def rng():
        ns = 1 << 20
        t0 = time.perf_counter()
        st = create_xoroshiro128p_states(ns, seed=1)
        sync()
        out("numba_rng_init_first_ms", (time.perf_counter() - t0) * 1e3)
        del st
        times = []
        for r in range(3):
            t0 = time.perf_counter()
            st = create_xoroshiro128p_states(ns, seed=r + 2)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
            del st
        out("numba_rng_init_ms", statistics.median(times))

    one = np.float32(1.0)

    @cuda.jit
    def compute_pi(rng_states, out_, iterations, n):
        i = cuda.grid(1)
        if i >= n:
            return
        inside = 0
        for _ in range(iterations):
            x = xoroshiro128p_uniform_float32(rng_states, i)
            y = xoroshiro128p_uniform_float32(rng_states, i)
            if x * x + y * y <= one:
                inside += 1
        out_[i] = 4.0 * inside / iterations

    def pi():
        blocks, threads, iters = sms * 16, 128, 4000
        n = blocks * threads
        states = create_xoroshiro128p_states(n, seed=3)
        res = cuda.device_array(n, dtype=np.float32)
        k = compute_pi[blocks, threads]
        k(states, res, np.int32(10), np.int32(n))
        sync()
        e0, e1 = cuda.event(), cuda.event()
        times = []
        for _ in range(REPS):
            e0.record()
            k(states, res, np.int32(iters), np.int32(n))
            e1.record()
            e1.synchronize()
            times.append(n * iters / (cuda.event_elapsed_time(e0, e1) * 1e-3) / 1e9)
        out("numba_pi_gsamples_s", statistics.median(times))
        p = float(res.copy_to_host().astype(np.float64).mean())
        if abs(p - np.pi) > 0.01:
            note(f"numba: pi came out as {p}")

    @cuda.reduce
    def sum_reduce(a, b):
        return a + b

    @cuda.jit
    def fill(a, v):
        i = cuda.grid(1)
        if i < a.size:
            a[i] = v

    def reduce_big():
        x = cuda.device_array(BIG, dtype=np.float32)
        fill[(BIG + 255) // 256, 256](x, np.float32(1))
        for _ in range(2):
            v = float(sum_reduce(x))
        times = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            v = float(sum_reduce(x))
            times.append((time.perf_counter() - t0) * 1e6)
        if abs(v - BIG) > 0.01 * BIG:
            note(f"numba: sum of 2^28 ones gave {v}")
        us = statistics.median(times)
        out("numba_reduce_f32_call_us", us)
        out("numba_reduce_f32_gbs", BIG * 4 / (us * 1e-6) / 1e9)
        res = cuda.device_array(1, dtype=np.float32)
        e0, e1 = cuda.event(), cuda.event()
        K = 5
        times = []
        for _ in range(3):
            e0.record()
            for _ in range(K):
                sum_reduce(x, res=res)
            e1.record()
            e1.synchronize()
            times.append(cuda.event_elapsed_time(e0, e1) * 1e3 / K)
        us = statistics.median(times)
        out("numba_reduce_f32_kernel_us", us)
        out("numba_reduce_f32_kernel_gbs", BIG * 4 / (us * 1e-6) / 1e9)
        del x
        sync()

    def reduce_small():
        xs = cuda.to_device(np.ones(SMALL, dtype=np.float64))
        res = []
        us = timed_calls(lambda: res.append(float(sum_reduce(xs))), 1000, 100)
        if res[-1] != SMALL:
            note(f"numba: sum of 1234 ones gave {res[-1]}")
        out("numba_reduce_small_us", us)

    @cuda.jit("void(float32[:], int32)")
    def bump(x, n):
        i = cuda.grid(1)
        if i < n:
            x[i] += np.float32(1.0)

    def forall():
        x = cuda.device_array(FORALL_N, dtype=np.float32)
        n = np.int32(FORALL_N)
        block = forall_block()
        grid = (FORALL_N + block - 1) // block

        def each(m):
            for _ in range(m):
                bump.forall(FORALL_N)(x, n)

        def plain(m):
            for _ in range(m):
                bump[grid, block](x, n)

        out("numba_forall_us", per_launch(each, sync, N_NUMBA, 3))
        out("numba_forall_plain_us", per_launch(plain, sync, N_NUMBA, 3))

    @cuda.jit("void(float32[:], int32)")
    def touch(m, n):
        i = cuda.grid(1)
        if i < n:
            m[i] = np.float32(1.0)

    class Foreign:
        """a foreign library's array: device memory described with the interface (1-D here)"""

        def __init__(self, d):
            self.d = d
            self.ptr = d.__cuda_array_interface__["data"][0]
            self.n = d.shape[0]

        @property
        def __cuda_array_interface__(self):
            return {"data": (self.ptr, False), "shape": (self.n,), "typestr": "<f4",
                    "strides": None, "version": 3}

    def cai():
        nel = 32 * 32
        d = cuda.device_array(nel, dtype=np.float32)
        f = Foreign(d)
        n = np.int32(nel)
        k = touch[1, 32]

        def native(m):
            for _ in range(m):
                k(d, n)

        def foreign(m):
            for _ in range(m):
                k(f, n)

        out("numba_cai_native_us", per_launch(native, sync, N_NUMBA, 3))
        out("numba_cai_foreign_us", per_launch(foreign, sync, N_NUMBA, 3))

    section("numba random", rng)
    section("numba pi", pi)
    section("numba reduce 2^28", reduce_big)
    section("numba reduce 1234", reduce_small)
    section("numba forall", forall)
    section("numba array interface", cai)


if __name__ == "__main__":
    which = sys.argv[1:] or ["cupy", "numba"]
    if "cupy" in which:
        bench_cupy()
    if "numba" in which:
        bench_numba()
    if "cupy_helpers" in which:
        bench_cupy_helpers()
    if "numba_helpers" in which:
        bench_numba_helpers()
