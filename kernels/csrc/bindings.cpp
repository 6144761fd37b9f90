// The Python module of the CPU kernels (cbbench/kernels/cpu_gemm.py builds and loads it).
#include <torch/extension.h>

torch::Tensor pack(const torch::Tensor& w);
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& panels,
                     const c10::optional<torch::Tensor>& bias, int64_t N,
                     const c10::optional<torch::Tensor>& residual);
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                                     const torch::Tensor& v_cache,
                                     const torch::Tensor& block_tables,
                                     const torch::Tensor& seq_lens, double scale);
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor argmax_rows(const torch::Tensor& x);
torch::Tensor silu_mul(const torch::Tensor& gu, int64_t I);
std::vector<int64_t> sample_rows(const torch::Tensor& x, const std::vector<int64_t>& rows,
                                 const std::vector<double>& temps, const std::vector<double>& u);
torch::Tensor rope_and_cache(const torch::Tensor& qkv, const torch::Tensor& cos,
                             const torch::Tensor& sin, torch::Tensor& k_cache,
                             torch::Tensor& v_cache, const torch::Tensor& slots, int64_t Hq,
                             int64_t Hkv, int64_t D);
void paged_prefill_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                             const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                             const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc,
                             double scale, torch::Tensor& out, int64_t min_qlen);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "W [N, K] -> panels [ceil(N/32), K, 32]",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear", &linear, "x @ W^T (+ bias) (+ residual) from panels", py::arg("x"),
        py::arg("panels"), py::arg("bias"), py::arg("N"), py::arg("residual") = py::none(),
        py::call_guard<py::gil_scoped_release>());
  m.def("silu_mul", &silu_mul, "gu [M, 2I] -> silu(gu[:, :I]) * gu[:, I:]",
        py::call_guard<py::gil_scoped_release>());
  m.def("paged_decode_attention", &paged_decode_attention,
        "q [B, Hq, D], caches [NB, BS, Hkv, D], block_tables [B, MB] int32, seq_lens [B] int32",
        py::call_guard<py::gil_scoped_release>());
  m.def("rms_norm", &rms_norm, "x [N, H] / rms * weight", py::call_guard<py::gil_scoped_release>());
  m.def("argmax_rows", &argmax_rows, "x [N, V] -> int64 [N], as torch.argmax(dim=-1)",
        py::call_guard<py::gil_scoped_release>());
  m.def("sample_rows", &sample_rows,
        "draw a token from softmax(x[rows] / temps) by inverse CDF at u; -1: not drawable here",
        py::call_guard<py::gil_scoped_release>());
  m.def("rope_and_cache", &rope_and_cache,
        "rotate q, k of a fused qkv row block, write k, v into their cache slots; returns q",
        py::call_guard<py::gil_scoped_release>());
  m.def("paged_prefill_attention", &paged_prefill_attention,
        "causal attention of every sequence with >= min_qlen queries into out (q's rows)",
        py::call_guard<py::gil_scoped_release>());
}
