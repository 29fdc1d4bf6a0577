// FlashAttention operators.
//
// Layouts: q is B x Hq x Sq x D, k B x Hk x Sk x D and v B x Hk x Sk x Dv (Dv = D, or V's own
// head dim: o, d_o and dv follow it; compiled for fp16/bf16 with D/Dv in the buckets 256/128, as
// DeepSeek-style MLA's 192/128, and 128/64), views with any element strides whose
// last stride is 1 (B x H x S x D and B x S x H x D memory both work). lse is a B x Hq x Sq fp32
// view (last stride 1) holding, per query row, the natural-log log-sum-exp of the row's scaled
// scores over the keys it sees (+inf if it sees none).
#pragma once

#include <cstdint>
#include <limits>

#include "aotriton/config.h"
#include "aotriton/dtypes.h"
#include "aotriton/hip_error.h"
#include "aotriton/runtime.h"
#include "aotriton/util.h"

namespace aotriton {
namespace v2 {
namespace flash {

// Where a mask's diagonal sits when Sq != Sk.
enum class MaskAlign : int32_t {
  kTopLeft = 0,      // query i's diagonal key is i
  kBottomRight = 1,  // query i's diagonal key is i + Sk - Sq (torch's causal_lower_right)
};

// Which kernel family serves a call. kAuto picks the sm_90 Gluon kernels when all of these hold,
// else the portable ones: the stream's device is sm_90 and this build has the Gluon kernels for
// the dtype and head dim; fp16/bf16; head dim <= 256; no dropout in a forward with a window
// (causal included: measured faster on the portable kernels; kGluon serves it, with the same masks),
// no bias, no softcap, ALiBi or sinks (packed (varlen) batches of at most 2^30 tokens included);
// forward: sm_scale > 0; every tensor TMA can address (data 16-byte aligned, last stride
// 1, other strides multiples of 16 bytes, dims of size 1 excepted); backward: a workspace of at
// least attn_bwd_workspace_bytes() bytes. A forced backend that cannot serve the call returns
// kUnsupportedByBackend (message: the reason) and launches nothing.
enum class Backend : int32_t {
  kAuto = 0,
  kPortable = 1,  // triton.language kernels: every arch, every feature
  kGluon = 2,     // sm_90 Gluon kernels (TMA, warp-specialized)
};

// Packed (varlen) batches: bits the kernels OR into FwdParams/BwdParams::varlen_status when the
// device offsets cu_seqlens_q/k were invalid and had to be clamped (see FwdParams).
constexpr int32_t kVarlenOffsetOutOfRange = 1;  // an offset outside [0, tokens] of its packed tensor
constexpr int32_t kVarlenDecreasing = 2;        // offsets decrease (that sequence taken as empty)
constexpr int32_t kVarlenTooLong = 4;           // a sequence longer than max_seqlen_q/k (cut there)

// Versioned parameters: `version` tells the library which fields the caller's header had.
// Later versions only append fields, so a program built against an older header keeps working
// (the library reads only the fields of the caller's version and defaults the rest).
//
// Masks: query i sees key j iff  i + off - window_left <= j <= i + off + window_right,  where
// off = 0 (kTopLeft) or Sk - Sq (kBottomRight) and -1 leaves a side unbounded. `causal` sets
// window_right to 0. A query row that sees no key gets O = 0 and LSE = +inf.
struct FwdParams {
  static constexpr uint32_t kVersion = 8;
  uint32_t version = kVersion;

  // -- version 1 --
  TensorView<4> q;    // B x Hq x Sq x D, fp16, bf16 (or fp32 since version 3); D % 8 == 0, <= 256 (<= 512 for fp16/bf16)
  TensorView<4> k;    // B x Hk x Sk x D, same dtype; Hq a multiple of Hk (GQA, MQA)
  TensorView<4> v;    // B x Hk x Sk x Dv, same dtype (Dv: see the top of this file)
  TensorView<4> o;    // B x Hq x Sq x Dv output, same dtype
  TensorView<3> lse;  // B x Hq x Sq fp32 output; since version 2 a null data pointer = not wanted
  // Scale of q.k; must be set (typically 1/sqrt(D)): NaN is rejected as "not set".
  float sm_scale = std::numeric_limits<float>::quiet_NaN();
  bool causal = false;

  // -- version 2 --
  MaskAlign align = MaskAlign::kTopLeft;
  int32_t window_left = -1;
  int32_t window_right = -1;

  // -- version 3 --
  // Additive bias in the input dtype, sizes [B or 1, Hq or 1, Sq or 1, Sk] (1 = broadcast);
  // null data = none.
  TensorView<4> bias;
  // Dropout (drop probability, 0 = off). Philox seed and offset are device addresses of u64s,
  // read by the kernels (graph replays pick up new values); offset_base is added to *offset.
  // One call consumes dropout_offsets_consumed(B, Hq, Sq, Sk) counters. If both *_out are
  // non-null the seed and offset used are written there.
  float dropout_p = 0.0f;
  const void* philox_seed = nullptr;
  const void* philox_offset = nullptr;
  uint64_t philox_offset_base = 0;
  void* philox_seed_out = nullptr;
  void* philox_offset_out = nullptr;
  // Packed variable-length batch (null cu_seqlens_q data = not packed): q/o are
  // [1, Hq, total_q, D] views, k/v [1, Hk, total_k, D], lse [1, Hq, total_q]; cu_seqlens are
  // int32 B+1 offsets (B <= 65535) on the device, sequence b owning tokens cu[b] .. cu[b+1].
  //
  // The kernels read the offsets from the device. Without host copies they clamp them to the
  // packed tensors (0 <= start <= end <= tokens, length <= max_seqlen): nothing outside the
  // tensors is read or written whatever the offsets hold, but invalid offsets give clamped
  // results, not an error; set varlen_status (version 5) to learn that it happened. With host
  // copies (both, or neither) the offsets are checked on the host first (start at 0,
  // non-decreasing, within the tensors, no sequence above the max lengths): a violation is an
  // error and nothing is launched. The host arrays need to stay valid during the call only; they hold
  // cu_seqlens_q_host_count / cu_seqlens_k_host_count entries (version 5; for a caller of an
  // older header, cu_seqlens_q.sizes[0] / cu_seqlens_k.sizes[0]); the library reads no more, and
  // refuses more than 65536 before reading any.
  TensorView<1> cu_seqlens_q;
  TensorView<1> cu_seqlens_k;
  uint64_t max_seqlen_q = 0;
  uint64_t max_seqlen_k = 0;
  const int32_t* cu_seqlens_q_host = nullptr;
  const int32_t* cu_seqlens_k_host = nullptr;
  // fp32 inputs: allow TF32 matrix products (default: IEEE fp32).
  bool allow_tf32 = false;

  // -- version 4 --
  Backend backend = Backend::kAuto;

  // -- version 5 --
  // Entries in cu_seqlens_q_host / cu_seqlens_k_host (must be B+1). 0 = the old contract:
  // cu_seqlens_q.sizes[0] / cu_seqlens_k.sizes[0] entries.
  uint64_t cu_seqlens_q_host_count = 0;
  uint64_t cu_seqlens_k_host_count = 0;
  // Packed batches: device address of an int32 word (4-byte aligned; null = not recorded) into
  // which the kernels OR kVarlenOffsetOutOfRange, kVarlenDecreasing or kVarlenTooLong when they
  // had to clamp an offset. Zero it before the call and read it after (in stream order); it is
  // written only on a violation. Ignored when not packed.
  int32_t* varlen_status = nullptr;

  // -- version 6 --
  // Logit soft-capping (Gemma 2, Grok): each score s = sm_scale * q.k becomes
  // softcap * tanh(s / softcap) before bias and mask. 0 = off; otherwise finite and positive,
  // fp16/bf16 inputs without dropout or bias (kInvalidArgument / kUnsupportedDType otherwise).
  float softcap = 0.0f;

  // -- version 7 --
  // ALiBi (BLOOM, MPT): fp32 slopes, sizes [B or 1, Hq] (B: sequences of a packed batch; 1: the
  // same for every sequence), last stride 1; null data = off. Query head h adds
  // -slope[h] * |i + off - j| to score (i, j) after softcap and before the mask, with off the
  // mask's diagonal offset (0 for kTopLeft, Sk - Sq for kBottomRight: FlashAttention measures
  // from the bottom-right diagonal, so pass align = kBottomRight for its convention, also with
  // no window). fp16/bf16 inputs without dropout, bias or softcap.
  TensorView<2> alibi_slopes;

  // -- version 8 --
  // Attention sinks (gpt-oss): fp32 logits, sizes [Hq]; null data = off. Each row's softmax
  // normaliser also counts exp(sinks[h]) (a key with no value, compared with the scaled scores);
  // the LSE includes it, and a row that sees no key gets O = 0 and LSE = sinks[h]. fp16/bf16
  // inputs without dropout, bias, softcap or ALiBi.
  TensorView<1> sinks;
};

// Enqueues the forward pass on `stream` and returns without waiting. Every argument is checked
// first; on any error nothing is launched.
AOTRITON_API Status attn_fwd(const FwdParams& params, Stream stream) noexcept;

// Gradients of the forward above. Overwrites dq, dk, dv (and the delta workspace); with GQA, dk
// and dv are summed over each group's query heads. The portable kernels use no atomics: results
// are bitwise identical from run to run; the Gluon backend accumulates dQ with reduce-adds at head
// dims up to 128 unless `deterministic` is set.
struct BwdParams {
  static constexpr uint32_t kVersion = 7;
  uint32_t version = kVersion;

  // -- version 1 --
  TensorView<4> q, k, v;  // the forward's inputs
  TensorView<4> o;        // the forward's output
  TensorView<4> d_o;      // dLoss/dO, like o
  TensorView<3> lse;      // the forward's LSE (required), B x Hq x Sq fp32
  TensorView<3> delta;    // workspace B x Hq x Sq fp32, overwritten; any contents on entry
  TensorView<4> dq;       // like q
  TensorView<4> dk;       // like k
  TensorView<4> dv;       // like v
  float sm_scale = std::numeric_limits<float>::quiet_NaN();  // the forward's
  bool causal = false;                                          // the forward's mask
  MaskAlign align = MaskAlign::kTopLeft;
  int32_t window_left = -1;
  int32_t window_right = -1;

  // -- version 2 --: the forward's bias, dropout (same seed/offset), packing and TF32 choice.
  TensorView<4> bias;
  TensorView<4> dbias;  // output, same sizes as bias (summed over its broadcast dims); null = none
  float dropout_p = 0.0f;
  const void* philox_seed = nullptr;
  const void* philox_offset = nullptr;
  uint64_t philox_offset_base = 0;
  TensorView<1> cu_seqlens_q;
  TensorView<1> cu_seqlens_k;
  uint64_t max_seqlen_q = 0;
  uint64_t max_seqlen_k = 0;
  const int32_t* cu_seqlens_q_host = nullptr;  // as in FwdParams
  const int32_t* cu_seqlens_k_host = nullptr;
  bool allow_tf32 = false;
  // Require bitwise-reproducible gradients (the Gluon backend then computes dQ with the
  // portable kernel instead of reduce-adds, as it always does above head dim 128; the portable
  // backend is always deterministic).
  bool deterministic = false;

  // -- version 3 --
  Backend backend = Backend::kAuto;
  // Scratch device memory for the Gluon backend: 16-byte aligned, at least
  // attn_bwd_workspace_bytes() bytes, any contents, not shared with a concurrent call. Null (the
  // default) keeps kAuto on the portable kernels, which need none.
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;

  // -- version 4 --: as FwdParams version 5.
  uint64_t cu_seqlens_q_host_count = 0;
  uint64_t cu_seqlens_k_host_count = 0;
  int32_t* varlen_status = nullptr;

  // -- version 5 --: the forward's softcap (FwdParams version 6).
  float softcap = 0.0f;

  // -- version 6 --: the forward's ALiBi slopes (FwdParams version 7); they get no gradient.
  TensorView<2> alibi_slopes;

  // -- version 7 --: the forward's sinks (FwdParams version 8) and their gradient: dsinks, fp32
  // [Hq], overwritten with -sum_{b,i} exp(sinks[h] - lse[b,h,i]) * delta[b,h,i] (a fixed order;
  // null = not computed; needs sinks).
  TensorView<1> sinks;
  TensorView<1> dsinks;
};

// Enqueues the backward pass (three or four kernels) on `stream`; nothing is launched on any
// error.
AOTRITON_API Status attn_bwd(const BwdParams& params, Stream stream) noexcept;

// The workspace bytes attn_bwd(params, stream) needs on the stream's device: 0 when it would run
// the portable kernels (kPortable, or kAuto with inputs or a device Gluon does not serve), else
// B * Hq * SQ_PAD * (W + 2) * 4 with SQ_PAD = Sq rounded up to 128 and W = D rounded up to 64 or
// 128 where the Gluon kernels accumulate dQ themselves, 0 where dQ has its own kernel
// (deterministic, or D above 128); plus 2 * 2 * B * Hk * Sk * 128 * 4 for the fp32 dK/dV partials
// of a GQA head split (Hq / Hk >= 4 and (Hq / Hk) * Sq >= 24576 at D 65-128, fixed-length batches).
// The workspace fields are ignored. Errors as attn_bwd's before any launch
// (validation, kUnsupportedByBackend, kNoDriver); *bytes is 0 then.
AOTRITON_API Status attn_bwd_workspace_bytes(const BwdParams& params, Stream stream,
                                             uint64_t* bytes) noexcept;

// The fp8 (e4m3) forward on sm_90, FlashAttention-3's: O = softmax(sm_scale * dq * dk * q.k^T + mask)
// (dv * v), with dq, dk, dv the fp32 dequantisation factors of each (batch, KV head). One version
// of the struct so far (version 1). Vᵀ is written to the workspace first (its size:
// attn_fwd_fp8_workspace_bytes), then the forward runs; both enqueued on `stream`, nothing
// launched on any error (kUnsupportedByBackend on a device that is not sm_90).
struct Fp8FwdParams {
  static constexpr uint32_t kVersion = 1;
  uint32_t version = kVersion;
  TensorView<4> q;    // B x Hq x Sq x D, kFloat8E4M3; D a multiple of 16, <= 256
  TensorView<4> k;    // B x Hk x Sk x D, kFloat8E4M3; Hq a multiple of Hk
  TensorView<4> v;    // B x Hk x Sk x D, kFloat8E4M3
  TensorView<4> o;    // B x Hq x Sq x D output, kBFloat16
  TensorView<3> lse;  // B x Hq x Sq fp32 output (of the descaled scores); null data = not wanted
  // fp32 [B, Hk] factors (any strides, 0 broadcasts; 16-byte aligned data); positive (not checked:
  // the kernel takes each row's maximum of the raw scores).
  TensorView<2> q_descale;
  TensorView<2> k_descale;
  TensorView<2> v_descale;
  // Scale of q.k with the descales; must be set and positive (NaN: "not set").
  float sm_scale = std::numeric_limits<float>::quiet_NaN();
  bool causal = false;
  MaskAlign align = MaskAlign::kTopLeft;
  int32_t window_left = -1;
  int32_t window_right = -1;
  // Device memory for Vᵀ (16-byte aligned), at least attn_fwd_fp8_workspace_bytes(k) bytes.
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
};

AOTRITON_API Status attn_fwd_fp8(const Fp8FwdParams& params, Stream stream) noexcept;

// The workspace attn_fwd_fp8 needs for this k (B x Hk x Sk x D): B * Hk * D * KEYS_PAD bytes with
// KEYS_PAD = Sk rounded up to 32. kTooLarge (and *bytes = 0) when it does not fit 64 bits.
AOTRITON_API Status attn_fwd_fp8_workspace_bytes(TensorView<4> k, uint64_t* bytes) noexcept;

// KV-cache decode attention (FlashAttention's flash_attn_with_kvcache): a decode step's 1..16
// query tokens per sequence over a dense or paged KV cache, optionally appending this step's new
// keys and values to the cache first. Token-major layouts (unlike the functions above): q and o
// B x Sq x Hq x D; a dense cache B x S_cache x Hk x D; a paged cache a pool of pages
// N_PAGES x PAGE_SIZE x Hk x D (PAGE_SIZE a power of two in 16..256) with an int32 page table
// B x MAX_PAGES: key j of sequence b is row j % PAGE_SIZE of page page_table[b][j / PAGE_SIZE].
// Any strides with the last one 1; fp16 or bf16; D a multiple of 8 up to 256; Hq a multiple of Hk.
//
// Sequence b attends over L = cache_seqlens[b] + N_NEW keys (its cached ones, then the N_NEW
// appended this step, written at rows cache_seqlens[b] ..). Query token t sits at position
// L - Sq + t: masks are always aligned bottom-right (causal: query t sees keys up to its own
// position; window_left / window_right count from there, -1 unbounded). A row that sees no key
// gets O = 0 and LSE = +inf.
//
// cache_seqlens and the page ids are read by the kernels only (nothing is read on the host, so a
// step can be captured in a CUDA graph and replayed with new lengths). A length outside
// [0, capacity - N_NEW] is clamped into it and a page id outside [0, N_PAGES) is never followed
// (its keys are left out, its appended rows not written): nothing outside the caller's tensors is
// read or written whatever those words hold, and the kernels OR kKvSeqlenOutOfRange /
// kKvPageOutOfRange into *status (when given) when that happened.
//
// Up to three launches on `stream`: the append (with k_new/v_new), the split-KV attention and,
// when the cache is split in more than one chunk, the merge of the chunks' fp32 partials, which
// live in the caller's workspace (attn_fwd_kvcache_workspace_bytes; 0 bytes when not split).
// The split count comes from host-known values only (shapes, num_splits, the device's
// multiprocessor count): attn_fwd_kvcache_num_splits. One version of the struct so far.
constexpr int32_t kKvSeqlenOutOfRange = 1;  // a cache_seqlens value was clamped
constexpr int32_t kKvPageOutOfRange = 2;    // a page id outside [0, N_PAGES) was skipped
constexpr uint32_t kKvCacheMaxSplits = 128;
constexpr uint64_t kKvCacheMaxQueryTokens = 16;

struct KvCacheParams {
  static constexpr uint32_t kVersion = 1;
  uint32_t version = kVersion;
  TensorView<4> q;        // B x Sq x Hq x D, fp16 or bf16, 1 <= Sq <= 16
  TensorView<4> k_cache;  // B x S_cache x Hk x D, or with page_table N_PAGES x PAGE_SIZE x Hk x D
  TensorView<4> v_cache;  // the sizes of k_cache (may interleave with it, sharing no element)
  TensorView<2> page_table;     // int32 B x MAX_PAGES (last stride 1); null data = a dense cache
  TensorView<1> cache_seqlens;  // int32 [B], contiguous: the cached length before this step
  TensorView<4> k_new;    // B x N_NEW x Hk x D keys to append; null data (with v_new) = no append
  TensorView<4> v_new;    // B x N_NEW x Hk x D values to append
  TensorView<4> o;        // B x Sq x Hq x D output, q's dtype
  TensorView<3> lse;      // B x Hq x Sq fp32 output (last stride 1); null data = not wanted
  // Scale of q.k; must be set, finite and positive (typically 1/sqrt(D); NaN: "not set").
  float sm_scale = std::numeric_limits<float>::quiet_NaN();
  bool causal = false;     // sets window_right to 0
  int32_t window_left = -1;
  int32_t window_right = -1;
  // Chunks the cache is split into: 0 = the library's rule; else at most kKvCacheMaxSplits
  // (capped at the cache's key blocks).
  uint32_t num_splits = 0;
  // fp32 scratch for the chunks' partials (16-byte aligned), at least
  // attn_fwd_kvcache_workspace_bytes() bytes, any contents, not shared with a concurrent call;
  // needed only when the call splits the cache (a short one is kInvalidArgument, never a silent
  // fallback).
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
  // Device address of an int32 word (4-byte aligned; null = not recorded) into which the kernels
  // OR kKvSeqlenOutOfRange / kKvPageOutOfRange. Zero it before the call, read it after (in stream
  // order); written only on a violation.
  int32_t* status = nullptr;
};

// Enqueues the step on `stream`; every argument is checked first and nothing is launched on any
// error (a missing or short workspace included).
AOTRITON_API Status attn_fwd_kvcache(const KvCacheParams& params, Stream stream) noexcept;

// The workspace bytes attn_fwd_kvcache(params, stream) needs on the stream's device: with
// N_SPLITS = attn_fwd_kvcache_num_splits() > 1, N_SPLITS * B * Hq * Sq * (HEAD_DIM + 1) * 4 bytes
// (HEAD_DIM: D rounded up to 64, 128 or 256; each part rounded up to 16 bytes), else 0. The
// workspace fields are ignored. Errors as attn_fwd_kvcache's; *bytes is 0 then.
AOTRITON_API Status attn_fwd_kvcache_workspace_bytes(const KvCacheParams& params, Stream stream,
                                                     uint64_t* bytes) noexcept;

// How many chunks attn_fwd_kvcache(params, stream) splits the cache into on the stream's device
// (*splits is 0 on error).
AOTRITON_API Status attn_fwd_kvcache_num_splits(const KvCacheParams& params, Stream stream,
                                                uint32_t* splits) noexcept;

// Philox counters one dropout call consumes: batch * heads_q * 8*ceil(seqlen_q / 16) * 4*ceil(seqlen_k / 16)
// (max lengths for packed batches), written to *count. Advance the generator's offset by this
// between calls. kTooLarge (and *count = 0) when the count does not fit 64 bits: such a call's
// counters would wrap, and attn_fwd/attn_bwd refuse it too.
AOTRITON_API Status dropout_offsets_consumed(uint64_t batch, uint64_t heads_q, uint64_t seqlen_q,
                                             uint64_t seqlen_k, uint64_t* count) noexcept;

// The form of earlier releases, kept for programs built against them: the count, or UINT64_MAX
// when it does not fit 64 bits (it never wraps).
[[deprecated("use the Status form, which reports an overflow")]] AOTRITON_API uint64_t
dropout_offsets_consumed(uint64_t batch, uint64_t heads_q, uint64_t seqlen_q, uint64_t seqlen_k) noexcept;

// Writes out[b, h, i, j] = 1.0 where attention with this dropout keeps element (b, h, i, j) of a
// B x H x Sq x Sk score matrix, 0.0 where it drops it (out: fp32, B x H x Sq x Sk).
AOTRITON_API Status debug_dropout_mask(TensorView<4> out, float dropout_p, const void* philox_seed,
                                       const void* philox_offset, uint64_t philox_offset_base,
                                       Stream stream) noexcept;

}  // namespace flash
}  // namespace v2
}  // namespace aotriton

// ---------------------------------------------------------------------------------------------
// The seed's API (ROCm/aotriton 0.10, the level AOTRITON_VERSION_MAJOR/MINOR in config.h name),
// for programs written against it, PyTorch's ROCm adapter first. A thin layer over the functions
// above: the same validation, kernels and errors, with the seed's argument forms.
//
// Conventions (as in the seed):
// - q, k, v, Out (and dq, dk, dv, dout, out): B x H x S x D views (BSHD memory permuted works),
//   last stride 1. Compact varlen: 1 x H x total x D views plus int32 cu_seqlens (B+1).
// - softmax_lse / delta (T2, fp32): (B * Hq, Sq), row b * Hq + h, any row stride, last stride 1.
//   Compact varlen: (Hq, total_q); a contiguous (B * Hq, max_seqlen_q) buffer (what the seed's
//   0.10 callers allocate) is accepted too and holds the (Hq, total_q) layout in its first
//   Hq * total_q elements (read back the same way by the backward).
// - philox_seed, philox_offset1: device addresses of one 64-bit integer each (kUInt64 or
//   kInt64); the offset used is *philox_offset1 + philox_offset2. philox_seed_output and
//   philox_offset_output (both or neither) receive the seed and offset used.
// - encoded_softmax: a non-empty view gets the dropout keep-mask of the call (as
//   debug_simulate_encoded_softmax writes it); it must be fp32. Empty or null: not wanted.
// - is_causal (v2) is top-left aligned. atomic_for_causal / persistent_atomic_counter are
//   accepted and ignored: no kernel here needs a counter. b / db (bias) may be null (absent).
// - The tuning arguments: extargs carry nothing here (empty structs; any pointer is fine);
//   attn_options::force_backend_index other than -1 is refused (hipErrorNotSupported).
// Returns: hipSuccess; hipErrorInvalidValue (an argument is wrong: dtype, shape, stride,
// pointer, size limit; aotriton::last_error_message() names it), hipErrorInvalidSymbol (unknown
// params_version), hipErrorNotSupported (a seed feature this library does not have: padded or
// strided varlen, ALiBi, attn_bwd_fused), hipErrorNoBinaryForGpu (no kernels for the device),
// hipErrorInsufficientDriver (no driver library), hipErrorNoDevice (no GPU behind the stream),
// hipErrorInvalidImage (a kernel archive is corrupt or untrusted),
// hipErrorSharedObjectSymbolNotFound (no compiled kernel fits), hipErrorUnknown (a driver call
// failed or an internal error; the message says which). Nothing is launched on any error.
// The Stream may be a hipStream_t (implicitly) or a CUDA stream (aotriton::Stream{cuda_stream}).
namespace aotriton {
namespace v2 {
namespace flash {

using T4 = TensorView<4>;
using T2 = TensorView<2>;
using T1 = TensorView<1>;
using T0 = TensorView<0>;

// The seed's tuning hooks; nothing to tune here, so they carry nothing.
struct FwdExtraArguments {};
struct BwdExtraArguments {};
struct FusedBwdExtraArguments {};

// hipSuccess when this build has kernels for the stream's device (its arch, or a binary
// compatible one), hipErrorNoBinaryForGpu when not, else the error of reaching the device.
AOTRITON_API hipError_t check_gpu(Stream stream) noexcept;

AOTRITON_API hipError_t attn_fwd(T4 q, T4 k, T4 v, T4 b, float sm_scale, T2 softmax_lse, T4 Out,
                                 float dropout_p, T0 philox_seed, T0 philox_offset1,
                                 int64_t philox_offset2, T0 philox_seed_output,
                                 T0 philox_offset_output, T4 encoded_softmax, bool is_causal,
                                 T0 atomic_for_causal, Stream stream,
                                 FwdExtraArguments* extargs = nullptr) noexcept;

AOTRITON_API hipError_t attn_fwd_compact_varlen(
    T4 q, T4 k, T4 v, T4 b, T1 cu_seqlens_q, T1 cu_seqlens_k, int32_t max_seqlen_q,
    int32_t max_seqlen_k, float sm_scale, T2 softmax_lse, T4 Out, float dropout_p, T0 philox_seed,
    T0 philox_offset1, int64_t philox_offset2, T0 philox_seed_output, T0 philox_offset_output,
    T4 encoded_softmax, bool is_causal, T0 atomic_for_causal, Stream stream,
    FwdExtraArguments* extargs = nullptr) noexcept;

// delta: a (B * Hq, Sq) fp32 workspace, overwritten.
AOTRITON_API hipError_t attn_bwd(T4 q, T4 k, T4 v, T4 b, float sm_scale, T4 out, T4 dout, T4 dq,
                                 T4 dk, T4 dv, T4 db, T2 softmax_lse, T2 delta, float dropout_p,
                                 T0 philox_seed, T0 philox_offset1, int64_t philox_offset2,
                                 bool is_causal, Stream stream,
                                 BwdExtraArguments* extargs = nullptr) noexcept;

// The seed's backward without a delta workspace. The kernels here need one, and the library
// never allocates device memory: returns hipErrorNotSupported (callers use attn_bwd).
AOTRITON_API hipError_t attn_bwd_fused(T4 q, T4 k, T4 v, T4 b, float sm_scale, T4 out, T4 dout,
                                       T4 dq, T4 dk, T4 dv, T4 db, T2 softmax_lse, float dropout_p,
                                       T0 philox_seed, T0 philox_offset1, int64_t philox_offset2,
                                       bool is_causal, Stream stream,
                                       FusedBwdExtraArguments* extargs = nullptr) noexcept;

AOTRITON_API hipError_t attn_bwd_compact_varlen(
    T4 q, T4 k, T4 v, T1 cu_seqlens_q, T1 cu_seqlens_k, int32_t max_seqlen_q,
    int32_t max_seqlen_k, T4 b, float sm_scale, T4 out, T4 dout, T4 dq, T4 dk, T4 dv, T4 db,
    T2 softmax_lse, T2 delta, float dropout_p, T0 philox_seed, T0 philox_offset1,
    int64_t philox_offset2, bool is_causal, Stream stream,
    BwdExtraArguments* extargs = nullptr) noexcept;

// r (fp32, B x H x Sq x Sk) gets 1.0 where dropout with this seed and offset keeps an element,
// 0.0 where it drops it (the seed writes sign-encoded random values instead: test r > 0).
AOTRITON_API hipError_t debug_simulate_encoded_softmax(T4 r, float dropout_p, T0 philox_seed,
                                                       T0 philox_offset1, uint64_t philox_offset2,
                                                       Stream stream) noexcept;

}  // namespace flash
}  // namespace v2

namespace v3 {
namespace flash {

using T4 = TensorView<4>;
using T2 = TensorView<2>;
using T1 = TensorView<1>;
using T0 = TensorView<0>;

// force_backend_index: -1 (automatic) only. deterministic: the results are bitwise reproducible
// whatever it says (the automatic choice on a seed call never takes reduce-adds).
struct attn_options {
  int force_backend_index = -1;
  bool deterministic = false;
};

// int8_t constants in structs, as the seed has them (its fields are plain integers).
struct CausalType {
  static constexpr int8_t None = 0;
  static constexpr int8_t WindowedAttention = 3;  // window_left / window_right below
};

// Windows: query i sees key j iff i - window_left <= j <= i + window_right (top-left aligned;
// values >= 0). The sentinels make a side follow the diagonal instead: TopLeftAligned on both
// sides is causal top-left, BottomRightAligned on both causal bottom-right (off = Sk - Sq, per
// sequence when packed); one sentinel with a number on the other side keeps that number as the
// window on its side, aligned as the sentinel says. The two sentinels together are refused.
struct WindowValue {
  static constexpr int32_t TopLeftAligned = -2147483647;
  static constexpr int32_t BottomRightAligned = -2147483646;
};

struct VarlenType {
  static constexpr int8_t None = 0;
  static constexpr int8_t CompactVarlen = 1;  // 1 x H x total x D views + cu_seqlens
  static constexpr int8_t PaddedVarlen = 2;   // not supported here (hipErrorNotSupported)
};

struct attn_fwd_params {
  T4 Q;
  T4 K;
  T4 V;
  T4 B;       // additive bias, null = none
  T2 A;       // ALiBi slopes: must be null
  float Sm_scale = 0.0f;
  T2 L;       // null = not wanted; layouts as the v2 softmax_lse
  T4 Out;
  T1 cu_seqlens_q;
  T1 cu_seqlens_k;
  int32_t Max_seqlen_q = 0;
  int32_t Max_seqlen_k = 0;
  float dropout_p = 0.0f;
  T0 philox_seed_ptr;
  T0 philox_offset1;
  uint64_t philox_offset2 = 0;
  T0 philox_seed_output;
  T0 philox_offset_output;
  T4 encoded_softmax;
  T0 persistent_atomic_counter;  // ignored
  int8_t causal_type = CausalType::None;
  int8_t varlen_type = VarlenType::None;
  int32_t window_left = 0;
  int32_t window_right = 0;

  static constexpr int32_t kVersion = 1;
};

AOTRITON_API hipError_t attn_fwd(const attn_fwd_params& params, int32_t params_version,
                                 Stream stream, const attn_options* options = nullptr) noexcept;

struct attn_bwd_params {
  T4 Q;
  T4 K;
  T4 V;
  T4 B;
  float Sm_scale = 0.0f;
  T4 Out;
  T4 DO;
  T4 DK;
  T4 DV;
  T4 DQ;
  T4 DB;
  T2 L;
  T2 D;  // delta workspace, like L, overwritten
  T1 cu_seqlens_q;
  T1 cu_seqlens_k;
  int32_t Max_seqlen_q = 0;
  int32_t Max_seqlen_k = 0;
  float dropout_p = 0.0f;
  T0 philox_seed_ptr;
  T0 philox_offset1;
  uint64_t philox_offset2 = 0;
  int8_t causal_type = CausalType::None;
  int8_t varlen_type = VarlenType::None;
  int32_t window_left = 0;
  int32_t window_right = 0;

  static constexpr int32_t kVersion = 1;
};

AOTRITON_API hipError_t attn_bwd(const attn_bwd_params& params, int32_t params_version,
                                 Stream stream, const attn_options* options = nullptr) noexcept;

}  // namespace flash
}  // namespace v3
}  // namespace aotriton
