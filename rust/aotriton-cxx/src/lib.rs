//! The cxx bridge behind the C++ API (v2src/). Only v2src sees the generated header: the public
//! headers in include/aotriton/ expose plain C-compatible types. Errors travel as an Outcome
//! (code + message). Every function of the bridge runs inside [`guard`]: cxx aborts the process
//! when a panic reaches an `extern "Rust"` function, and the C++ API promises that nothing aborts.
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use aotriton::flash::{Backend, Dropout, Mask, MaskAlign, Varlen, Workspace};
use aotriton::{DType, Error, ErrorKind, Runtime, Stream, TensorView, flash};

#[cxx::bridge(namespace = "aotriton::bridge")]
mod ffi {
    struct TensorView4 {
        ptr: u64,
        sizes: [u64; 4],
        strides: [i64; 4],
        dtype: i32,
    }

    struct TensorView3 {
        ptr: u64,
        sizes: [u64; 3],
        strides: [i64; 3],
        dtype: i32,
    }

    struct TensorView1 {
        ptr: u64,
        sizes: [u64; 1],
        strides: [i64; 1],
        dtype: i32,
    }

    /// Dropout fields (p = 0: off). Device addresses as integers.
    struct DropoutSpec {
        p: f32,
        seed: u64,
        offset: u64,
        offset_base: u64,
        seed_out: u64,
        offset_out: u64,
    }

    /// Packing fields (cu_seqlens_q.ptr = 0: not packed); host copies travel as slices.
    struct VarlenSpec {
        cu_seqlens_q: TensorView1,
        cu_seqlens_k: TensorView1,
        max_seqlen_q: u64,
        max_seqlen_k: u64,
        /// Device address of the int32 word the kernels OR clamping bits into; 0: not recorded.
        status: u64,
    }

    /// The mask fields shared by FwdParams and BwdParams.
    struct MaskSpec {
        causal: bool,
        align: i32,
        window_left: i32,
        window_right: i32,
    }

    /// aotriton::v2::flash::FwdParams (any version, filled by v2src with defaults).
    struct FwdArgs {
        q: TensorView4,
        k: TensorView4,
        v: TensorView4,
        o: TensorView4,
        /// ptr 0: not wanted.
        lse: TensorView3,
        sm_scale: f32,
        mask: MaskSpec,
        /// ptr 0: none.
        bias: TensorView4,
        dropout: DropoutSpec,
        varlen: VarlenSpec,
        allow_tf32: bool,
        /// aotriton::v2::flash::Backend value.
        backend: i32,
        /// 0: off (FwdParams version 6).
        softcap: f32,
        /// ptr 0: none (FwdParams version 7).
        alibi_slopes: TensorView2,
        /// ptr 0: none (FwdParams version 8).
        sinks: TensorView1,
    }

    /// aotriton::v2::flash::BwdParams.
    struct BwdArgs {
        q: TensorView4,
        k: TensorView4,
        v: TensorView4,
        o: TensorView4,
        d_o: TensorView4,
        lse: TensorView3,
        delta: TensorView3,
        dq: TensorView4,
        dk: TensorView4,
        dv: TensorView4,
        sm_scale: f32,
        mask: MaskSpec,
        bias: TensorView4,
        dbias: TensorView4,
        dropout: DropoutSpec,
        varlen: VarlenSpec,
        allow_tf32: bool,
        deterministic: bool,
        backend: i32,
        /// 0: no workspace.
        workspace: u64,
        workspace_bytes: u64,
        /// 0: off (BwdParams version 5).
        softcap: f32,
        /// ptr 0: none (BwdParams version 6).
        alibi_slopes: TensorView2,
        /// ptr 0: none (BwdParams version 7); dsinks: their gradient, ptr 0: not computed.
        sinks: TensorView1,
        dsinks: TensorView1,
    }

    /// aotriton::v2::flash::Fp8FwdParams.
    struct Fp8FwdArgs {
        q: TensorView4,
        k: TensorView4,
        v: TensorView4,
        o: TensorView4,
        /// ptr 0: not wanted.
        lse: TensorView3,
        q_descale: TensorView2,
        k_descale: TensorView2,
        v_descale: TensorView2,
        sm_scale: f32,
        mask: MaskSpec,
        /// 0: no workspace.
        workspace: u64,
        workspace_bytes: u64,
    }

    /// aotriton::v2::flash::KvCacheParams (the decode step over a KV cache).
    struct KvCacheArgs {
        q: TensorView4,
        k_cache: TensorView4,
        v_cache: TensorView4,
        /// ptr 0: a dense cache.
        page_table: TensorView2,
        cache_seqlens: TensorView1,
        /// ptr 0 (both): no append.
        k_new: TensorView4,
        v_new: TensorView4,
        o: TensorView4,
        /// ptr 0: not wanted.
        lse: TensorView3,
        sm_scale: f32,
        /// Always bottom-right aligned (v2src sets align 1).
        mask: MaskSpec,
        num_splits: u32,
        /// 0 (with workspace_bytes 0): no workspace.
        workspace: u64,
        workspace_bytes: u64,
        /// Device address of the int32 status word; 0: none.
        status: u64,
    }

    /// aotriton::Stream: the raw handle and its aotriton::GpuRuntime value.
    struct StreamSpec {
        handle: u64,
        runtime: i32,
    }

    /// 0 on success, else an aotriton::Status value, with the message naming the cause.
    struct Outcome {
        code: i32,
        message: String,
    }

    /// A TensorView<2>: the ALiBi slopes; the seed's softmax_lse, delta ((B·Hq, Sq) rows) and A.
    struct TensorView2 {
        ptr: u64,
        sizes: [u64; 2],
        strides: [i64; 2],
        dtype: i32,
    }

    /// The seed's TensorView<0>: a device scalar's address and dtype.
    struct Scalar {
        ptr: u64,
        dtype: i32,
    }

    /// The seed's dropout arguments (p = 0: off; the rest is then not read).
    struct SeedDropout {
        p: f32,
        seed: Scalar,
        offset1: Scalar,
        /// The bits of the seed's philox_offset2 (an int64_t in v2, a uint64_t in v3).
        offset2: u64,
        /// offset2 came from a signed argument: a negative value is refused.
        offset2_signed: bool,
    }

    /// The seed's mask and packing selectors (aotriton::v3::flash CausalType, VarlenType,
    /// WindowValue; a v2 call is is_causal → both windows TopLeftAligned).
    struct SeedShape {
        causal_type: i32,
        window_left: i32,
        window_right: i32,
        varlen_type: i32,
        cu_seqlens_q: TensorView1,
        cu_seqlens_k: TensorView1,
        max_seqlen_q: i32,
        max_seqlen_k: i32,
    }

    /// aotriton::v3::flash::attn_fwd_params (and the v2 positional forms).
    struct SeedFwdArgs {
        q: TensorView4,
        k: TensorView4,
        v: TensorView4,
        bias: TensorView4,
        /// ALiBi slopes: refused unless null.
        alibi: TensorView2,
        sm_scale: f32,
        lse: TensorView2,
        out: TensorView4,
        shape: SeedShape,
        dropout: SeedDropout,
        seed_output: Scalar,
        offset_output: Scalar,
        encoded_softmax: TensorView4,
        /// attn_options::force_backend_index (-1: automatic); 1 when a v2 call's extargs asked for tuning.
        force_backend_index: i32,
    }

    /// aotriton::v3::flash::attn_bwd_params (and the v2 positional forms).
    struct SeedBwdArgs {
        q: TensorView4,
        k: TensorView4,
        v: TensorView4,
        bias: TensorView4,
        sm_scale: f32,
        out: TensorView4,
        d_o: TensorView4,
        dk: TensorView4,
        dv: TensorView4,
        dq: TensorView4,
        dbias: TensorView4,
        lse: TensorView2,
        delta: TensorView2,
        shape: SeedShape,
        dropout: SeedDropout,
        force_backend_index: i32,
    }

    /// A seed call's result: the hipError_t value, and the aotriton::Status and message kept for
    /// last_error_message().
    struct SeedOutcome {
        hip: i32,
        code: i32,
        message: String,
    }

    extern "Rust" {
        fn version(text: &mut String) -> Outcome;
        /// The tuner's kernel override (aotriton::tuning): `id` forced, or none when `clear`.
        fn tuning_force_kernel(id: &str, clear: bool) -> Outcome;
        /// How many kernels the override has put in place of dispatch's choice.
        fn tuning_forced_count() -> u64;
        /// aotriton::tuning::use_database / database_in_use.
        fn tuning_use_database(on: bool);
        fn tuning_database_in_use() -> bool;
        /// `host_cu_seqlens_q/k`: the host copies of the offsets, empty when not given.
        fn attn_fwd(params: &FwdArgs, host_cu_seqlens_q: &[i32], host_cu_seqlens_k: &[i32], stream: &StreamSpec) -> Outcome;
        fn attn_bwd(params: &BwdArgs, host_cu_seqlens_q: &[i32], host_cu_seqlens_k: &[i32], stream: &StreamSpec) -> Outcome;
        /// Writes the workspace bytes the call needs into `bytes` (0 on error).
        fn attn_bwd_workspace_bytes(
            params: &BwdArgs,
            host_cu_seqlens_q: &[i32],
            host_cu_seqlens_k: &[i32],
            stream: &StreamSpec,
            bytes: &mut u64,
        ) -> Outcome;
        fn attn_fwd_fp8(params: &Fp8FwdArgs, stream: &StreamSpec) -> Outcome;
        /// Writes the fp8 forward's workspace bytes for K's view into `bytes` (0 on error).
        fn attn_fwd_fp8_workspace_bytes(k: &TensorView4, bytes: &mut u64) -> Outcome;
        fn attn_fwd_kvcache(params: &KvCacheArgs, stream: &StreamSpec) -> Outcome;
        /// Writes the workspace bytes the KV-cache call needs on the stream's device into `bytes` (0 on error).
        fn attn_fwd_kvcache_workspace_bytes(params: &KvCacheArgs, stream: &StreamSpec, bytes: &mut u64) -> Outcome;
        /// Writes the split count the KV-cache call uses on the stream's device into `splits` (0 on error).
        fn attn_fwd_kvcache_num_splits(params: &KvCacheArgs, stream: &StreamSpec, splits: &mut u32) -> Outcome;
        /// Writes the counter count into `count` (0 on error: the product overflows u64).
        fn dropout_offsets_consumed(batch: u64, heads_q: u64, seqlen_q: u64, seqlen_k: u64, count: &mut u64) -> Outcome;
        fn debug_dropout_mask(out: &TensorView4, dropout: &DropoutSpec, stream: &StreamSpec) -> Outcome;

        // The seed-compatible API (v2src/seed.cpp; include/aotriton/flash.h documents it).
        fn seed_check_gpu(stream: &StreamSpec) -> SeedOutcome;
        /// `params_version`: the caller's; `known`: the header's kVersion the library was built with.
        fn seed_attn_fwd(args: &SeedFwdArgs, params_version: i32, known: i32, stream: &StreamSpec) -> SeedOutcome;
        fn seed_attn_bwd(args: &SeedBwdArgs, params_version: i32, known: i32, stream: &StreamSpec) -> SeedOutcome;
        fn seed_debug_simulate_encoded_softmax(r: &TensorView4, dropout: &SeedDropout, stream: &StreamSpec) -> SeedOutcome;
        /// The answer to a seed function this library does not implement (named in the message).
        fn seed_not_supported(what: &str) -> SeedOutcome;
        /// Whether the stream's device runs kernels not yet validated on hardware (see seed.rs).
        fn seed_arch_experimental(stream: &StreamSpec, experimental: &mut bool) -> SeedOutcome;
        fn seed_multiprocessors(stream: &StreamSpec, count: &mut i32) -> SeedOutcome;
    }
}

mod seed;
use seed::{
    seed_arch_experimental, seed_attn_bwd, seed_attn_fwd, seed_check_gpu, seed_debug_simulate_encoded_softmax, seed_multiprocessors,
    seed_not_supported,
};

use ffi::Outcome;

/// Runs `f`, turning a panic into an `Internal` error. A panic's message is kept: it is the only
/// trace of the bug the caller can report (the default hook only prints it to stderr).
fn caught(f: impl FnOnce() -> Result<(), Error>) -> Result<(), Error> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = format!("panic in the aotriton runtime: {}", panic_text(payload.as_ref()));
        // The payload's own drop could panic again, outside any guard: never drop it.
        std::mem::forget(payload);
        Err(Error::new(ErrorKind::Internal, message))
    })
}

/// Runs `f`, turning its error or a panic ([`caught`]) into an Outcome.
fn guard(f: impl FnOnce() -> Result<(), Error>) -> Outcome {
    match caught(f) {
        Ok(()) => Outcome { code: 0, message: String::new() },
        Err(e) => Outcome { code: e.kind() as i32, message: e.message().to_string() },
    }
}

/// The text of a panic: `panic!` payloads are a `&str` or a `String`.
fn panic_text(payload: &(dyn Any + Send)) -> &str {
    match payload.downcast_ref::<&str>() {
        Some(text) => text,
        None => payload.downcast_ref::<String>().map_or("(no message)", String::as_str),
    }
}

fn version(text: &mut String) -> Outcome {
    guard(|| {
        *text = format!("{} ({})", env!("CARGO_PKG_VERSION"), aotriton::built_archs().join(", "));
        Ok(())
    })
}

fn tuning_forced_count() -> u64 {
    aotriton::tuning::forced_count()
}

fn tuning_use_database(on: bool) {
    aotriton::tuning::use_database(on)
}

fn tuning_database_in_use() -> bool {
    aotriton::tuning::database_in_use()
}

fn tuning_force_kernel(id: &str, clear: bool) -> Outcome {
    guard(|| {
        aotriton::tuning::force_kernel(if clear { None } else { Some(id) });
        Ok(())
    })
}

/// aotriton::DType (the seed's numbering, include/aotriton/dtypes.h) to the runtime's DType.
fn dtype(raw: i32, name: &str) -> Result<DType, Error> {
    if let Some(dtype) = DType::from_raw(raw) {
        return Ok(dtype);
    }
    match raw {
        0 | 10 | 11 | 13 | 20..=23 => Err(Error::new(
            ErrorKind::UnsupportedDType,
            format!("{name}: dtype {} is not one aotriton's operators take (fp16, bf16, fp32; int32 offsets)", dtype_name(raw)),
        )),
        _ => Err(Error::new(ErrorKind::InvalidArgument, format!("{name}: unknown dtype value {raw}"))),
    }
}

/// The C++ name of an aotriton::DType value.
fn dtype_name(raw: i32) -> &'static str {
    match raw {
        0 => "kUnknown",
        1 => "kFloat32",
        2 => "kFloat16",
        3 => "kBFloat16",
        10 => "kInt8",
        11 => "kInt16",
        12 => "kInt32",
        13 => "kInt64",
        20 => "kUInt8",
        21 => "kUInt16",
        22 => "kUInt32",
        23 => "kUInt64",
        _ => "unknown",
    }
}

macro_rules! view {
    ($t:expr, $name:expr) => {
        TensorView::new($t.ptr, $t.sizes, $t.strides, dtype($t.dtype, $name)?)
    };
}

fn mask(m: &ffi::MaskSpec) -> Result<Mask, Error> {
    let align = match m.align {
        0 => MaskAlign::TopLeft,
        1 => MaskAlign::BottomRight,
        other => return Err(Error::new(ErrorKind::InvalidArgument, format!("align: unknown MaskAlign value {other}"))),
    };
    let right = if m.causal { 0 } else { m.window_right };
    if m.causal && !(m.window_right == -1 || m.window_right == 0) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("causal already sets window_right to 0; got window_right {} as well", m.window_right),
        ));
    }
    Ok(Mask::window(m.window_left, right, align))
}

fn dropout(d: &ffi::DropoutSpec) -> Option<Dropout> {
    (d.p != 0.0).then_some(Dropout {
        p: d.p,
        seed: d.seed,
        offset: d.offset,
        offset_base: d.offset_base,
        seed_out: d.seed_out,
        offset_out: d.offset_out,
    })
}

/// `host_q`/`host_k`: the host copies, both empty when not given (v2src bounds their lengths and
/// refuses one without the other).
fn varlen<'a>(v: &ffi::VarlenSpec, host_q: &'a [i32], host_k: &'a [i32]) -> Result<Option<Varlen<'a>>, Error> {
    if v.cu_seqlens_q.ptr == 0 {
        return Ok(None);
    }
    Ok(Some(Varlen {
        cu_seqlens_q: view!(v.cu_seqlens_q, "cu_seqlens_q"),
        cu_seqlens_k: view!(v.cu_seqlens_k, "cu_seqlens_k"),
        max_seqlen_q: v.max_seqlen_q,
        max_seqlen_k: v.max_seqlen_k,
        host_cu_seqlens: (!host_q.is_empty() || !host_k.is_empty()).then_some((host_q, host_k)),
        status: v.status,
    }))
}

fn stream(s: &ffi::StreamSpec) -> Result<Stream, Error> {
    let handle = usize::try_from(s.handle)
        .map_err(|_| Error::new(ErrorKind::InvalidArgument, format!("stream: handle {:#x} is not an address", s.handle)))?;
    match Runtime::from_raw(s.runtime) {
        Some(Runtime::Cuda) => Ok(Stream::cuda(handle)),
        Some(Runtime::Hip) => Ok(Stream::hip(handle)),
        None => Err(Error::new(ErrorKind::InvalidArgument, format!("stream: unknown GpuRuntime value {}", s.runtime))),
    }
}

fn backend(raw: i32) -> Result<Backend, Error> {
    Backend::from_raw(raw).ok_or_else(|| Error::new(ErrorKind::InvalidArgument, format!("backend: unknown Backend value {raw}")))
}

fn optional(t: &ffi::TensorView4, name: &str) -> Result<Option<TensorView<4>>, Error> {
    Ok(if t.ptr == 0 { None } else { Some(view!(t, name)) })
}

fn attn_fwd(p: &ffi::FwdArgs, host_q: &[i32], host_k: &[i32], s: &ffi::StreamSpec) -> Outcome {
    guard(|| {
        let lse = if p.lse.ptr == 0 { None } else { Some(view!(p.lse, "lse")) };
        let mut params = flash::FwdParams::new(view!(p.q, "q"), view!(p.k, "k"), view!(p.v, "v"), view!(p.o, "o"), lse);
        params.sm_scale = p.sm_scale;
        params.softcap = p.softcap;
        params.alibi_slopes = if p.alibi_slopes.ptr == 0 { None } else { Some(view!(p.alibi_slopes, "alibi_slopes")) };
        params.sinks = if p.sinks.ptr == 0 { None } else { Some(view!(p.sinks, "sinks")) };
        params.mask = mask(&p.mask)?;
        params.bias = optional(&p.bias, "bias")?;
        params.dropout = dropout(&p.dropout);
        params.varlen = varlen(&p.varlen, host_q, host_k)?;
        params.allow_tf32 = p.allow_tf32;
        params.backend = backend(p.backend)?;
        flash::attn_fwd(&params, stream(s)?)
    })
}

fn attn_fwd_fp8(p: &ffi::Fp8FwdArgs, s: &ffi::StreamSpec) -> Outcome {
    guard(|| {
        let lse = if p.lse.ptr == 0 { None } else { Some(view!(p.lse, "lse")) };
        let mut params = flash::Fp8FwdParams::new(
            view!(p.q, "q"),
            view!(p.k, "k"),
            view!(p.v, "v"),
            view!(p.o, "o"),
            lse,
            view!(p.q_descale, "q_descale"),
            view!(p.k_descale, "k_descale"),
            view!(p.v_descale, "v_descale"),
        );
        params.sm_scale = p.sm_scale;
        params.mask = mask(&p.mask)?;
        params.workspace = (p.workspace != 0 || p.workspace_bytes != 0).then_some(Workspace { ptr: p.workspace, bytes: p.workspace_bytes });
        flash::attn_fwd_fp8(&params, stream(s)?)
    })
}

fn attn_fwd_fp8_workspace_bytes(k: &ffi::TensorView4, bytes: &mut u64) -> Outcome {
    *bytes = 0;
    guard(|| {
        *bytes = flash::attn_fwd_fp8_workspace_bytes(&view!(k, "k"))?;
        Ok(())
    })
}

/// The Rust parameters of a KV-cache call (the workspace fields of `p` included).
fn kvcache_params(p: &ffi::KvCacheArgs) -> Result<flash::KvCacheParams, Error> {
    let page_table = if p.page_table.ptr == 0 { None } else { Some(view!(p.page_table, "page_table")) };
    let lse = if p.lse.ptr == 0 { None } else { Some(view!(p.lse, "lse")) };
    let mut params = flash::KvCacheParams::new(
        view!(p.q, "q"),
        view!(p.k_cache, "k_cache"),
        view!(p.v_cache, "v_cache"),
        page_table,
        view!(p.cache_seqlens, "cache_seqlens"),
        view!(p.o, "o"),
        lse,
    );
    params.k_new = optional(&p.k_new, "k_new")?;
    params.v_new = optional(&p.v_new, "v_new")?;
    params.sm_scale = p.sm_scale;
    params.mask = mask(&p.mask)?;
    params.num_splits = p.num_splits;
    params.workspace = (p.workspace != 0 || p.workspace_bytes != 0).then_some(Workspace { ptr: p.workspace, bytes: p.workspace_bytes });
    params.status = p.status;
    Ok(params)
}

fn attn_fwd_kvcache(p: &ffi::KvCacheArgs, s: &ffi::StreamSpec) -> Outcome {
    guard(|| flash::attn_fwd_kvcache(&kvcache_params(p)?, stream(s)?))
}

fn attn_fwd_kvcache_workspace_bytes(p: &ffi::KvCacheArgs, s: &ffi::StreamSpec, bytes: &mut u64) -> Outcome {
    *bytes = 0;
    guard(|| {
        *bytes = flash::attn_fwd_kvcache_workspace_bytes(&kvcache_params(p)?, stream(s)?)?;
        Ok(())
    })
}

fn attn_fwd_kvcache_num_splits(p: &ffi::KvCacheArgs, s: &ffi::StreamSpec, splits: &mut u32) -> Outcome {
    *splits = 0;
    guard(|| {
        *splits = flash::attn_fwd_kvcache_num_splits(&kvcache_params(p)?, stream(s)?)?;
        Ok(())
    })
}

fn dropout_offsets_consumed(batch: u64, heads_q: u64, seqlen_q: u64, seqlen_k: u64, count: &mut u64) -> Outcome {
    *count = 0;
    guard(|| {
        *count = flash::dropout_offsets_consumed(batch, heads_q, seqlen_q, seqlen_k)?;
        Ok(())
    })
}

fn debug_dropout_mask(out: &ffi::TensorView4, d: &ffi::DropoutSpec, s: &ffi::StreamSpec) -> Outcome {
    guard(|| {
        let dropout = Dropout { p: d.p, seed: d.seed, offset: d.offset, offset_base: d.offset_base, seed_out: 0, offset_out: 0 };
        flash::debug_dropout_mask(&view!(out, "out"), &dropout, stream(s)?)
    })
}

fn bwd_params<'a>(p: &ffi::BwdArgs, host_q: &'a [i32], host_k: &'a [i32]) -> Result<flash::BwdParams<'a>, Error> {
    let mut params = flash::BwdParams::new(
        view!(p.q, "q"),
        view!(p.k, "k"),
        view!(p.v, "v"),
        view!(p.o, "o"),
        view!(p.d_o, "d_o"),
        view!(p.lse, "lse"),
        view!(p.delta, "delta"),
        view!(p.dq, "dq"),
        view!(p.dk, "dk"),
        view!(p.dv, "dv"),
    );
    params.sm_scale = p.sm_scale;
    params.softcap = p.softcap;
    params.alibi_slopes = if p.alibi_slopes.ptr == 0 { None } else { Some(view!(p.alibi_slopes, "alibi_slopes")) };
    params.sinks = if p.sinks.ptr == 0 { None } else { Some(view!(p.sinks, "sinks")) };
    params.dsinks = if p.dsinks.ptr == 0 { None } else { Some(view!(p.dsinks, "dsinks")) };
    params.mask = mask(&p.mask)?;
    params.bias = optional(&p.bias, "bias")?;
    params.dbias = optional(&p.dbias, "dbias")?;
    params.dropout = dropout(&p.dropout);
    params.varlen = varlen(&p.varlen, host_q, host_k)?;
    params.allow_tf32 = p.allow_tf32;
    params.deterministic = p.deterministic;
    params.backend = backend(p.backend)?;
    params.workspace = (p.workspace != 0 || p.workspace_bytes != 0).then_some(Workspace { ptr: p.workspace, bytes: p.workspace_bytes });
    Ok(params)
}

fn attn_bwd(p: &ffi::BwdArgs, host_q: &[i32], host_k: &[i32], s: &ffi::StreamSpec) -> Outcome {
    guard(|| flash::attn_bwd(&bwd_params(p, host_q, host_k)?, stream(s)?))
}

fn attn_bwd_workspace_bytes(p: &ffi::BwdArgs, host_q: &[i32], host_k: &[i32], s: &ffi::StreamSpec, bytes: &mut u64) -> Outcome {
    *bytes = 0;
    guard(|| {
        *bytes = flash::attn_bwd_workspace_bytes(&bwd_params(p, host_q, host_k)?, stream(s)?)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t4() -> ffi::TensorView4 {
        ffi::TensorView4 { ptr: 0, sizes: [1, 1, 1, 64], strides: [64, 64, 64, 1], dtype: 2 }
    }

    fn no_mask() -> ffi::MaskSpec {
        ffi::MaskSpec { causal: false, align: 0, window_left: -1, window_right: -1 }
    }

    #[test]
    fn errors_and_panics_become_outcomes() {
        let p = ffi::FwdArgs {
            q: t4(),
            k: t4(),
            v: t4(),
            o: t4(),
            lse: ffi::TensorView3 { ptr: 0, sizes: [1, 1, 1], strides: [1, 1, 1], dtype: 1 },
            sm_scale: 0.125,
            mask: no_mask(),
            bias: t4(),
            dropout: ffi::DropoutSpec { p: 0.0, seed: 0, offset: 0, offset_base: 0, seed_out: 0, offset_out: 0 },
            varlen: ffi::VarlenSpec {
                cu_seqlens_q: ffi::TensorView1 { ptr: 0, sizes: [0], strides: [1], dtype: 12 },
                cu_seqlens_k: ffi::TensorView1 { ptr: 0, sizes: [0], strides: [1], dtype: 12 },
                max_seqlen_q: 0,
                max_seqlen_k: 0,
                status: 0,
            },
            allow_tf32: false,
            backend: 0,
            softcap: 0.0,
            alibi_slopes: ffi::TensorView2 { ptr: 0, sizes: [0; 2], strides: [0; 2], dtype: 0 },
            sinks: ffi::TensorView1 { ptr: 0, sizes: [0], strides: [0], dtype: 0 },
        };
        let null = ffi::StreamSpec { handle: 0, runtime: 0 };
        let out = attn_fwd(&p, &[], &[], &null);
        assert_eq!(out.code, ErrorKind::NullPointer as i32, "{}", out.message);
        assert!(out.message.contains("q"), "{}", out.message);
        let mut bad = p;
        bad.q.dtype = 42;
        assert_eq!(attn_fwd(&bad, &[], &[], &null).code, ErrorKind::InvalidArgument as i32);
        bad.q.dtype = 2;
        bad.backend = 7;
        let out = attn_fwd(&bad, &[], &[], &null);
        assert_eq!(out.code, ErrorKind::InvalidArgument as i32, "{}", out.message);
        assert!(out.message.contains("backend"), "{}", out.message);
        assert_eq!(guard(|| panic!("expected in this test")).code, ErrorKind::Internal as i32);
        bad.backend = 0;
        let out = attn_fwd(&bad, &[], &[], &ffi::StreamSpec { handle: 0, runtime: 5 });
        assert!(out.code == ErrorKind::InvalidArgument as i32 && out.message.contains("GpuRuntime"), "{}", out.message);
    }

    #[test]
    fn fp8_calls_are_outcomes() {
        // fp8 q (C value 30) over fp16 k: refused before any device is touched, with its reason.
        let t = |dtype: i32, ptr: u64| ffi::TensorView4 { ptr, sizes: [1, 2, 40, 64], strides: [5120, 2560, 64, 1], dtype };
        let ds = |ptr: u64| ffi::TensorView2 { ptr, sizes: [1, 2], strides: [2, 1], dtype: 1 };
        let p = ffi::Fp8FwdArgs {
            q: t(30, 1 << 32),
            k: t(2, 2 << 32),
            v: t(30, 3 << 32),
            o: t(3, 4 << 32),
            lse: ffi::TensorView3 { ptr: 0, sizes: [1, 2, 40], strides: [80, 40, 1], dtype: 1 },
            q_descale: ds(5 << 32),
            k_descale: ds(6 << 32),
            v_descale: ds(7 << 32),
            sm_scale: 0.125,
            mask: no_mask(),
            workspace: 8 << 32,
            workspace_bytes: 1 << 20,
        };
        let null = ffi::StreamSpec { handle: 0, runtime: 0 };
        let out = attn_fwd_fp8(&p, &null);
        assert_eq!(out.code, ErrorKind::DTypeMismatch as i32, "{}", out.message);
        let mut bytes = 7;
        // B·Hk·D·KEYS_PAD: Sk 40 rounds up to 64 key columns.
        assert_eq!(attn_fwd_fp8_workspace_bytes(&t(30, 1 << 32), &mut bytes).code, 0);
        assert_eq!(bytes, 2 * 64 * 64);
        let huge = ffi::TensorView4 { sizes: [u64::MAX / 2, 2, 40, 64], ..t(30, 1 << 32) };
        assert_eq!(attn_fwd_fp8_workspace_bytes(&huge, &mut bytes).code, ErrorKind::TooLarge as i32);
        assert_eq!(bytes, 0);
    }

    #[test]
    fn kvcache_calls_are_outcomes() {
        // B 2, Sq 4, Hq 8, Hk 2, D 128 over paged caches (16 pages of 16 rows, 4 pages per sequence),
        // appending 3 tokens: every field reaches the Rust parameters.
        let t4 = |ptr: u64, sizes: [u64; 4]| ffi::TensorView4 {
            ptr,
            sizes,
            strides: [(sizes[1] * sizes[2] * sizes[3]) as i64, (sizes[2] * sizes[3]) as i64, sizes[3] as i64, 1],
            dtype: 2,
        };
        let paged = || ffi::KvCacheArgs {
            q: t4(1 << 32, [2, 4, 8, 128]),
            k_cache: t4(2 << 32, [16, 16, 2, 128]),
            v_cache: t4(3 << 32, [16, 16, 2, 128]),
            page_table: ffi::TensorView2 { ptr: 4 << 32, sizes: [2, 4], strides: [4, 1], dtype: 12 },
            cache_seqlens: ffi::TensorView1 { ptr: 5 << 32, sizes: [2], strides: [1], dtype: 12 },
            k_new: t4(6 << 32, [2, 3, 2, 128]),
            v_new: t4(7 << 32, [2, 3, 2, 128]),
            o: t4(8 << 32, [2, 4, 8, 128]),
            lse: ffi::TensorView3 { ptr: 9 << 32, sizes: [2, 8, 4], strides: [32, 4, 1], dtype: 1 },
            sm_scale: 0.125,
            mask: ffi::MaskSpec { causal: true, align: 1, window_left: 100, window_right: -1 },
            num_splits: 3,
            workspace: 10 << 32,
            workspace_bytes: 1 << 20,
            status: 11 << 32,
        };
        let p = paged();
        let rust = kvcache_params(&p).unwrap();
        assert!(rust.page_table.is_some() && rust.k_new.is_some() && rust.v_new.is_some() && rust.lse.is_some());
        assert_eq!(rust.mask, Mask::window(100, 0, MaskAlign::BottomRight));
        assert_eq!((rust.num_splits, rust.status, rust.sm_scale), (3, 11 << 32, 0.125));
        assert_eq!(rust.workspace.map(|w| (w.ptr, w.bytes)), Some((10 << 32, 1 << 20)));
        // Valid arguments get past validation to the driver (none here, or a stream of no GPU's).
        let null = ffi::StreamSpec { handle: 0, runtime: 0 };
        let device_error = |code: i32| {
            [ErrorKind::NoDriver, ErrorKind::NoDevice, ErrorKind::Driver, ErrorKind::InvalidArgument].iter().any(|k| *k as i32 == code)
        };
        let out = attn_fwd_kvcache(&p, &null);
        assert!(out.code != 0 && device_error(out.code), "{} {}", out.code, out.message);
        let (mut bytes, mut splits) = (7, 7);
        let out = attn_fwd_kvcache_workspace_bytes(&p, &null, &mut bytes);
        assert!(out.code != 0 && bytes == 0, "{}", out.message);
        let out = attn_fwd_kvcache_num_splits(&p, &null, &mut splits);
        assert!(out.code != 0 && splits == 0, "{}", out.message);
        // Dense: no page table, optional tensors absent (ptr 0), refusals with their reasons.
        let dense = || ffi::KvCacheArgs {
            k_cache: t4(2 << 32, [2, 64, 2, 128]),
            v_cache: t4(3 << 32, [2, 64, 2, 128]),
            page_table: ffi::TensorView2 { ptr: 0, sizes: [0; 2], strides: [0; 2], dtype: 0 },
            k_new: t4(0, [0; 4]),
            v_new: t4(0, [0; 4]),
            lse: ffi::TensorView3 { ptr: 0, sizes: [0; 3], strides: [0; 3], dtype: 0 },
            workspace: 0,
            workspace_bytes: 0,
            status: 0,
            ..paged()
        };
        let rust = kvcache_params(&dense()).unwrap();
        assert!(rust.page_table.is_none() && rust.k_new.is_none() && rust.lse.is_none() && rust.workspace.is_none());
        let q17 = ffi::KvCacheArgs { q: t4(1 << 32, [2, 17, 8, 128]), o: t4(8 << 32, [2, 17, 8, 128]), ..dense() };
        let out = attn_fwd_kvcache(&q17, &null);
        assert!(out.code == ErrorKind::InvalidArgument as i32 && out.message.contains("Sq"), "{}", out.message);
        let one_new = ffi::KvCacheArgs { k_new: t4(6 << 32, [2, 3, 2, 128]), ..dense() };
        let out = attn_fwd_kvcache(&one_new, &null);
        assert!(out.code == ErrorKind::InvalidArgument as i32 && out.message.contains("v_new"), "{}", out.message);
        let hk3 = ffi::KvCacheArgs { k_cache: t4(2 << 32, [2, 64, 3, 128]), v_cache: t4(3 << 32, [2, 64, 3, 128]), ..dense() };
        assert_eq!(attn_fwd_kvcache(&hk3, &null).code, ErrorKind::ShapeMismatch as i32);
        let mut bytes = 7;
        let fp32_lens = ffi::KvCacheArgs { cache_seqlens: ffi::TensorView1 { dtype: 1, ..p.cache_seqlens }, ..dense() };
        assert_eq!(attn_fwd_kvcache_workspace_bytes(&fp32_lens, &null, &mut bytes).code, ErrorKind::DTypeMismatch as i32);
        assert_eq!(bytes, 0);
        let misaligned = ffi::KvCacheArgs { status: (11 << 32) + 2, ..dense() };
        assert_eq!(attn_fwd_kvcache(&misaligned, &null).code, ErrorKind::MisalignedPointer as i32);
    }

    #[test]
    fn a_caught_panic_keeps_its_message() {
        let out = guard(|| panic!("expected in this test: {}", 42));
        assert_eq!(out.code, ErrorKind::Internal as i32);
        assert!(out.message.contains("expected in this test: 42"), "{}", out.message);
        let out = guard(|| std::panic::panic_any(7u32));
        assert_eq!(out.code, ErrorKind::Internal as i32);
        assert!(out.message.contains("panic"), "{}", out.message);
    }

    #[test]
    fn version_and_dropout_counters_are_outcomes() {
        let mut text = String::new();
        assert_eq!(version(&mut text).code, 0);
        assert!(text.starts_with(env!("CARGO_PKG_VERSION")), "{text}");
        let mut count = 7;
        assert_eq!(dropout_offsets_consumed(2, 4, 17, 33, &mut count).code, 0);
        assert_eq!(count, 2 * 4 * (8 * 2) * (4 * 3)); // 8⌈17/16⌉ quad rows, 4⌈33/16⌉ unit columns
        // 2^16 · 2^16 · 2^30 · 2^28 overflows u64: an error, never a wrapped count or a panic.
        let out = dropout_offsets_consumed(1 << 16, 1 << 16, 1 << 30, 1 << 30, &mut count);
        assert_eq!(out.code, ErrorKind::TooLarge as i32, "{}", out.message);
        assert_eq!(count, 0);
    }

    #[test]
    fn masks_translate() {
        let causal = ffi::MaskSpec { causal: true, align: 1, window_left: 7, window_right: -1 };
        assert_eq!(mask(&causal).unwrap(), Mask::window(7, 0, MaskAlign::BottomRight));
        assert_eq!(mask(&no_mask()).unwrap(), Mask::NONE);
        let conflicting = ffi::MaskSpec { causal: true, align: 0, window_left: -1, window_right: 4 };
        assert_eq!(mask(&conflicting).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let bad_align = ffi::MaskSpec { align: 9, ..no_mask() };
        assert_eq!(mask(&bad_align).unwrap_err().kind(), ErrorKind::InvalidArgument);
    }
}
