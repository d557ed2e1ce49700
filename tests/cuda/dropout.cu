// k5_softmax_random_ge: one block of 64 threads per row, 32 rows of 40
//   %15 = softmax %0 {axis=2} : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:15)
//   %16 = random %1 {dist="uniform", key=720903, batched=true} : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:7)
//   %17 = random %1 {dist="uniform", key=720903, batched=true} : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:7)
//   %18 = ge %16, %2 : bool[4,8,40]  loc("tests/cuda/dropout.gdl":11:7)
//   %19 = ge %17, %2 : bool[4,8,40]  loc("tests/cuda/dropout.gdl":11:7)
//   %20 = select %18, %3, %4 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:7)
//   %21 = select %19, %3, %4 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:7)
//   %p = mul %15, %20 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:7)
//   %22 = random %1 {dist="normal", key=786450, batched=true} : f32[4,8,40]  loc("tests/cuda/dropout.gdl":12:18)
//   %23 = mul %5, %22 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":12:16)
//   %h = add %p, %23 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":12:9)
//   %24 = cross_entropy %h, %y {ignore_index=-100, reduction="none"} : f32[4,8]  loc("tests/cuda/dropout.gdl":13:13)
//   %25 = softmax %h {axis=2} : f32[4,8,40]  loc("tests/cuda/dropout.gdl":13:13)
//   %26 = one_hot %y {depth=40, ignore_index=-100} : f32[4,8,40]  loc("tests/cuda/dropout.gdl":13:13)
//   %27 = sub %25, %26 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":13:13)
//   %28 = mul %27, %14 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":13:13)
//   %29 = mul %28, %21 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:7)
//   %30 = mul %29, %15 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:15)
//   %31 = sum %30 {axes=[2], keepdim=true} : f32[4,8,1]  loc("tests/cuda/dropout.gdl":11:15)
//   %32 = sub %29, %31 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:15)
//   %33 = mul %15, %32 : f32[4,8,40]  loc("tests/cuda/dropout.gdl":11:15)
// in0 = %0, in1 = %y, in2 = %14, out0 = %24,
//   out1 = %33, in3 = %1
extern "C" __global__ void __launch_bounds__(64) k5_softmax_random_ge(
    const float *__restrict__ in0, // f32[4,8,40]
    const int *__restrict__ in1, // i32[4,8]
    const float *__restrict__ in2, // f32[4,8,1]
    float *__restrict__ out0, // f32[4,8]
    float *__restrict__ out1, // f32[4,8,40]
    const int *__restrict__ in3) { // i32[4]
  __shared__ float red_f[32];
  const long row = blockIdx.x;
  const int tid = threadIdx.x;
  const float *in0_row = in0 + row * 40;
  float *out1_row = out1 + row * 40;
  const int p17 = in1[row];
  const float p22 = in2[row];
  // pass 1 over the row: acc0 = the maximum
  float acc0 = (-GRADC_INF);
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    acc0 = maximum(acc0, e0);
  }
  const float max0 = block_max(acc0, red_f, (-GRADC_INF));
  // pass 2 over the row: acc1 = the sum of exp(x - max0)
  float acc1 = 0.0f;
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    acc1 += expf(e0 - max0);
  }
  const float sum1 = block_sum(acc1, red_f);
  // pass 3 over the row: acc2 = the maximum
  float acc2 = (-GRADC_INF);
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = expf(e0 - max0) / sum1;
    const float e3 = rand_uniform_f32(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 720903u);
    const bool e6 = (e3 >= 0.10000000149011612f);
    const float e10 = (e6 ? 1.1111111640930176f : 0.0f);
    const float e12 = (e1 * e10);
    const float e13 = (float)rand_normal(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 786450u);
    const float e15 = (0.009999999776482582f * e13);
    const float e16 = (e12 + e15);
    acc2 = maximum(acc2, e16);
  }
  const float max2 = block_max(acc2, red_f, (-GRADC_INF));
  // pass 4 over the row: acc3 = the sum of exp(x - max2)
  float acc3 = 0.0f;
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = expf(e0 - max0) / sum1;
    const float e3 = rand_uniform_f32(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 720903u);
    const bool e6 = (e3 >= 0.10000000149011612f);
    const float e10 = (e6 ? 1.1111111640930176f : 0.0f);
    const float e12 = (e1 * e10);
    const float e13 = (float)rand_normal(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 786450u);
    const float e15 = (0.009999999776482582f * e13);
    const float e16 = (e12 + e15);
    acc3 += expf(e16 - max2);
  }
  const float sum3 = block_sum(acc3, red_f);
  float r18; // cross_entropy: logsumexp - the target's logit
  {
    const int tgt11 = p17;
    if (tgt11 == -100) {
      r18 = 0.0f;
    } else if (tgt11 < 0 || tgt11 >= 40) {
      r18 = GRADC_NAN;
    } else {
      const float e0 = in0_row[tgt11];
      const float e1 = expf(e0 - max0) / sum1;
      const float e3 = rand_uniform_f32(in3, (long long)(row * 40) + (long long)tgt11 * 1, 320LL, 720903u);
      const bool e6 = (e3 >= 0.10000000149011612f);
      const float e10 = (e6 ? 1.1111111640930176f : 0.0f);
      const float e12 = (e1 * e10);
      const float e13 = (float)rand_normal(in3, (long long)(row * 40) + (long long)tgt11 * 1, 320LL, 786450u);
      const float e15 = (0.009999999776482582f * e13);
      const float e16 = (e12 + e15);
      const float lse = fabsf(max2) < GRADC_INF ? max2 + logf(sum3) : max2;
      r18 = lse - e16;
    }
  }
  if (tid == 0) {
    out0[row] = r18;
  }
  // pass 5 over the row: acc4 = the sum
  float acc4 = 0.0f;
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = expf(e0 - max0) / sum1;
    const float e3 = rand_uniform_f32(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 720903u);
    const bool e6 = (e3 >= 0.10000000149011612f);
    const float e10 = (e6 ? 1.1111111640930176f : 0.0f);
    const float e12 = (e1 * e10);
    const float e13 = (float)rand_normal(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 786450u);
    const float e15 = (0.009999999776482582f * e13);
    const float e16 = (e12 + e15);
    const float e19 = expf(e16 - max2) / sum3;
    const float e20 = p17 == j && p17 != -100 ? 1.0f : 0.0f;
    const float e21 = (e19 - e20);
    const float e23 = (e21 * p22);
    const float e4 = rand_uniform_f32(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 720903u);
    const bool e7 = (e4 >= 0.10000000149011612f);
    const float e11 = (e7 ? 1.1111111640930176f : 0.0f);
    const float e24 = (e23 * e11);
    const float e25 = (e24 * e1);
    acc4 += e25;
  }
  const float sum4 = block_sum(acc4, red_f);
  const float r26 = sum4;
  // pass 6 over the row: the outputs
  for (int j = tid; j < 40; j += 64) {
    const float e0 = in0_row[j];
    const float e1 = expf(e0 - max0) / sum1;
    const float e3 = rand_uniform_f32(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 720903u);
    const bool e6 = (e3 >= 0.10000000149011612f);
    const float e10 = (e6 ? 1.1111111640930176f : 0.0f);
    const float e12 = (e1 * e10);
    const float e13 = (float)rand_normal(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 786450u);
    const float e15 = (0.009999999776482582f * e13);
    const float e16 = (e12 + e15);
    const float e19 = expf(e16 - max2) / sum3;
    const float e20 = p17 == j && p17 != -100 ? 1.0f : 0.0f;
    const float e21 = (e19 - e20);
    const float e23 = (e21 * p22);
    const float e4 = rand_uniform_f32(in3, (long long)(row * 40) + (long long)j * 1, 320LL, 720903u);
    const bool e7 = (e4 >= 0.10000000149011612f);
    const float e11 = (e7 ? 1.1111111640930176f : 0.0f);
    const float e24 = (e23 * e11);
    const float e27 = (e24 - r26);
    const float e28 = (e1 * e27);
    out1_row[j] = e28;
  }
}
