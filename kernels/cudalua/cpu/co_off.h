/* cudalua/cpu/co_off.h: after a coroutine twin, the calls are cuda_cpu.h's functions again */
#undef __syncthreads
#undef __syncthreads_count
#undef __syncthreads_and
#undef __syncthreads_or
#undef __syncwarp
#undef __shfl_sync
#undef __shfl_up_sync
#undef __shfl_down_sync
#undef __shfl_xor_sync
#undef __ballot_sync
#undef __any_sync
#undef __all_sync
#pragma pop_macro("__CL_CUR")
