from opsmith._build import _nvrtc
from opsmith.ops import _sources
EXTRA = '''
template <class T, class A>
__global__ void __launch_bounds__(1024, 1)
layer_norm_fwd_c8m_full(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                   A* __restrict__ mean, A* __restrict__ rstd, long long rows, int cols, A eps, int has_w, int has_b) {
    layer_norm_fwd_row<ROW_FULL, 2, T, A, 8>(x, w, b, y, mean, rstd, rows, cols, eps, has_w, has_b);
}
template <class T, class A>
__global__ void __launch_bounds__(1024, 1)
rms_norm_fwd_c8m_full(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, A* __restrict__ rstd,
                 long long rows, int cols, A eps, int has_w) {
    rms_norm_fwd_row<ROW_FULL, T, A, 8>(x, w, y, rstd, rows, cols, eps, has_w);
}
'''
names = ["layer_norm_fwd_c8m_full<float, float>", "rms_norm_fwd_c8m_full<float, float>"]
src = (_sources.KERNEL_DIR / "norm.cu").read_text() + EXTRA
r = _nvrtc.compile_cuda(src, arch="sm_90", name_expressions=names, options=["--ptxas-options=-v"], include_paths=[str(_sources.KERNEL_DIR)])
cur = None
for l in r.log.splitlines():
    if "Compiling entry" in l: cur = l.split("'")[1][:30]
    if ("spill" in l or "Used" in l) and cur and "c8m" in cur: print(cur, l.strip()[-70:])
