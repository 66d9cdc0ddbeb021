# bench/numba_sim.py: the tutorials' Monte-Carlo pi (seed 004) under Numba's CUDA simulator
# (NUMBA_ENABLE_CUDASIM=1: kernels run on the CPU, a Python thread per CUDA thread), the
# baseline of the CPU device's pi row (issue 29: "≥ 100x faster than Numba's simulator").
# Prints "numba_sim_pi_msps <million samples per second>" (the kernel's launch to its end).
import os
import sys
import time

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
try:
    import numpy as np
    from numba import cuda
    from numba.cuda.random import create_xoroshiro128p_states, xoroshiro128p_uniform_float32
except ImportError as e:
    print("# numba_sim: skipped:", e)
    sys.exit(0)


@cuda.jit
def compute_pi(rng_states, iterations, out):
    i = cuda.grid(1)
    inside = 0
    for _ in range(iterations):
        x = xoroshiro128p_uniform_float32(rng_states, i)
        y = xoroshiro128p_uniform_float32(rng_states, i)
        if x * x + y * y <= 1.0:
            inside += 1
    out[i] = 4.0 * inside / iterations


def main():
    blocks, threads, iterations = 4, 64, 200   # the simulator is slow: a small grid
    n = blocks * threads
    states = create_xoroshiro128p_states(n, seed=1)
    out = np.zeros(n, dtype=np.float32)
    compute_pi[1, 1](states, 1, out)            # warm-up (the simulator's first launch)
    t0 = time.perf_counter()
    compute_pi[blocks, threads](states, iterations, out)
    dt = time.perf_counter() - t0
    print("info_numba_sim_pi %.4f" % out.mean())
    print("numba_sim_pi_msps %.5f" % (n * iterations / dt / 1e6))


main()
