// PROTOTYPE: softmax_bwd_row<ROW_FULL, C> at other launch bounds (blocks an SM)
#include "softmax.cu"
template <class T, int C, int TPB, int MINB>
__global__ void __launch_bounds__(TPB, MINB) bwd_any(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ dx,
                                                     long long rows, int cols) {
    softmax_bwd_row<ROW_FULL, C>(g, y, dx, rows, cols);
}
