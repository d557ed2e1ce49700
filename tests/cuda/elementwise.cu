// k2_mul_add_gelu: elementwise: one thread per element (4 rows of 48), grid-stride
//   %4 = mul %x, %w : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:24)
//   %5 = add %4, %b : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:28)
//   %6 = gelu %5 : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:17)
//   %7 = sigmoid %x : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:35)
//   %8 = mul %6, %7 : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:33)
//   %9 = broadcast %3 {shape=[4,48]} : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:12)
//   %10 = mul %9, %7 : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:33)
//   %11 = gelu_grad %5 : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:17)
//   %12 = mul %10, %11 : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:17)
//   %13 = mul %12, %x : f32[4,48]  loc("tests/cuda/elementwise.gdl":11:24)
// in0 = %x, in1 = %w, in2 = %b, in3 = %3,
//   out0 = %8, out1 = %12, out2 = %13
extern "C" __global__ void __launch_bounds__(256) k2_mul_add_gelu(
    const float *__restrict__ in0, // f32[4,48]
    const float *__restrict__ in1, // f32[48]
    const float *__restrict__ in2, // f32[48]
    const float *__restrict__ in3, // f32[1,1]
    float *__restrict__ out0, // f32[4,48]
    float *__restrict__ out1, // f32[4,48]
    float *__restrict__ out2) { // f32[4,48]
  for (long i = (long)blockIdx.x * 256 + threadIdx.x; i < 192; i += (long)gridDim.x * 256) {
    const long row = i / 48;
    const int j = (int)(i - row * 48);
    const float p8 = in3[0];
    const float e0 = in0[i];
    const float e1 = in1[j];
    const float e2 = (e0 * e1);
    const float e3 = in2[j];
    const float e4 = (e2 + e3);
    const float e5 = gelu(e4);
    const float e6 = sigmoid(e0);
    const float e7 = (e5 * e6);
    out0[i] = e7;
    const float e10 = (p8 * e6);
    const float e11 = gelu_grad(e4);
    const float e12 = (e10 * e11);
    out1[i] = e12;
    const float e13 = (e12 * e0);
    out2[i] = e13;
  }
}
