// PyTorch custom ops over the installed aotriton C++ API (include/aotriton/flash.h).
//
//   torch.ops.aotriton.fwd(q, k, v, bias?, cu_seqlens_q?, cu_seqlens_k?, max_seqlen_q, max_seqlen_k,
//                          sm_scale, causal, window_left, window_right, align, dropout_p, allow_tf32,
//                          check_cu_seqlens=False, varlen_status?=None, softcap=0.0,
//                          alibi_slopes?=None, sinks?=None)
//       -> (out, lse, rng_state)
//   torch.ops.aotriton.bwd(dout, q, k, v, out, lse, bias?, bias_requires_grad, cu_seqlens_q?,
//                          cu_seqlens_k?, max_seqlen_q, max_seqlen_k, sm_scale, causal, window_left,
//                          window_right, align, dropout_p, rng_state, allow_tf32, deterministic,
//                          check_cu_seqlens=False, varlen_status?=None, softcap=0.0,
//                          alibi_slopes?=None, sinks?=None, dsinks(b!)?=None)
//       -> (dq, dk, dv, dbias)   (dsinks, fp32 [Hq], when given: overwritten with the sinks' gradient)
//   torch.ops.aotriton.fwd_fp8(q, k, v, q_descale, k_descale, v_descale, sm_scale, causal,
//                              window_left, window_right, align) -> (out, lse)
//       (float8_e4m3fn q/k/v, fp32 [B, Hk] descales, bf16 out; sm_90; forward only)
//   torch.ops.aotriton.fwd_kvcache(q, k_cache(a!), v_cache(b!), cache_seqlens, k_new?, v_new?, page_table?,
//                                  sm_scale, causal, window_left, window_right, num_splits, return_lse)
//       -> (out, lse)
//       (a decode step over a KV cache, flash.h KvCacheParams: token-major q (B, Sq, Hq, D), caches
//       (B, S_cache, Hk, D) or pages (N_PAGES, PAGE, Hk, D) with an int32 page table (B, MAX_PAGES),
//       int32 cache_seqlens (B) read on the device only; k_new/v_new (B, N_NEW, Hk, D) appended to
//       the caches in place; masks bottom-right; out (B, Sq, Hq, D) contiguous, lse fp32
//       (B, Hq, Sq), or an empty tensor without return_lse; the split partials' workspace from
//       torch's allocator; graph-capturable)
//   torch.ops.aotriton.dropout_mask(rng_state, batch, heads, seqlen_q, seqlen_k, dropout_p) -> mask
//   torch.ops.aotriton.dropout_offsets_consumed(batch, heads_q, seqlen_q, seqlen_k) -> int
//
// q/k/v/out are B x H x S x D views with a unit last stride (any other strides). A packed
// (varlen) batch passes [1, H, total, D] views plus int32 cu_seqlens. Its offsets are read by the
// kernels on the device. By default they are not checked: the kernels clamp every sequence to the
// packed tensors, so nothing outside them is read or written, but invalid offsets give clamped
// results, not an error. varlen_status (an int32 CUDA scalar the caller zeroes) then receives the
// library's bits (1: an offset outside [0, tokens], 2: offsets decrease, 4: a sequence longer
// than its max length) in stream order. check_cu_seqlens=True copies the offsets to the host first
// (one device-to-host copy, which waits for the stream; not allowed under CUDA graph capture) and
// the library checks them there: invalid offsets raise ValueError naming the problem and nothing
// is launched. dropout_p must be in [0, 1) (NaN and negative values are refused, never taken as
// "no dropout"). Outputs are allocated with
// torch's allocator: out and dq laid out like q, dk like k, dv like v where those are dense with a
// unit last stride (else B x S x H x D memory viewed as B x H x S x D),
// lse fp32 B x Hq x S, rng_state int64[2] = (seed, offset) the dropout used.
//
// Backend: AOTRITON_BACKEND=auto|portable|gluon in the environment (read once; default auto, the
// library's dispatch rule) forces every call onto one backend, for testing; a call the forced
// backend cannot serve raises. The Gluon backward's workspace comes from torch's allocator.
//
// Dropout randomness comes from torch's default CUDA generator of q's device: each forward with
// dropout_p > 0 advances its Philox offset by dropout_offsets_consumed(B, Hq, Sq, Sk) rounded up
// to a multiple of 4 (B = number of sequences, Sq/Sk = max lengths for packed batches). Under CUDA
// graph capture the kernels read the generator's graph-safe seed/offset device slots, so every
// replay uses fresh numbers; the forward writes the (seed, offset) it used into rng_state, which
// the backward reads, so forward and backward always agree.
#include <cstdio>
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <aotriton/flash.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace {

namespace flash = aotriton::v2::flash;
using aotriton::DType;
using aotriton::Status;

// AOTRITON_BACKEND, read once: auto (default), portable or gluon.
flash::Backend backend_from_env() {
  static const flash::Backend backend = [] {
    const char* env = std::getenv("AOTRITON_BACKEND");
    const std::string name = env ? env : "auto";
    if (name == "portable") return flash::Backend::kPortable;
    if (name == "gluon") return flash::Backend::kGluon;
    TORCH_CHECK_VALUE(name == "auto" || name.empty(), "aotriton: AOTRITON_BACKEND must be auto, portable or gluon, got ",
                      name);
    return flash::Backend::kAuto;
  }();
  return backend;
}
using at::Tensor;

DType dtype_of(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kFloat:
      return DType::kFloat32;
    case at::kInt:
      return DType::kInt32;
    case at::kFloat8_e4m3fn:
      return DType::kFloat8E4M3;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "aotriton: ", name, " has dtype ", t.scalar_type(),
                                  "; supported: float16, bfloat16, float32 (float8_e4m3fn: fwd_fp8)");
  }
}

template <int R>
aotriton::TensorView<R> view_of(const Tensor& t, const char* name) {
  aotriton::TensorView<R> v;
  if (!t.defined()) return v;
  TORCH_CHECK_VALUE(t.dim() == R, "aotriton: ", name, " must have ", R, " dims, got ", t.dim());
  v.data = t.data_ptr();
  for (int d = 0; d < R; ++d) {
    v.sizes[d] = static_cast<uint64_t>(t.size(d));
    v.strides[d] = t.stride(d);
  }
  v.dtype = dtype_of(t, name);
  return v;
}

void check_cuda(const Tensor& t, const Tensor& q, const char* name) {
  if (!t.defined()) return;
  TORCH_CHECK(t.is_cuda(), "aotriton: ", name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == q.device(), "aotriton: ", name, " is on ", t.device(), " but q is on ",
              q.device());
}

// A non-success Status becomes a Python exception of a fitting type with aotriton's message.
// The workspace a call needs (`bytes`, 0 = none) from torch's caching allocator (stream-ordered, so
// graph-safe), set into `p`. The caller holds the returned tensor until the launch is enqueued.
template <typename Params>
Tensor give_workspace(Params& p, uint64_t bytes, const Tensor& like) {
  Tensor workspace;
  if (bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
    p.workspace_bytes = bytes;
  }
  return workspace;
}

void check_status(Status st, const char* op) {
  if (st == Status::kSuccess) return;
  const std::string msg = std::string("aotriton ") + op + " failed (" + aotriton::status_name(st) +
                          "): " + aotriton::last_error_message();
  switch (st) {
    case Status::kUnsupportedHeadDim:
    case Status::kUnsupportedDType:
    case Status::kUnsupportedGpu:
    case Status::kKernelNotFound:
      TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
    case Status::kDTypeMismatch:
      TORCH_CHECK_TYPE(false, msg);
    case Status::kInvalidArgument:
    case Status::kShapeMismatch:
    case Status::kBadStrides:
    case Status::kEmptyInput:
    case Status::kTooLarge:
    case Status::kNullPointer:
    case Status::kMisalignedPointer:
      TORCH_CHECK_VALUE(false, msg);
    default:
      TORCH_CHECK(false, msg);
  }
}

aotriton::Stream current_stream(const Tensor& q) {
  return aotriton::Stream{c10::cuda::getCurrentCUDAStream(q.device().index()).stream()};
}

flash::MaskAlign align_of(int64_t align) {
  TORCH_CHECK_VALUE(align == 0 || align == 1,
                    "aotriton: align must be 0 (top-left) or 1 (bottom-right), got ", align);
  return align == 0 ? flash::MaskAlign::kTopLeft : flash::MaskAlign::kBottomRight;
}

int32_t window_of(int64_t w, const char* name) {
  TORCH_CHECK_VALUE(w >= -1 && w <= INT32_MAX, "aotriton: ", name, " must be -1 or >= 0, got ", w);
  return static_cast<int32_t>(w);
}

// An output with the sizes of `like` (B x H x S x D) laid out as `like` is when that is dense
// with a unit last stride (out like q, dq/dk/dv like q/k/v: autograd then hands each gradient to
// its input without a layout copy, whichever of (B,H,S,D) or (B,S,H,D) memory the caller has);
// otherwise B x S x H x D memory viewed as B x H x S x D. `d` >= 0: that head dim instead of
// like's (the output of a call whose V has its own head dim), in like's (B,H,S,D) or (B,S,H,D)
// order. `dtype`: the output's, when not like's (the fp8 forward's bf16 O).
Tensor alloc_like(const Tensor& like, bool zero, int64_t d = -1,
                  c10::optional<at::ScalarType> dtype = c10::nullopt) {
  const bool dense = like.is_non_overlapping_and_dense() && like.stride(-1) == 1;
  const auto opts = like.options().dtype(dtype.value_or(like.scalar_type()));
  if (dense && (d < 0 || d == like.size(3))) {
    Tensor t = at::empty_like(like, opts, at::MemoryFormat::Preserve);
    return zero ? t.zero_() : t;
  }
  const auto b = like.size(0), h = like.size(1), s = like.size(2);
  if (d < 0) d = like.size(3);
  if (dense && like.stride(1) >= like.stride(2)) {  // (B,H,S,D) memory
    return zero ? at::zeros({b, h, s, d}, opts) : at::empty({b, h, s, d}, opts);
  }
  Tensor t = zero ? at::zeros({b, s, h, d}, opts) : at::empty({b, s, h, d}, opts);
  return t.transpose(1, 2);
}

struct Problem {
  bool varlen = false;
  int64_t batch = 0, heads_q = 0, heads_k = 0, seqlen_q = 0, seqlen_k = 0, head_dim = 0;
};

Problem problem_of(const Tensor& q, const Tensor& k, const c10::optional<Tensor>& cu_q,
                   const c10::optional<Tensor>& cu_k, int64_t max_q, int64_t max_k) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4,
                    "aotriton: q and k must be 4-D (B x H x S x D) views, got ", q.sizes(), " and ",
                    k.sizes());
  Problem p;
  p.varlen = cu_q.has_value() && cu_q->defined();
  TORCH_CHECK_VALUE(p.varlen == (cu_k.has_value() && cu_k->defined()),
                    "aotriton: give both cu_seqlens_q and cu_seqlens_k, or neither");
  p.heads_q = q.size(1);
  p.heads_k = k.size(1);
  p.head_dim = q.size(3);
  if (p.varlen) {
    for (const Tensor* cu : {&*cu_q, &*cu_k}) {
      check_cuda(*cu, q, "cu_seqlens");
      TORCH_CHECK_TYPE(cu->scalar_type() == at::kInt, "aotriton: cu_seqlens must be int32, got ",
                       cu->scalar_type());
      TORCH_CHECK_VALUE(cu->dim() == 1, "aotriton: cu_seqlens must be 1-D");
    }
    TORCH_CHECK_VALUE(cu_q->size(0) >= 2 && cu_q->size(0) == cu_k->size(0),
                      "aotriton: cu_seqlens_q and cu_seqlens_k must each hold B+1 >= 2 offsets, got ",
                      cu_q->size(0), " and ", cu_k->size(0));
    TORCH_CHECK_VALUE(max_q > 0 && max_k > 0, "aotriton: max_seqlen_q/k must be > 0 for a packed batch");
    p.batch = cu_q->size(0) - 1;
    p.seqlen_q = max_q;
    p.seqlen_k = max_k;
  } else {
    p.batch = q.size(0);
    p.seqlen_q = q.size(2);
    p.seqlen_k = k.size(2);
  }
  return p;
}

// How far a dropout call advances torch's generator. An overflow raises: a wrapped increment
// would leave the generator where it is and repeat the masks.
uint64_t philox_increment(const Problem& p) {
  uint64_t n = 0;
  check_status(flash::dropout_offsets_consumed(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, &n),
               "dropout_offsets_consumed");
  TORCH_CHECK_VALUE(n <= UINT64_MAX - 3, "aotriton: dropout would consume ", n,
                    " Philox counters; rounded up to a multiple of 4 that overflows 64 bits");
  return (n + 3) / 4 * 4;
}

void check_dropout_p(double dropout_p) {
  if (dropout_p >= 0.0 && dropout_p < 1.0) return;
  // Formatted here: handing the double to TORCH_CHECK_VALUE's message builder crashed (SIGSEGV)
  // with torch 2.11 on the H200 machine, while preformatted messages raise as they should.
  char value[48];
  std::snprintf(value, sizeof value, "%g", dropout_p);
  TORCH_CHECK_VALUE(false, std::string("aotriton: dropout_p must be in [0, 1), got ") + value);
}

// The packed batch's offsets, host copies and status word, set on FwdParams or BwdParams.
// Returns the host copy (both arrays back to back), which must outlive the call.
template <typename Params>
Tensor set_varlen(Params& p, const Problem& pr, const Tensor& q, const c10::optional<Tensor>& cu_seqlens_q,
                  const c10::optional<Tensor>& cu_seqlens_k, bool check_cu_seqlens,
                  const c10::optional<Tensor>& varlen_status) {
  const bool has_status = varlen_status.has_value() && varlen_status->defined();
  if (!pr.varlen) {
    TORCH_CHECK_VALUE(!check_cu_seqlens && !has_status,
                      "aotriton: check_cu_seqlens and varlen_status are for packed (varlen) batches only");
    return Tensor();
  }
  p.cu_seqlens_q = view_of<1>(*cu_seqlens_q, "cu_seqlens_q");
  p.cu_seqlens_k = view_of<1>(*cu_seqlens_k, "cu_seqlens_k");
  p.max_seqlen_q = static_cast<uint64_t>(pr.seqlen_q);
  p.max_seqlen_k = static_cast<uint64_t>(pr.seqlen_k);
  if (has_status) {
    check_cuda(*varlen_status, q, "varlen_status");
    TORCH_CHECK_VALUE(varlen_status->scalar_type() == at::kInt && varlen_status->numel() == 1,
                      "aotriton: varlen_status must be a one-element int32 tensor, got ",
                      varlen_status->scalar_type(), " ", varlen_status->sizes());
    p.varlen_status = varlen_status->data_ptr<int32_t>();
  }
  if (!check_cu_seqlens) return Tensor();
  // One copy of both arrays, on the current stream (after whatever wrote them), which waits.
  Tensor host = at::cat({*cu_seqlens_q, *cu_seqlens_k}).cpu();
  const int64_t n_q = cu_seqlens_q->numel();
  p.cu_seqlens_q_host = host.data_ptr<int32_t>();
  p.cu_seqlens_k_host = host.data_ptr<int32_t>() + n_q;
  p.cu_seqlens_q_host_count = static_cast<uint64_t>(n_q);
  p.cu_seqlens_k_host_count = static_cast<uint64_t>(cu_seqlens_k->numel());
  return host;
}

std::tuple<Tensor, Tensor, Tensor> fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const c10::optional<Tensor>& bias,
                                            const c10::optional<Tensor>& cu_seqlens_q,
                                            const c10::optional<Tensor>& cu_seqlens_k,
                                            int64_t max_seqlen_q, int64_t max_seqlen_k,
                                            double sm_scale, bool causal, int64_t window_left,
                                            int64_t window_right, int64_t align, double dropout_p,
                                            bool allow_tf32, bool check_cu_seqlens,
                                            const c10::optional<Tensor>& varlen_status, double softcap,
                                            const c10::optional<Tensor>& alibi_slopes,
                                            const c10::optional<Tensor>& sinks) {
  TORCH_CHECK(q.is_cuda(), "aotriton: q must be a CUDA tensor, got device ", q.device());
  check_dropout_p(dropout_p);
  check_cuda(k, q, "k");
  check_cuda(v, q, "v");
  if (bias.has_value()) check_cuda(*bias, q, "bias");
  if (alibi_slopes.has_value()) check_cuda(*alibi_slopes, q, "alibi_slopes");
  if (sinks.has_value()) check_cuda(*sinks, q, "sinks");
  const c10::cuda::CUDAGuard guard(q.device());
  const Problem pr = problem_of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);

  // Rows of a packed tensor past the last sequence are not written by the kernels: zero them.
  Tensor out = alloc_like(q, pr.varlen, v.size(3));  // O has V's head dim
  Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  Tensor rng_state = at::zeros({2}, q.options().dtype(at::kLong));

  flash::FwdParams p;
  p.q = view_of<4>(q, "q");
  p.k = view_of<4>(k, "k");
  p.v = view_of<4>(v, "v");
  p.o = view_of<4>(out, "out");
  p.lse = view_of<3>(lse, "lse");
  p.sm_scale = static_cast<float>(sm_scale);
  p.softcap = static_cast<float>(softcap);
  p.causal = causal;
  p.align = align_of(align);
  p.window_left = window_of(window_left, "window_left");
  p.window_right = window_of(window_right, "window_right");
  if (bias.has_value() && bias->defined()) p.bias = view_of<4>(*bias, "bias");
  if (alibi_slopes.has_value() && alibi_slopes->defined()) p.alibi_slopes = view_of<2>(*alibi_slopes, "alibi_slopes");
  if (sinks.has_value() && sinks->defined()) p.sinks = view_of<1>(*sinks, "sinks");
  const Tensor host_offsets =
      set_varlen(p, pr, q, cu_seqlens_q, cu_seqlens_k, check_cu_seqlens, varlen_status);
  p.allow_tf32 = allow_tf32;
  p.backend = backend_from_env();

  Tensor philox_in;  // keeps the host-mode seed/offset alive until the launch is enqueued
  if (dropout_p > 0.0) {
    auto gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
        c10::nullopt, at::cuda::detail::getDefaultCUDAGenerator(q.device().index()));
    at::PhiloxCudaState st;
    {
      std::lock_guard<std::mutex> lock(gen->mutex_);
      st = gen->philox_cuda_state(philox_increment(pr));
    }
    if (st.captured_) {
      // CUDA graph capture: device slots the graph refreshes before every replay.
      p.philox_seed = st.seed_.ptr;
      p.philox_offset = st.offset_.ptr;
      p.philox_offset_base = st.offset_intragraph_;
    } else {
      philox_in = at::empty({2}, q.options().dtype(at::kLong));
      philox_in.select(0, 0).fill_(static_cast<int64_t>(st.seed_.val));
      philox_in.select(0, 1).fill_(static_cast<int64_t>(st.offset_.val));
      p.philox_seed = philox_in.data_ptr<int64_t>();
      p.philox_offset = philox_in.data_ptr<int64_t>() + 1;
      p.philox_offset_base = 0;
    }
    p.dropout_p = static_cast<float>(dropout_p);
    p.philox_seed_out = rng_state.data_ptr<int64_t>();
    p.philox_offset_out = rng_state.data_ptr<int64_t>() + 1;
  }
  check_status(flash::attn_fwd(p, current_stream(q)), "attn_fwd");
  return {out, lse, rng_state};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> bwd_cuda(
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
    const Tensor& lse, const c10::optional<Tensor>& bias, bool bias_requires_grad,
    const c10::optional<Tensor>& cu_seqlens_q, const c10::optional<Tensor>& cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double sm_scale, bool causal, int64_t window_left,
    int64_t window_right, int64_t align, double dropout_p, const Tensor& rng_state,
    bool allow_tf32, bool deterministic, bool check_cu_seqlens, const c10::optional<Tensor>& varlen_status,
    double softcap, const c10::optional<Tensor>& alibi_slopes, const c10::optional<Tensor>& sinks,
    const c10::optional<Tensor>& dsinks) {
  TORCH_CHECK(q.is_cuda(), "aotriton: q must be a CUDA tensor, got device ", q.device());
  check_dropout_p(dropout_p);
  for (auto [t, name] : {std::pair<const Tensor*, const char*>{&dout, "dout"}, {&k, "k"}, {&v, "v"},
                         {&out, "out"}, {&lse, "lse"}, {&rng_state, "rng_state"}}) {
    check_cuda(*t, q, name);
  }
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) check_cuda(*bias, q, "bias");
  if (alibi_slopes.has_value()) check_cuda(*alibi_slopes, q, "alibi_slopes");
  if (sinks.has_value()) check_cuda(*sinks, q, "sinks");
  if (dsinks.has_value()) check_cuda(*dsinks, q, "dsinks");
  TORCH_CHECK_VALUE(!bias_requires_grad || has_bias,
                    "aotriton: bias_requires_grad is set but no bias is given");
  const c10::cuda::CUDAGuard guard(q.device());
  const Problem pr = problem_of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);

  // Packed batches: rows past the last sequence get no gradient from the kernels; zero them.
  Tensor dq = alloc_like(q, pr.varlen);
  Tensor dk = alloc_like(k, pr.varlen);
  Tensor dv = alloc_like(v, pr.varlen);
  Tensor delta = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  Tensor dbias = bias_requires_grad ? at::empty(bias->sizes(), bias->options())
                                    : at::empty({0}, q.options());

  flash::BwdParams p;
  p.q = view_of<4>(q, "q");
  p.k = view_of<4>(k, "k");
  p.v = view_of<4>(v, "v");
  p.o = view_of<4>(out, "out");
  p.d_o = view_of<4>(dout, "dout");
  p.lse = view_of<3>(lse, "lse");
  p.delta = view_of<3>(delta, "delta");
  p.dq = view_of<4>(dq, "dq");
  p.dk = view_of<4>(dk, "dk");
  p.dv = view_of<4>(dv, "dv");
  p.sm_scale = static_cast<float>(sm_scale);
  p.softcap = static_cast<float>(softcap);
  p.causal = causal;
  p.align = align_of(align);
  p.window_left = window_of(window_left, "window_left");
  p.window_right = window_of(window_right, "window_right");
  if (has_bias) p.bias = view_of<4>(*bias, "bias");
  if (bias_requires_grad) p.dbias = view_of<4>(dbias, "dbias");
  if (alibi_slopes.has_value() && alibi_slopes->defined()) p.alibi_slopes = view_of<2>(*alibi_slopes, "alibi_slopes");
  if (sinks.has_value() && sinks->defined()) p.sinks = view_of<1>(*sinks, "sinks");
  if (dsinks.has_value() && dsinks->defined()) p.dsinks = view_of<1>(*dsinks, "dsinks");
  const Tensor host_offsets =
      set_varlen(p, pr, q, cu_seqlens_q, cu_seqlens_k, check_cu_seqlens, varlen_status);
  if (dropout_p > 0.0) {
    TORCH_CHECK_VALUE(rng_state.scalar_type() == at::kLong && rng_state.numel() == 2 &&
                          rng_state.is_contiguous(),
                      "aotriton: rng_state must be the forward's int64[2] (seed, offset)");
    p.dropout_p = static_cast<float>(dropout_p);
    p.philox_seed = rng_state.data_ptr<int64_t>();
    p.philox_offset = rng_state.data_ptr<int64_t>() + 1;
    p.philox_offset_base = 0;
  }
  p.allow_tf32 = allow_tf32;
  p.deterministic = deterministic;
  p.backend = backend_from_env();
  // The workspace the chosen backend needs (0 = none).
  uint64_t workspace_bytes = 0;
  check_status(flash::attn_bwd_workspace_bytes(p, current_stream(q), &workspace_bytes), "attn_bwd_workspace_bytes");
  const Tensor workspace = give_workspace(p, workspace_bytes, q);
  check_status(flash::attn_bwd(p, current_stream(q)), "attn_bwd");
  return {dq, dk, dv, dbias};
}

Tensor dropout_mask_cuda(const Tensor& rng_state, int64_t batch, int64_t heads, int64_t seqlen_q,
                         int64_t seqlen_k, double dropout_p) {
  TORCH_CHECK(rng_state.is_cuda(), "aotriton: rng_state must be a CUDA tensor");
  TORCH_CHECK_VALUE(rng_state.scalar_type() == at::kLong && rng_state.numel() == 2 &&
                        rng_state.is_contiguous(),
                    "aotriton: rng_state must be an int64[2] (seed, offset) tensor");
  const c10::cuda::CUDAGuard guard(rng_state.device());
  Tensor mask = at::empty({batch, heads, seqlen_q, seqlen_k}, rng_state.options().dtype(at::kFloat));
  check_status(flash::debug_dropout_mask(view_of<4>(mask, "mask"), static_cast<float>(dropout_p),
                                         rng_state.data_ptr<int64_t>(),
                                         rng_state.data_ptr<int64_t>() + 1, 0,
                                         current_stream(rng_state)),
               "debug_dropout_mask");
  return mask;
}

int64_t dropout_offsets_consumed(int64_t batch, int64_t heads_q, int64_t seqlen_q,
                                 int64_t seqlen_k) {
  TORCH_CHECK_VALUE(batch >= 0 && heads_q >= 0 && seqlen_q >= 0 && seqlen_k >= 0,
                    "aotriton: dropout_offsets_consumed takes sizes >= 0, got ", batch, ", ", heads_q, ", ",
                    seqlen_q, ", ", seqlen_k);
  uint64_t n = 0;
  check_status(flash::dropout_offsets_consumed(batch, heads_q, seqlen_q, seqlen_k, &n), "dropout_offsets_consumed");
  TORCH_CHECK_VALUE(n <= static_cast<uint64_t>(INT64_MAX), "aotriton: ", n,
                    " dropout counters do not fit a 64-bit signed int");
  return static_cast<int64_t>(n);
}

// The fp8 forward (flash.h, Fp8FwdParams): q, k, v float8_e4m3fn B x H x S x D, descales fp32
// [B, Hk]; out bf16 laid out like q, lse fp32 B x Hq x Sq. Vᵀ's workspace from torch's allocator.
std::tuple<Tensor, Tensor> fwd_fp8_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& q_descale, const Tensor& k_descale,
                                        const Tensor& v_descale, double sm_scale, bool causal,
                                        int64_t window_left, int64_t window_right, int64_t align) {
  TORCH_CHECK(q.is_cuda(), "aotriton: q must be a CUDA tensor, got device ", q.device());
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{k, "k"}, {v, "v"}, {q_descale, "q_descale"},
                                {k_descale, "k_descale"}, {v_descale, "v_descale"}}) {
    check_cuda(t, q, name);
  }
  TORCH_CHECK_VALUE(q.dim() == 4, "aotriton: q must be 4-D (B x H x S x D), got ", q.sizes());
  const c10::cuda::CUDAGuard guard(q.device());
  Tensor out = alloc_like(q, false, -1, at::kBFloat16);
  Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  flash::Fp8FwdParams p;
  p.q = view_of<4>(q, "q");
  p.k = view_of<4>(k, "k");
  p.v = view_of<4>(v, "v");
  p.o = view_of<4>(out, "out");
  p.lse = view_of<3>(lse, "lse");
  p.q_descale = view_of<2>(q_descale, "q_descale");
  p.k_descale = view_of<2>(k_descale, "k_descale");
  p.v_descale = view_of<2>(v_descale, "v_descale");
  p.sm_scale = static_cast<float>(sm_scale);
  p.causal = causal;
  p.align = align_of(align);
  p.window_left = window_of(window_left, "window_left");
  p.window_right = window_of(window_right, "window_right");
  uint64_t bytes = 0;
  check_status(flash::attn_fwd_fp8_workspace_bytes(p.k, &bytes), "fwd_fp8");
  const Tensor workspace = give_workspace(p, bytes, q);
  check_status(flash::attn_fwd_fp8(p, current_stream(q)), "fwd_fp8");
  return {out, lse};
}

// The KV-cache decode step (flash.h, KvCacheParams). Nothing here reads a device value on the host
// (cache_seqlens and the page ids stay on the device), so the call can be captured in a CUDA graph;
// the split count and the workspace size depend on shapes and the device only.
std::tuple<Tensor, Tensor> fwd_kvcache_cuda(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                            const Tensor& cache_seqlens, const c10::optional<Tensor>& k_new,
                                            const c10::optional<Tensor>& v_new,
                                            const c10::optional<Tensor>& page_table, double sm_scale, bool causal,
                                            int64_t window_left, int64_t window_right, int64_t num_splits,
                                            bool return_lse) {
  TORCH_CHECK(q.is_cuda(), "aotriton: q must be a CUDA tensor, got device ", q.device());
  check_cuda(k_cache, q, "k_cache");
  check_cuda(v_cache, q, "v_cache");
  check_cuda(cache_seqlens, q, "cache_seqlens");
  const bool has_k_new = k_new.has_value() && k_new->defined();
  const bool has_v_new = v_new.has_value() && v_new->defined();
  const bool paged = page_table.has_value() && page_table->defined();
  TORCH_CHECK_VALUE(has_k_new == has_v_new, "aotriton: k_new and v_new go together: give both or neither");
  if (has_k_new) {
    check_cuda(*k_new, q, "k_new");
    check_cuda(*v_new, q, "v_new");
  }
  if (paged) check_cuda(*page_table, q, "page_table");
  TORCH_CHECK_VALUE(q.dim() == 4, "aotriton: q must be 4-D (B x Sq x Hq x D), got ", q.sizes());
  TORCH_CHECK_VALUE(num_splits >= 0 && num_splits <= flash::kKvCacheMaxSplits, "aotriton: num_splits must be in 0..",
                    flash::kKvCacheMaxSplits, " (0: the library's rule), got ", num_splits);
  const c10::cuda::CUDAGuard guard(q.device());
  Tensor out = at::empty(q.sizes(), q.options());
  Tensor lse = return_lse ? at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat))
                          : at::empty({0}, q.options().dtype(at::kFloat));
  flash::KvCacheParams p;
  p.q = view_of<4>(q, "q");
  p.k_cache = view_of<4>(k_cache, "k_cache");
  p.v_cache = view_of<4>(v_cache, "v_cache");
  if (paged) p.page_table = view_of<2>(*page_table, "page_table");
  p.cache_seqlens = view_of<1>(cache_seqlens, "cache_seqlens");
  if (has_k_new) {
    p.k_new = view_of<4>(*k_new, "k_new");
    p.v_new = view_of<4>(*v_new, "v_new");
  }
  p.o = view_of<4>(out, "out");
  if (return_lse) p.lse = view_of<3>(lse, "lse");
  p.sm_scale = static_cast<float>(sm_scale);
  p.causal = causal;
  p.window_left = window_of(window_left, "window_left");
  p.window_right = window_of(window_right, "window_right");
  p.num_splits = static_cast<uint32_t>(num_splits);
  // The split partials' workspace (0 bytes: one split).
  uint64_t bytes = 0;
  check_status(flash::attn_fwd_kvcache_workspace_bytes(p, current_stream(q), &bytes), "attn_fwd_kvcache_workspace_bytes");
  const Tensor workspace = give_workspace(p, bytes, q);
  check_status(flash::attn_fwd_kvcache(p, current_stream(q)), "attn_fwd_kvcache");
  return {out, lse};
}

std::string library_version() { return aotriton::version(); }

}  // namespace

TORCH_LIBRARY(aotriton, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, float sm_scale, bool causal, int window_left, "
      "int window_right, int align, float dropout_p, bool allow_tf32, bool check_cu_seqlens=False, "
      "Tensor(a!)? varlen_status=None, float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None) "
      "-> (Tensor, Tensor, Tensor)",
      {at::Tag::nondeterministic_seeded});
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? bias, "
      "bool bias_requires_grad, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, float sm_scale, bool causal, int window_left, int window_right, "
      "int align, float dropout_p, Tensor rng_state, bool allow_tf32, bool deterministic, "
      "bool check_cu_seqlens=False, Tensor(a!)? varlen_status=None, float softcap=0.0, "
      "Tensor? alibi_slopes=None, Tensor? sinks=None, Tensor(b!)? dsinks=None) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "dropout_mask(Tensor rng_state, int batch, int heads, int seqlen_q, int seqlen_k, "
      "float dropout_p) -> Tensor");
  m.def(
      "fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor q_descale, Tensor k_descale, Tensor v_descale, "
      "float sm_scale, bool causal, int window_left, int window_right, int align) -> (Tensor, Tensor)");
  m.def(
      "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, Tensor? k_new, "
      "Tensor? v_new, Tensor? page_table, float sm_scale, bool causal, int window_left, int window_right, "
      "int num_splits, bool return_lse) -> (Tensor, Tensor)");
  m.def("dropout_offsets_consumed(int batch, int heads_q, int seqlen_q, int seqlen_k) -> int",
        &dropout_offsets_consumed);
  m.def("version() -> str", &library_version);
}

TORCH_LIBRARY_IMPL(aotriton, CUDA, m) {
  m.impl("fwd", &fwd_cuda);
  m.impl("bwd", &bwd_cuda);
  m.impl("dropout_mask", &dropout_mask_cuda);
  m.impl("fwd_fp8", &fwd_fp8_cuda);
  m.impl("fwd_kvcache", &fwd_kvcache_cuda);
}

// A Python module too, so that `import aotriton._C` loads the library (and registers the ops).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "aotriton torch ops (registered as torch.ops.aotriton.*)";
  m.def("version", &library_version);
  m.def("dropout_offsets_consumed", &dropout_offsets_consumed);
}
