/* What opsmith.ops.layer_norm / rms_norm return: the first output alone (osm_ops.cpp registers
   these; one translation unit with it). */
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>

namespace {

// -- the first output alone: what opsmith.ops.layer_norm / rms_norm return -----------------------------------
// CompositeImplicitAutograd: the full op (osm_ops.cpp) runs (with its autograd and its CUDA or CPU kernel) and
// Python gets one tensor back instead of three (or two) to drop
at::Tensor layer_norm_y(const at::Tensor &x, at::IntArrayRef shape, const std::optional<at::Tensor> &weight,
                        const std::optional<at::Tensor> &bias, double eps) {
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opsmith::layer_norm", "").typed<
        std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor &, at::IntArrayRef,
                                                       const std::optional<at::Tensor> &,
                                                       const std::optional<at::Tensor> &, double)>();
    return std::get<0>(op.call(x, shape, weight, bias, eps));
}

at::Tensor rms_norm_y(const at::Tensor &x, at::IntArrayRef shape, const std::optional<at::Tensor> &weight,
                      std::optional<double> eps) {
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opsmith::rms_norm", "").typed<
        std::tuple<at::Tensor, at::Tensor>(const at::Tensor &, at::IntArrayRef, const std::optional<at::Tensor> &,
                                           std::optional<double>)>();
    return std::get<0>(op.call(x, shape, weight, eps));
}

}  // namespace
