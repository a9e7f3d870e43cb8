// merge_attention_partials: CUDA implementation (forward and backward), written for sm_90.
// One warp per row of D values: lanes stride over D, the backward's two dot products reduce
// with warp shuffles. The op is memory bound; weights are recomputed from lse in both passes.
#include "merge_attention_partials.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

namespace turbo_dllm {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

template <typename scalar_t>
__global__ void merge_forward_kernel(const scalar_t* __restrict__ out_a,
                                     const float* __restrict__ lse_a,
                                     const scalar_t* __restrict__ out_b,
                                     const float* __restrict__ lse_b, scalar_t* __restrict__ out,
                                     float* __restrict__ lse, int64_t rows, int64_t dim) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  float w_a, w_b, merged;
  merge_weights(lse_a[row], lse_b[row], w_a, w_b, merged);
  if (lane == 0) lse[row] = merged;
  const scalar_t* a = out_a + row * dim;
  const scalar_t* b = out_b + row * dim;
  scalar_t* o = out + row * dim;
  for (int64_t d = lane; d < dim; d += kWarp) {
    acc_t value = 0;
    if (w_a != 0.f) value += static_cast<acc_t>(w_a) * static_cast<acc_t>(a[d]);
    if (w_b != 0.f) value += static_cast<acc_t>(w_b) * static_cast<acc_t>(b[d]);
    o[d] = static_cast<scalar_t>(value);
  }
}

template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

template <typename scalar_t>
__global__ void merge_backward_kernel(const scalar_t* __restrict__ grad_out,
                                      const float* __restrict__ grad_lse,
                                      const scalar_t* __restrict__ out_a,
                                      const float* __restrict__ lse_a,
                                      const scalar_t* __restrict__ out_b,
                                      const float* __restrict__ lse_b,
                                      scalar_t* __restrict__ grad_out_a,
                                      float* __restrict__ grad_lse_a,
                                      scalar_t* __restrict__ grad_out_b,
                                      float* __restrict__ grad_lse_b, int64_t rows,
                                      int64_t dim) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;  // whole warps exit together: rows are warp-uniform
  float w_a, w_b, merged;
  merge_weights(lse_a[row], lse_b[row], w_a, w_b, merged);
  acc_t dot_a = 0, dot_b = 0;
  if (grad_out != nullptr) {
    const scalar_t* a = out_a + row * dim;
    const scalar_t* b = out_b + row * dim;
    const scalar_t* g = grad_out + row * dim;
    for (int64_t d = lane; d < dim; d += kWarp) {
      const acc_t gd = static_cast<acc_t>(g[d]);
      const acc_t av = w_a != 0.f ? static_cast<acc_t>(a[d]) : acc_t(0);
      const acc_t bv = w_b != 0.f ? static_cast<acc_t>(b[d]) : acc_t(0);
      const acc_t o = static_cast<acc_t>(w_a) * av + static_cast<acc_t>(w_b) * bv;
      dot_a += gd * (av - o);
      dot_b += gd * (bv - o);
      grad_out_a[row * dim + d] = static_cast<scalar_t>(static_cast<acc_t>(w_a) * gd);
      grad_out_b[row * dim + d] = static_cast<scalar_t>(static_cast<acc_t>(w_b) * gd);
    }
    dot_a = warp_sum(dot_a);
    dot_b = warp_sum(dot_b);
  }
  if (lane == 0) {
    const acc_t upstream = grad_lse != nullptr ? static_cast<acc_t>(grad_lse[row]) : acc_t(0);
    grad_lse_a[row] =
        w_a != 0.f ? static_cast<float>(static_cast<acc_t>(w_a) * (dot_a + upstream)) : 0.f;
    grad_lse_b[row] =
        w_b != 0.f ? static_cast<float>(static_cast<acc_t>(w_b) * (dot_b + upstream)) : 0.f;
  }
}

unsigned int blocks_for(int64_t rows) {
  return static_cast<unsigned int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

std::tuple<at::Tensor, at::Tensor> merge_cuda(const at::Tensor& out_a, const at::Tensor& lse_a,
                                              const at::Tensor& out_b, const at::Tensor& lse_b) {
  check_partials(out_a, lse_a, out_b, lse_b);
  const c10::cuda::CUDAGuard guard(out_a.device());
  const at::Tensor oa = out_a.contiguous(), ob = out_b.contiguous();
  const at::Tensor la = lse_a.contiguous(), lb = lse_b.contiguous();
  at::Tensor out = at::empty_like(oa, at::MemoryFormat::Contiguous);
  at::Tensor lse = at::empty_like(la, at::MemoryFormat::Contiguous);
  const int64_t rows = la.numel();
  const int64_t dim = oa.size(-1);
  if (rows == 0) return {out, lse};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, oa.scalar_type(),
                                  "merge_attention_partials_cuda", [&] {
    merge_forward_kernel<scalar_t><<<blocks_for(rows), kWarp * kWarpsPerBlock, 0, stream>>>(
        oa.const_data_ptr<scalar_t>(), la.const_data_ptr<float>(), ob.const_data_ptr<scalar_t>(),
        lb.const_data_ptr<float>(), out.mutable_data_ptr<scalar_t>(),
        lse.mutable_data_ptr<float>(), rows, dim);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> merge_backward_cuda(
    const std::optional<at::Tensor>& grad_out, const std::optional<at::Tensor>& grad_lse,
    const at::Tensor& out_a, const at::Tensor& lse_a, const at::Tensor& out_b,
    const at::Tensor& lse_b) {
  check_partials(out_a, lse_a, out_b, lse_b);
  check_grads(grad_out, grad_lse, out_a, lse_a);
  const c10::cuda::CUDAGuard guard(out_a.device());
  const bool has_go = grad_out.has_value() && grad_out->defined();
  const bool has_gl = grad_lse.has_value() && grad_lse->defined();
  const at::Tensor oa = out_a.contiguous(), ob = out_b.contiguous();
  const at::Tensor la = lse_a.contiguous(), lb = lse_b.contiguous();
  const at::Tensor go = has_go ? grad_out->to(oa.scalar_type()).contiguous() : at::Tensor();
  const at::Tensor gl = has_gl ? grad_lse->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor grad_oa = at::zeros_like(oa, at::MemoryFormat::Contiguous);
  at::Tensor grad_ob = at::zeros_like(ob, at::MemoryFormat::Contiguous);
  at::Tensor grad_la = at::empty_like(la, at::MemoryFormat::Contiguous);
  at::Tensor grad_lb = at::empty_like(lb, at::MemoryFormat::Contiguous);
  const int64_t rows = la.numel();
  const int64_t dim = oa.size(-1);
  if (rows == 0) return {grad_oa, grad_la, grad_ob, grad_lb};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, oa.scalar_type(),
                                  "merge_attention_partials_backward_cuda", [&] {
    merge_backward_kernel<scalar_t><<<blocks_for(rows), kWarp * kWarpsPerBlock, 0, stream>>>(
        has_go ? go.const_data_ptr<scalar_t>() : nullptr,
        has_gl ? gl.const_data_ptr<float>() : nullptr, oa.const_data_ptr<scalar_t>(),
        la.const_data_ptr<float>(), ob.const_data_ptr<scalar_t>(), lb.const_data_ptr<float>(),
        grad_oa.mutable_data_ptr<scalar_t>(), grad_la.mutable_data_ptr<float>(),
        grad_ob.mutable_data_ptr<scalar_t>(), grad_lb.mutable_data_ptr<float>(), rows, dim);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {grad_oa, grad_la, grad_ob, grad_lb};
}

}  // namespace
}  // namespace turbo_dllm

DLLM_LIBRARY_IMPL(TURBO_DLLM_NS, CUDA, m) {
  m.impl("merge_attention_partials", &turbo_dllm::merge_cuda);
  m.impl("merge_attention_partials_backward", &turbo_dllm::merge_backward_cuda);
}
