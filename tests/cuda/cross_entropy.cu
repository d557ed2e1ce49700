// k3_cross_entropy_softmax_one_hot: one block of 64 threads per row, 6 rows of 50
//   %10 = cross_entropy %0, %y {ignore_index=-100, reduction="none"} : f32[6]  loc("tests/cuda/cross_entropy.gdl":12:13)
//   %11 = softmax %0 {axis=1} : f32[6,50]  loc("tests/cuda/cross_entropy.gdl":12:13)
//   %12 = one_hot %y {depth=50, ignore_index=-100} : f32[6,50]  loc("tests/cuda/cross_entropy.gdl":12:13)
//   %13 = sub %11, %12 : f32[6,50]  loc("tests/cuda/cross_entropy.gdl":12:13)
//   %14 = mul %13, %9 : f32[6,50]  loc("tests/cuda/cross_entropy.gdl":12:13)
// in0 = %0, in1 = %y, in2 = %9, out0 = %10,
//   out1 = %14
extern "C" __global__ void __launch_bounds__(64) k3_cross_entropy_softmax_one_hot(
    const float *__restrict__ in0, // f32[6,50]
    const int *__restrict__ in1, // i32[6]
    const float *__restrict__ in2, // f32[6,1]
    float *__restrict__ out0, // f32[6]
    float *__restrict__ out1) { // f32[6,50]
  __shared__ float red_f[32];
  const long row = blockIdx.x;
  const int tid = threadIdx.x;
  const float *in0_row = in0 + row * 50;
  float *out1_row = out1 + row * 50;
  const int p1 = in1[row];
  const float p6 = in2[row];
  // pass 1 over the row: acc0 = the maximum
  float acc0 = (-GRADC_INF);
  for (int j = tid; j < 50; j += 64) {
    const float e0 = in0_row[j];
    acc0 = maximum(acc0, e0);
  }
  const float max0 = block_max(acc0, red_f, (-GRADC_INF));
  // pass 2 over the row: acc1 = the sum of exp(x - max0)
  float acc1 = 0.0f;
  for (int j = tid; j < 50; j += 64) {
    const float e0 = in0_row[j];
    acc1 += expf(e0 - max0);
  }
  const float sum1 = block_sum(acc1, red_f);
  float r2; // cross_entropy: logsumexp - the target's logit
  {
    const int tgt0 = p1;
    if (tgt0 == -100) {
      r2 = 0.0f;
    } else if (tgt0 < 0 || tgt0 >= 50) {
      r2 = GRADC_NAN;
    } else {
      const float e0 = in0_row[tgt0];
      const float lse = fabsf(max0) < GRADC_INF ? max0 + logf(sum1) : max0;
      r2 = lse - e0;
    }
  }
  if (tid == 0) {
    out0[row] = r2;
  }
  // pass 3 over the row: the outputs
  for (int j = tid; j < 50; j += 64) {
    const float e0 = in0_row[j];
    const float e3 = expf(e0 - max0) / sum1;
    const float e4 = p1 == j && p1 != -100 ? 1.0f : 0.0f;
    const float e5 = (e3 - e4);
    const float e7 = (e5 * p6);
    out1_row[j] = e7;
  }
}
