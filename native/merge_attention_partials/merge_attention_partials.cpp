// merge_attention_partials: op schema and the CPU implementation (forward and backward).
// The CUDA implementation lives in merge_attention_partials_cuda.cu and registers the same ops.
#include "merge_attention_partials.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <tuple>

namespace turbo_dllm {
namespace {

constexpr int64_t kRowGrain = 64;

std::tuple<at::Tensor, at::Tensor> merge_cpu(const at::Tensor& out_a, const at::Tensor& lse_a,
                                             const at::Tensor& out_b, const at::Tensor& lse_b) {
  check_partials(out_a, lse_a, out_b, lse_b);
  const at::Tensor oa = out_a.contiguous(), ob = out_b.contiguous();
  const at::Tensor la = lse_a.contiguous(), lb = lse_b.contiguous();
  at::Tensor out = at::empty_like(oa, at::MemoryFormat::Contiguous);
  at::Tensor lse = at::empty_like(la, at::MemoryFormat::Contiguous);
  const int64_t rows = la.numel();
  const int64_t dim = oa.size(-1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, oa.scalar_type(),
                                  "merge_attention_partials_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* pa = oa.const_data_ptr<scalar_t>();
    const scalar_t* pb = ob.const_data_ptr<scalar_t>();
    const float* pla = la.const_data_ptr<float>();
    const float* plb = lb.const_data_ptr<float>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    float* pl = lse.mutable_data_ptr<float>();
    at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float w_a, w_b, merged;
        merge_weights(pla[r], plb[r], w_a, w_b, merged);
        pl[r] = merged;
        const scalar_t* a = pa + r * dim;
        const scalar_t* b = pb + r * dim;
        scalar_t* o = po + r * dim;
        for (int64_t d = 0; d < dim; ++d) {
          acc_t value = 0;
          if (w_a != 0.f) value += static_cast<acc_t>(w_a) * static_cast<acc_t>(a[d]);
          if (w_b != 0.f) value += static_cast<acc_t>(w_b) * static_cast<acc_t>(b[d]);
          o[d] = static_cast<scalar_t>(value);
        }
      }
    });
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> merge_backward_cpu(
    const std::optional<at::Tensor>& grad_out, const std::optional<at::Tensor>& grad_lse,
    const at::Tensor& out_a, const at::Tensor& lse_a, const at::Tensor& out_b,
    const at::Tensor& lse_b) {
  check_partials(out_a, lse_a, out_b, lse_b);
  check_grads(grad_out, grad_lse, out_a, lse_a);
  const bool has_go = grad_out.has_value() && grad_out->defined();
  const bool has_gl = grad_lse.has_value() && grad_lse->defined();
  const at::Tensor oa = out_a.contiguous(), ob = out_b.contiguous();
  const at::Tensor la = lse_a.contiguous(), lb = lse_b.contiguous();
  const at::Tensor go = has_go ? grad_out->contiguous() : at::Tensor();
  const at::Tensor gl = has_gl ? grad_lse->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor grad_oa = at::zeros_like(oa, at::MemoryFormat::Contiguous);
  at::Tensor grad_ob = at::zeros_like(ob, at::MemoryFormat::Contiguous);
  at::Tensor grad_la = at::empty_like(la, at::MemoryFormat::Contiguous);
  at::Tensor grad_lb = at::empty_like(lb, at::MemoryFormat::Contiguous);
  const int64_t rows = la.numel();
  const int64_t dim = oa.size(-1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, oa.scalar_type(),
                                  "merge_attention_partials_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* pa = oa.const_data_ptr<scalar_t>();
    const scalar_t* pb = ob.const_data_ptr<scalar_t>();
    const float* pla = la.const_data_ptr<float>();
    const float* plb = lb.const_data_ptr<float>();
    const float* pgl = has_gl ? gl.const_data_ptr<float>() : nullptr;
    scalar_t* pga = grad_oa.mutable_data_ptr<scalar_t>();
    scalar_t* pgb = grad_ob.mutable_data_ptr<scalar_t>();
    float* pgla = grad_la.mutable_data_ptr<float>();
    float* pglb = grad_lb.mutable_data_ptr<float>();
    // grad_out may come in another floating dtype than out; read it through acc_t.
    const at::Tensor go_cast = has_go ? go.to(oa.scalar_type()) : at::Tensor();
    const scalar_t* pgo = has_go ? go_cast.const_data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float w_a, w_b, merged;
        merge_weights(pla[r], plb[r], w_a, w_b, merged);
        const acc_t upstream_lse = pgl ? static_cast<acc_t>(pgl[r]) : acc_t(0);
        acc_t dot_a = 0, dot_b = 0;
        if (pgo != nullptr) {
          const scalar_t* a = pa + r * dim;
          const scalar_t* b = pb + r * dim;
          const scalar_t* g = pgo + r * dim;
          for (int64_t d = 0; d < dim; ++d) {
            const acc_t gd = static_cast<acc_t>(g[d]);
            const acc_t av = w_a != 0.f ? static_cast<acc_t>(a[d]) : acc_t(0);
            const acc_t bv = w_b != 0.f ? static_cast<acc_t>(b[d]) : acc_t(0);
            const acc_t o = static_cast<acc_t>(w_a) * av + static_cast<acc_t>(w_b) * bv;
            dot_a += gd * (av - o);
            dot_b += gd * (bv - o);
            pga[r * dim + d] = static_cast<scalar_t>(static_cast<acc_t>(w_a) * gd);
            pgb[r * dim + d] = static_cast<scalar_t>(static_cast<acc_t>(w_b) * gd);
          }
        }
        pgla[r] = w_a != 0.f ? static_cast<float>(static_cast<acc_t>(w_a) * (dot_a + upstream_lse)) : 0.f;
        pglb[r] = w_b != 0.f ? static_cast<float>(static_cast<acc_t>(w_b) * (dot_b + upstream_lse)) : 0.f;
      }
    });
  });
  return {grad_oa, grad_la, grad_ob, grad_lb};
}

}  // namespace
}  // namespace turbo_dllm

DLLM_LIBRARY(TURBO_DLLM_NS, m) {
  m.def(
      "merge_attention_partials(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b)"
      " -> (Tensor, Tensor)");
  m.def(
      "merge_attention_partials_backward(Tensor? grad_out, Tensor? grad_lse, Tensor out_a,"
      " Tensor lse_a, Tensor out_b, Tensor lse_b) -> (Tensor, Tensor, Tensor, Tensor)");
}

DLLM_LIBRARY_IMPL(TURBO_DLLM_NS, CPU, m) {
  m.impl("merge_attention_partials", &turbo_dllm::merge_cpu);
  m.impl("merge_attention_partials_backward", &turbo_dllm::merge_backward_cpu);
}
