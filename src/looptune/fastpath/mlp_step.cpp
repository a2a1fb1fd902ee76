// step.backward='mlp-cpp': the written-out MLP step of fastpath/mlp.py (class _InPlace) as one C++
// call. The same ATen calls in the same order, with the same operand layouts and the same
// persistent buffers, so the loss and the gradients are bit for bit the Python step's (tested);
// what goes away is the Python interpreter and its argument parsing around each of the step's
// ~30 operators. Built at setup by fastpath/native.py (torch.utils.cpp_extension), cached per
// torch version and source.
//
// step(x, y, seed, first, spec, t) -> loss
//   spec: 3 ints per layer (relu, bf16, has a bias)
//   t:    7 tensors per layer: weight, bias, grad_weight, grad_bias, and for a bf16 layer the
//         buffers its weight, bias and weight gradient are cast into (empty tensors stand in for
//         what a layer does not have)
//   first: the gradients overwrite the buffers (else they are added: gradient accumulation)
#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/_log_softmax_backward_data.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/nll_loss_backward.h>
#include <ATen/ops/nll_loss_forward.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/threshold_backward.h>
#include <torch/library.h>

#include <vector>

namespace {

constexpr int64_t kPer = 7;

at::Tensor step(const at::Tensor& x, const at::Tensor& y, const at::Tensor& seed, bool first,
                at::IntArrayRef spec, at::TensorList t) {
  const int64_t n = static_cast<int64_t>(spec.size()) / 3;
  TORCH_CHECK(n >= 1 && static_cast<int64_t>(spec.size()) == 3 * n &&
                  static_cast<int64_t>(t.size()) == kPer * n,
              "looptune_mlp.step: spec holds 3 ints and t 7 tensors per layer");
  std::vector<at::Tensor> inputs, weights, acts;  // what the backward reads
  inputs.reserve(n);
  weights.reserve(n);
  acts.reserve(n);
  at::Tensor a = x.reshape({x.size(0), -1});
  for (int64_t i = 0; i < n; ++i) {
    const bool relu = spec[3 * i], low = spec[3 * i + 1], has_bias = spec[3 * i + 2];
    at::Tensor w = t[kPer * i], b = t[kPer * i + 1];
    if (low) {  // bf16, as autocast casts: weight, bias and input
      w = t[kPer * i + 4].copy_(w);
      if (has_bias) b = t[kPer * i + 5].copy_(b);
      if (a.scalar_type() != at::kBFloat16) a = a.to(at::kBFloat16);
    } else if (a.scalar_type() != at::kFloat) {
      a = a.to(at::kFloat);
    }
    at::Tensor out = has_bias ? at::addmm(b, a, w.t()) : at::mm(a, w.t());
    if (relu) out.relu_();  // its own fresh output: in place is relu's values
    inputs.push_back(a);
    weights.push_back(w);
    acts.push_back(out);
    a = out;
  }
  at::Tensor logp =
      at::_log_softmax(a.scalar_type() == at::kFloat ? a : a.to(at::kFloat), 1, false);
  auto [loss, total] = at::nll_loss_forward(logp, y, {}, 1, -100);
  at::Tensor grad = at::nll_loss_backward(seed, logp, y, {}, 1, -100, total);
  grad = at::_log_softmax_backward_data(grad, logp, 1, at::kFloat);
  for (int64_t i = n - 1; i >= 0; --i) {
    const bool relu = spec[3 * i], low = spec[3 * i + 1], has_bias = spec[3 * i + 2];
    if (grad.scalar_type() != acts[i].scalar_type()) {
      grad = grad.to(acts[i].scalar_type());  // a cast's backward: back to the output's dtype
    }
    if (relu) grad = at::threshold_backward(grad, acts[i], 0);
    at::Tensor gw = t[kPer * i + 2];  // autograd's layout: grad.t() @ input
    if (low) {
      at::Tensor g_low = t[kPer * i + 6];
      at::mm_out(g_low, grad.t(), inputs[i]);
      if (first) {
        gw.copy_(g_low);  // the cast back to fp32, exact
      } else {
        gw.add_(g_low);
      }
    } else if (first) {
      at::mm_out(gw, grad.t(), inputs[i]);
    } else {
      gw.add_(at::mm(grad.t(), inputs[i]));
    }
    if (has_bias) {
      at::Tensor gb = t[kPer * i + 3];
      if (grad.scalar_type() != gb.scalar_type()) {
        if (first) {
          gb.copy_(at::sum(grad, {0}));
        } else {
          gb.add_(at::sum(grad, {0}));
        }
      } else if (first) {
        at::sum_out(gb, grad, {0});
      } else {
        gb.add_(at::sum(grad, {0}));
      }
    }
    if (i) grad = at::mm(grad, weights[i]);
  }
  return loss;
}

}  // namespace

TORCH_LIBRARY(looptune_mlp, m) {
  m.def("step(Tensor x, Tensor y, Tensor seed, bool first, int[] spec, Tensor[] t) -> Tensor",
        &step);
}
