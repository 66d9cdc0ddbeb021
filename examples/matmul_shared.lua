-- matmul_shared.lua: a tiled single-precision matrix multiply whose tiles take 72 KiB of
-- dynamic shared memory per block, more than the 48 KiB a kernel gets without opting in:
-- cudalua opts the kernel in (once) when the launch asks for it. Checked against the CPU on
-- random matrices, every element.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

-- each 16x16 block computes a 64x64 tile of C (4x4 per thread), with a 64 x BK tile of A and
-- a BK x 64 tile of B in shared memory
local BM, BK = 64, 144
local matmul = cuda.kernel(([[
constexpr int BM = %d, BK = %d;
extern "C" __global__ void matmul(const float *A, const float *B, float *C, int M, int N, int K) {
  extern __shared__ float smem[];
  float *As = smem, *Bs = smem + BM * BK;             // [BM][BK] and [BK][BM]
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BM;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += 256) {
      int r = i / BK, c = i %% BK;
      As[i] = (row0 + r < M && k0 + c < K) ? A[(row0 + r) * K + k0 + c] : 0.0f;
      int kr = i / BM, cc = i %% BM;
      Bs[i] = (k0 + kr < K && col0 + cc < N) ? B[(k0 + kr) * N + col0 + cc] : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < BK; k++)
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
          acc[i][j] += As[(ty * 4 + i) * BK + k] * Bs[k * BM + tx * 4 + j];
    __syncthreads();
  }
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      int r = row0 + ty * 4 + i, c = col0 + tx * 4 + j;
      if (r < M && c < N) C[r * N + c] = acc[i][j];
    }
}]]):format(BM, BK), "matmul")

local M, N, K = 200, 176, 300
local function random_matrix(rows, cols)
  local t = {}
  for r = 1, rows do
    t[r] = {}
    for c = 1, cols do t[r][c] = math.random() * 2 - 1 end
  end
  return cuda.array(t, "float32")
end
local A, B = random_matrix(M, K), random_matrix(K, N)
local dA, dB, dC = cuda.to_device(A), cuda.to_device(B), cuda.device_array({ M, N }, "float32")
local shared = 2 * BM * BK * 4
matmul[{ { (N + BM - 1) // BM, (M + BM - 1) // BM }, { 16, 16 }, 0, shared }](dA, dB, dC, M, N, K)
local C = dC:copy_to_host()

local worst = 0
for r = 1, M do
  for c = 1, N do
    local s = 0
    for k = 1, K do s = s + A:get(r, k) * B:get(k, c) end
    worst = math.max(worst, math.abs(C:get(r, c) - s))
  end
end
local attrs = matmul:attributes()
print(("tiled matmul %dx%dx%d with %d KiB of dynamic shared memory (kernel opted in to %d bytes): max error %.2e")
  :format(M, N, K, shared // 1024, attrs.max_dynamic_shared_size_bytes, worst))
if worst > 1e-3 then error("matmul_shared: mismatch") end
