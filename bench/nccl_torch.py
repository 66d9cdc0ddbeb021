# nccl_torch.py: PyTorch's NCCL all_reduce, one process per GPU (torch.distributed), for
# bench/run.sh to print next to cudalua's (bench/multigpu.lua): the bus bandwidth of a 256 MiB
# float32 all_reduce and the latency of an 8-byte one. Prints "key value" lines from rank 0.
import os, sys, time
try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError as e:
    print(f"# nccl_torch.py: no PyTorch here ({e}): the PyTorch column stays empty")
    sys.exit(0)

def worker(rank, world, port, reps):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    def timed(t, n):
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        res = []
        for _ in range(reps):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            res.append((time.perf_counter() - t0) / n)
        res.sort()
        return res[len(res) // 2]
    big = torch.ones((256 << 20) // 4, dtype=torch.float32, device="cuda")
    t = timed(big, 10)
    small = torch.ones(2, dtype=torch.float32, device="cuda")
    ts = timed(small, 2000)
    if rank == 0:
        print(f"torch_nccl_allreduce_256MiB_busbw_gbs {big.numel() * 4 / t / 1e9 * 2 * (world - 1) / world:.4f}")
        print(f"torch_nccl_allreduce_8B_us {ts * 1e6:.4f}")
        sys.stdout.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    world = torch.cuda.device_count()
    if world < 2:
        print(f"# nccl_torch.py: {world} GPU(s) here, the rows need 2")
        sys.exit(0)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(worker, args=(world, 29000 + os.getpid() % 1000, int(os.environ.get("BENCH_REPS", "5"))), nprocs=world)
