// LLTM ("long-long-term memory"), the recurrent cell of PyTorch's C++ extension tutorial,
// written with ATen ops only: the run time of each call is almost all dispatch and the
// header code around it (Tensor handles, IValues, pybind11's argument casting), which is
// exactly what the compiler flags of an extension build decide. bench/bench_runtime.py
// builds it with torch's `load` and with `opsmith.load` and times `forward`.
#include <torch/extension.h>

#include <vector>

namespace {

// The derivative of the logistic function at z: sigma(z) * (1 - sigma(z)).
torch::Tensor sigmoid_grad(const torch::Tensor& z) {
  torch::Tensor s = torch::sigmoid(z);
  return s * (1 - s);
}

// The derivative of tanh at z: 1 - tanh(z)^2.
torch::Tensor tanh_grad(const torch::Tensor& z) {
  return 1 - torch::tanh(z).pow(2);
}

// The derivative of ELU (alpha = 1): 1 where z > 0, exp(z) elsewhere.
torch::Tensor elu_grad(const torch::Tensor& z) {
  torch::Tensor positive = (z > 0).type_as(z);
  torch::Tensor negative = (z.exp() - 1 < 0).type_as(z) * z.exp();
  return positive + negative;
}

}  // namespace

// One step of the cell. Returns the new hidden state and cell state, then what backward needs.
std::vector<torch::Tensor> forward(torch::Tensor input, torch::Tensor weights, torch::Tensor bias,
                                   torch::Tensor old_h, torch::Tensor old_cell) {
  torch::Tensor joined = torch::cat({old_h, input}, /*dim=*/1);
  torch::Tensor gate_weights = torch::addmm(bias, joined, weights.t());
  std::vector<torch::Tensor> gates = gate_weights.chunk(3, /*dim=*/1);

  torch::Tensor input_gate = torch::sigmoid(gates[0]);
  torch::Tensor output_gate = torch::sigmoid(gates[1]);
  torch::Tensor candidate = torch::elu(gates[2], /*alpha=*/1.0);

  torch::Tensor new_cell = old_cell + candidate * input_gate;
  torch::Tensor new_h = torch::tanh(new_cell) * output_gate;
  return {new_h, new_cell, input_gate, output_gate, candidate, joined, gate_weights};
}

// Gradients of forward's inputs from the gradients of its two outputs.
std::vector<torch::Tensor> backward(torch::Tensor grad_h, torch::Tensor grad_cell,
                                    torch::Tensor new_cell, torch::Tensor input_gate,
                                    torch::Tensor output_gate, torch::Tensor candidate,
                                    torch::Tensor joined, torch::Tensor gate_weights,
                                    torch::Tensor weights) {
  torch::Tensor d_output_gate = torch::tanh(new_cell) * grad_h;
  torch::Tensor d_new_cell = tanh_grad(new_cell) * (output_gate * grad_h) + grad_cell;
  torch::Tensor d_candidate = input_gate * d_new_cell;
  torch::Tensor d_input_gate = candidate * d_new_cell;

  std::vector<torch::Tensor> gates = gate_weights.chunk(3, /*dim=*/1);
  d_input_gate = d_input_gate * sigmoid_grad(gates[0]);
  d_output_gate = d_output_gate * sigmoid_grad(gates[1]);
  d_candidate = d_candidate * elu_grad(gates[2]);

  torch::Tensor d_gates = torch::cat({d_input_gate, d_output_gate, d_candidate}, /*dim=*/1);
  torch::Tensor d_weights = d_gates.t().mm(joined);
  torch::Tensor d_bias = d_gates.sum(/*dim=*/0, /*keepdim=*/true);
  torch::Tensor d_joined = d_gates.mm(weights);
  const int64_t state_size = grad_h.size(1);
  return {d_joined.slice(/*dim=*/1, 0, state_size), d_joined.slice(/*dim=*/1, state_size),
          d_weights, d_bias, d_new_cell};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "LLTM forward step");
  m.def("backward", &backward, "LLTM backward step");
}
