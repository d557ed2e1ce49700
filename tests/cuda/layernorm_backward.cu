// k2_mul_mean_sub: one block of 64 threads per row, 12 rows of 40
//   %6 = mul %x, %a : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:20)
//   %7 = mean %6 {axes=[2], keepdim=true} : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %8 = sub %6, %7 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %9 = mul %8, %8 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %10 = mean %9 {axes=[2], keepdim=true} : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %11 = add %10, %0 : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %12 = rsqrt %11 : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %13 = mul %8, %12 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %14 = mul %13, %w : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %h = add %14, %b : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %15 = tanh %h : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:17)
//   %16 = pow %15 {exponent=2.0} : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:25)
//   %17 = broadcast %4 {shape=[4,3,40]} : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:12)
//   %18 = mul %15, %5 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:25)
//   %19 = mul %17, %18 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:25)
//   %20 = mul %15, %15 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:17)
//   %21 = sub %1, %20 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:17)
//   %22 = mul %19, %21 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":14:17)
//   %23 = mul %22, %13 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %24 = mul %22, %w : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %25 = mean %24 {axes=[2], keepdim=true} : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %26 = mul %24, %13 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %27 = mean %26 {axes=[2], keepdim=true} : f32[4,3,1]  loc("tests/cuda/layernorm.gdl":13:7)
//   %28 = mul %13, %27 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %29 = sub %24, %25 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %30 = sub %29, %28 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %31 = mul %12, %30 : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:7)
//   %32 = mul %31, %x : f32[4,3,40]  loc("tests/cuda/layernorm.gdl":13:20)
// in0 = %x, in1 = %a, in2 = %w, in3 = %b,
//   in4 = %4, out0 = %16, out1 = %22, out2 = %23,
//   out3 = %32
extern "C" __global__ void __launch_bounds__(64) k2_mul_mean_sub(
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
  const float p17 = in4[0];
  // pass 1 over the row: acc0 = the sum
  float acc0 = 0.0f;
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = in1[j];
    const float e2 = (e0 * e1);
    acc0 += e2;
  }
  const float sum0 = block_sum(acc0, red_f);
  const float r3 = sum0 / 40.0f;
  // pass 2 over the row: acc1 = the sum
  float acc1 = 0.0f;
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = in1[j];
    const float e2 = (e0 * e1);
    const float e4 = (e2 - r3);
    const float e5 = (e4 * e4);
    acc1 += e5;
  }
  const float sum1 = block_sum(acc1, red_f);
  const float r6 = sum1 / 40.0f;
  const float r8 = (r6 + 9.999999747378752e-06f);
  const float r9 = (1.0f / sqrtf(r8));
  // pass 3 over the row: acc2 = the sum, acc3 = the sum
  float acc2 = 0.0f;
  float acc3 = 0.0f;
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = in1[j];
    const float e2 = (e0 * e1);
    const float e4 = (e2 - r3);
    const float e10 = (e4 * r9);
    const float e11 = in2[j];
    const float e12 = (e10 * e11);
    const float e13 = in3[j];
    const float e14 = (e12 + e13);
    const float e15 = tanhf(e14);
    const float e20 = (e15 * 2.0f);
    const float e21 = (p17 * e20);
    const float e22 = (e15 * e15);
    const float e24 = (1.0f - e22);
    const float e25 = (e21 * e24);
    const float e27 = (e25 * e11);
    acc2 += e27;
    const float e29 = (e27 * e10);
    acc3 += e29;
  }
  const float sum2 = block_sum(acc2, red_f);
  const float sum3 = block_sum(acc3, red_f);
  const float r28 = sum2 / 40.0f;
  const float r30 = sum3 / 40.0f;
  // pass 4 over the row: the outputs
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = in1[j];
    const float e2 = (e0 * e1);
    const float e4 = (e2 - r3);
    const float e10 = (e4 * r9);
    const float e11 = in2[j];
    const float e12 = (e10 * e11);
    const float e13 = in3[j];
    const float e14 = (e12 + e13);
    const float e15 = tanhf(e14);
    const float e16 = sq(e15);
    out0_row[j] = e16;
    const float e20 = (e15 * 2.0f);
    const float e21 = (p17 * e20);
    const float e22 = (e15 * e15);
    const float e24 = (1.0f - e22);
    const float e25 = (e21 * e24);
    out1_row[j] = e25;
    const float e26 = (e25 * e10);
    out2_row[j] = e26;
    const float e27 = (e25 * e11);
    const float e32 = (e27 - r28);
    const float e31 = (e10 * r30);
    const float e33 = (e32 - e31);
    const float e34 = (r9 * e33);
    const float e35 = (e34 * e0);
    out3_row[j] = e35;
  }
}
