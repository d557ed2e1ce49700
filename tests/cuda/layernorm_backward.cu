// k2_mul_layer_norm_tanh: one block of 64 threads per row, 12 rows of 40
//   %6 = mul %x, %a : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:20)
//   %h = layer_norm %6, %w, %b {eps=1e-05} : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %7 = tanh %h : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:17)
//   %8 = pow %7 {exponent=2.0} : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:25)
//   %9 = broadcast %3 {shape=[4,3,40]} : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:12)
//   %10 = mul %7, %4 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:25)
//   %11 = mul %9, %10 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:25)
//   %12 = mul %7, %7 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:17)
//   %13 = sub %0, %12 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:17)
//   %14 = mul %11, %13 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:17)
//   %15 = mean %6 {axes=[2], keepdim=true} : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %16 = sub %6, %15 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %17 = mul %16, %16 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %18 = mean %17 {axes=[2], keepdim=true} : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %19 = add %18, %5 : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %20 = rsqrt %19 : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %21 = mul %16, %20 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %22 = mul %14, %21 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %23 = mul %14, %w : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %24 = mean %23 {axes=[2], keepdim=true} : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %25 = mul %23, %21 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %26 = mean %25 {axes=[2], keepdim=true} : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %27 = mul %21, %26 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %28 = sub %23, %24 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %29 = sub %28, %27 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %30 = mul %20, %29 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %31 = mul %30, %x : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:20)
// in0 = %x, in1 = %a, in2 = %w, in3 = %b,
//   in4 = %3, out0 = %8, out1 = %14, out2 = %22,
//   out3 = %31
extern "C" __global__ void __launch_bounds__(64) k2_mul_layer_norm_tanh(
    const float *__restrict__ in0, // f32[4,3,40]
    const float *__restrict__ in1, // f32[40]
    const float *__restrict__ in2, // f32[40]
    const float *__restrict__ in3, // f32[40]
    const float *__restrict__ in4, // f32[1,1,1]
    float *__restrict__ out0, // f32[4,3,40]
    float *__restrict__ out1, // f32[4,3,40]
    float *__restrict__ out2, // f32[4,3,40]
    float *__restrict__ out3) { // f32[4,3,40]
  __shared__ float red_f[32];
  const long row = blockIdx.x;
  const int tid = threadIdx.x;
  const float *in0_row = in0 + row * 40;
  float *out0_row = out0 + row * 40;
  float *out1_row = out1 + row * 40;
  float *out2_row = out2 + row * 40;
  float *out3_row = out3 + row * 40;
  const float p8 = in4[0];
  // pass 1 over the row: acc0 = the sum
  float acc0 = 0.0f;
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = in1[j];
    const float e2 = (e0 * e1);
    acc0 += e2;
  }
  const float sum0 = block_sum(acc0, red_f);
  const float mean1 = sum0 / 40.0f;
  const float r17 = sum0 / 40.0f;
  // pass 2 over the row: acc1 = the sum of (x - mean1)^2, acc2 = the sum
  float acc1 = 0.0f;
  float acc2 = 0.0f;
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = in1[j];
    const float e2 = (e0 * e1);
    acc1 += sq(e2 - mean1);
    const float e18 = (e2 - r17);
    const float e19 = (e18 * e18);
    acc2 += e19;
  }
  const float sum1 = block_sum(acc1, red_f);
  const float sum2 = block_sum(acc2, red_f);
  const float rstd1 = 1.0f / sqrtf(sum1 / 40.0f + 9.999999747378752e-06f);
  const float r20 = sum2 / 40.0f;
  const float r22 = (r20 + 9.999999747378752e-06f);
  const float r23 = (1.0f / sqrtf(r22));
  // pass 3 over the row: acc3 = the sum, acc4 = the sum
  float acc3 = 0.0f;
  float acc4 = 0.0f;
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = in1[j];
    const float e2 = (e0 * e1);
    const float e3 = in2[j];
    const float e4 = in3[j];
    const float e5 = (e2 - mean1) * rstd1 * e3 + e4;
    const float e6 = tanhf(e5);
    const float e11 = (e6 * 2.0f);
    const float e12 = (p8 * e11);
    const float e13 = (e6 * e6);
    const float e15 = (1.0f - e13);
    const float e16 = (e12 * e15);
    const float e26 = (e16 * e3);
    acc3 += e26;
    const float e18 = (e2 - r17);
    const float e24 = (e18 * r23);
    const float e28 = (e26 * e24);
    acc4 += e28;
  }
  const float sum3 = block_sum(acc3, red_f);
  const float sum4 = block_sum(acc4, red_f);
  const float r27 = sum3 / 40.0f;
  const float r29 = sum4 / 40.0f;
  // pass 4 over the row: the outputs
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = in1[j];
    const float e2 = (e0 * e1);
    const float e3 = in2[j];
    const float e4 = in3[j];
    const float e5 = (e2 - mean1) * rstd1 * e3 + e4;
    const float e6 = tanhf(e5);
    const float e7 = sq(e6);
    out0_row[j] = e7;
    const float e11 = (e6 * 2.0f);
    const float e12 = (p8 * e11);
    const float e13 = (e6 * e6);
    const float e15 = (1.0f - e13);
    const float e16 = (e12 * e15);
    out1_row[j] = e16;
    const float e18 = (e2 - r17);
    const float e24 = (e18 * r23);
    const float e25 = (e16 * e24);
    out2_row[j] = e25;
    const float e26 = (e16 * e3);
    const float e31 = (e26 - r27);
    const float e30 = (e24 * r29);
    const float e32 = (e31 - e30);
    const float e33 = (r23 * e32);
    const float e34 = (e33 * e0);
    out3_row[j] = e34;
  }
}
