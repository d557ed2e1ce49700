// k2_permute: transpose: 8 tiles of 32x32 through shared memory (axis 1 of the result is contiguous in the operand)
//   %y = permute %1 {perm=[0,2,1]} : f32[2,36,40]  loc("tests/cuda/transpose.gdl":11:7)
// in0 = %1, out0 = %y
extern "C" __global__ void __launch_bounds__(256) k2_permute(
    const float *__restrict__ in0, // f32[2,40,36]
    float *__restrict__ out0) { // f32[2,36,40]
  __shared__ float tile[32][33];
  const long b = blockIdx.x;
  const long o = b / 4;
  const long a0 = (b % 4) / 2 * 32, c0 = b % 2 * 32;
  for (int k = threadIdx.y; k < 32; k += 8) { // read along the operand's contiguous axis
    const long a = a0 + threadIdx.x, c = c0 + k;
    if (a < 36 && c < 40) tile[k][threadIdx.x] = in0[o * 1440 + a + c * 36];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += 8) { // write along the result's last axis
    const long a = a0 + k, c = c0 + threadIdx.x;
    if (a < 36 && c < 40) {
      out0[o * 1440 + a * 40 + c] = tile[threadIdx.x][k];
    }
  }
}
