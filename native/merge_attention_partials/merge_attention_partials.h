// merge_attention_partials: shared math and input checks (host and device).
//
// Two partial attention results over disjoint key sets, (out_a, lse_a) and (out_b, lse_b), merge
// into the result over the union:
//   lse = log(exp(lse_a) + exp(lse_b)),  w_x = exp(lse_x - lse),  out = w_a * out_a + w_b * out_b
// A partial with lse = -inf saw no key: its weight is 0 and its `out` is never read. Both -inf
// gives lse = -inf and out = 0. Backward (o = out in accumulation precision, g = grad_out):
//   grad_out_x = w_x * g,   grad_lse_x = w_x * (sum_d g * (out_x - o) + grad_lse)
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <optional>

#ifndef TURBO_DLLM_NS
#error "build with -DTURBO_DLLM_NS=<torch.ops namespace> (turbo_dllm.kernels does this)"
#endif

// TORCH_LIBRARY pastes its namespace argument; one level of indirection expands the macro first.
#define DLLM_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define DLLM_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

namespace turbo_dllm {

// Merge weights and merged lse of one row. -inf on both sides gives zero weights and -inf.
C10_HOST_DEVICE inline void merge_weights(float lse_a, float lse_b, float& w_a, float& w_b,
                                          float& lse) {
  const float m = lse_a > lse_b ? lse_a : lse_b;
  if (m == -INFINITY) {
    w_a = 0.f;
    w_b = 0.f;
    lse = -INFINITY;
    return;
  }
  const float e_a = expf(lse_a - m);
  const float e_b = expf(lse_b - m);
  const float s = e_a + e_b;
  w_a = e_a / s;
  w_b = e_b / s;
  lse = m + logf(s);
}

inline void check_partials(const at::Tensor& out_a, const at::Tensor& lse_a,
                           const at::Tensor& out_b, const at::Tensor& lse_b) {
  TORCH_CHECK(out_a.dim() >= 2, "merge_attention_partials: out_a must be (..., S, D), got ",
              out_a.sizes());
  TORCH_CHECK(out_a.sizes() == out_b.sizes(), "merge_attention_partials: out_a ", out_a.sizes(),
              " and out_b ", out_b.sizes(), " differ in shape");
  TORCH_CHECK(out_a.scalar_type() == out_b.scalar_type(),
              "merge_attention_partials: out_a and out_b differ in dtype");
  TORCH_CHECK(at::isFloatingType(out_a.scalar_type()),
              "merge_attention_partials: out must be a floating dtype");
  const auto rows = out_a.sizes().slice(0, out_a.dim() - 1);
  TORCH_CHECK(lse_a.sizes() == rows && lse_b.sizes() == rows,
              "merge_attention_partials: lse must be out.shape[:-1] = ", rows, ", got ",
              lse_a.sizes(), " and ", lse_b.sizes());
  TORCH_CHECK(lse_a.scalar_type() == at::kFloat && lse_b.scalar_type() == at::kFloat,
              "merge_attention_partials: lse must be float32");
  TORCH_CHECK(out_a.device() == out_b.device() && out_a.device() == lse_a.device() &&
                  out_a.device() == lse_b.device(),
              "merge_attention_partials: all inputs must be on one device");
}

inline void check_grads(const std::optional<at::Tensor>& grad_out,
                        const std::optional<at::Tensor>& grad_lse, const at::Tensor& out_a,
                        const at::Tensor& lse_a) {
  if (grad_out.has_value() && grad_out->defined()) {
    TORCH_CHECK(grad_out->sizes() == out_a.sizes(), "merge_attention_partials_backward: grad_out ",
                grad_out->sizes(), " must match out ", out_a.sizes());
    TORCH_CHECK(grad_out->device() == out_a.device(),
                "merge_attention_partials_backward: grad_out is on another device");
  }
  if (grad_lse.has_value() && grad_lse->defined()) {
    TORCH_CHECK(grad_lse->sizes() == lse_a.sizes(), "merge_attention_partials_backward: grad_lse ",
                grad_lse->sizes(), " must match lse ", lse_a.sizes());
    TORCH_CHECK(grad_lse->device() == lse_a.device(),
                "merge_attention_partials_backward: grad_lse is on another device");
  }
}

}  // namespace turbo_dllm
