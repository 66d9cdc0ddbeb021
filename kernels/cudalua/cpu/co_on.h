/* cudalua/cpu/co_on.h: read before a kernel's coroutine twin (cudalua.cpucompile writes the
   twin after the kernel, between this and co_off.h): in its body the barriers and warp
   operations are co_await of cuda_cpu.h's awaiters, made for the thread __cl_me (the twin's
   first parameter); their file and line are the call's, for the checks' messages. */
#define __syncthreads() (co_await __cl_co_bar(__cl_me, __FILE__, __LINE__, 0))
#define __syncthreads_count(p) (co_await __cl_co_bar(__cl_me, __FILE__, __LINE__, 1, (p)))
#define __syncthreads_and(p) (co_await __cl_co_bar(__cl_me, __FILE__, __LINE__, 2, (p)))
#define __syncthreads_or(p) (co_await __cl_co_bar(__cl_me, __FILE__, __LINE__, 3, (p)))
#define __syncwarp(...) (co_await __cl_co_syncwarp(__cl_me, __FILE__, __LINE__ __VA_OPT__(,) __VA_ARGS__))
#define __shfl_sync(...) (co_await __cl_co_shfl<CL_CPU_WIDX>(__cl_me, __FILE__, __LINE__, __VA_ARGS__))
#define __shfl_up_sync(...) (co_await __cl_co_shfl<CL_CPU_WUP>(__cl_me, __FILE__, __LINE__, __VA_ARGS__))
#define __shfl_down_sync(...) (co_await __cl_co_shfl<CL_CPU_WDOWN>(__cl_me, __FILE__, __LINE__, __VA_ARGS__))
#define __shfl_xor_sync(...) (co_await __cl_co_shfl<CL_CPU_WXOR>(__cl_me, __FILE__, __LINE__, __VA_ARGS__))
#define __ballot_sync(...) (co_await __cl_co_vote<CL_CPU_WBALLOT, unsigned>(__cl_me, __FILE__, __LINE__, __VA_ARGS__))
#define __any_sync(...) (co_await __cl_co_vote<CL_CPU_WANY, int>(__cl_me, __FILE__, __LINE__, __VA_ARGS__))
#define __all_sync(...) (co_await __cl_co_vote<CL_CPU_WALL, int>(__cl_me, __FILE__, __LINE__, __VA_ARGS__))
/* the twin's body reads its thread's coordinates from its own parameter rather than from the
   OS thread's __cl_cur (which the device sets before each resume, for the functions the body
   calls): no load of it can be moved across a co_await */
#pragma push_macro("__CL_CUR")
#undef __CL_CUR
#define __CL_CUR (__cl_me)
