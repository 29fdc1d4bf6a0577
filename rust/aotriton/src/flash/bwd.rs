//! `attn_bwd`: dQ, dK, dV (and dBias) from Q, K, V, O, dO and the forward's log-sum-exp.
//!
//! Kernels on the caller's stream: `attn_bwd_preprocess` writes delta = rowsum(dO ∘ O) into the
//! caller's `delta` buffer; `attn_bwd_dkdv` computes dK and dV, one program per K/V block and
//! K/V head, summing over the query heads of its GQA group inside the program; `attn_bwd_dq`
//! computes dQ, one program per query block and head; with a bias gradient, `attn_bwd_dbias`
//! sums dS over the bias's broadcast dimensions inside each program. No atomics anywhere: every
//! result is bitwise reproducible run to run and stream to stream, in both modes of
//! [`BwdParams::deterministic`].
//!
//! The Gluon backend (sm_90, see the `flash` module docs for when it is used) launches
//! `attn_bwd_gluon_preprocess` (delta into the caller's `delta`, plus its own row statistics in
//! the workspace), `attn_bwd_gluon` (dK, dV, and dQ partials reduce-added into the workspace),
//! then `attn_bwd_gluon_dq_convert`; with `deterministic`, and always at head dims above 128
//! (where it is faster), dQ comes from a kernel of its own instead of the reduce-adds
//! (`gluon::dq_request`: `attn_bwd_gluon_dq` where the archive holds it, else the portable
//! `attn_bwd_dq`).
use super::gluon;
use super::{
    ATTENTION_INPUTS, AttnShape, Backend, Dropout, Mask, MaskArgs, ScoreModifiers, Varlen, Workspace, axes, bias_args, broadcast_strides,
    check_broadcastable, check_qkv, check_rows, check_tensor, common_args, dropout_args, dropout_regions, mask_args,
    optional_input, strides3, strides4, varlen_regions,
};
use crate::archive::{Functional, KernelMeta};
use crate::dispatch::{
    ArgList, ArgValue, Axes, KernelSet, Launcher, Request, TuningKey, blocks, check_grid, heuristic_pool, preferred_variant,
};
use crate::driver::Stream;
use crate::driver::DeviceInfo;
use crate::error::{Result, bail, checked_product};
use crate::tensor::{DType, Region, TensorView, check_no_aliasing};

/// Parameters of [`attn_bwd`]. Non-exhaustive: build it with [`BwdParams::new`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BwdParams<'a> {
    /// The forward's inputs: q B×Hq×Sq×D, k and v B×Hk×Sk×D.
    pub q: TensorView<4>,
    /// The forward's keys, B×Hk×Sk×D.
    pub k: TensorView<4>,
    /// The forward's values, B×Hk×Sk×D.
    pub v: TensorView<4>,
    /// The forward's output, B×Hq×Sq×D.
    pub o: TensorView<4>,
    /// The gradient of the loss with respect to `o`, B×Hq×Sq×D.
    pub d_o: TensorView<4>,
    /// The forward's log-sum-exp, B×Hq×Sq fp32. Required.
    pub lse: TensorView<3>,
    /// Workspace, B×Hq×Sq fp32: overwritten with rowsum(dO ∘ O). Its contents on entry do not
    /// matter; it must not alias any other tensor of the call.
    pub delta: TensorView<3>,
    /// Gradient outputs, overwritten: dq like q, dk like k, dv like v.
    pub dq: TensorView<4>,
    /// The gradient of k, overwritten.
    pub dk: TensorView<4>,
    /// The gradient of v, overwritten.
    pub dv: TensorView<4>,
    /// The forward's scale, mask, bias, dropout (same seed and offset), packing and TF32 choice.
    pub sm_scale: f32,
    /// The forward's logit soft-capping ([`FwdParams::softcap`](super::FwdParams::softcap); 0 = off).
    pub softcap: f32,
    /// The forward's ALiBi slopes ([`FwdParams::alibi_slopes`](super::FwdParams::alibi_slopes)).
    pub alibi_slopes: Option<TensorView<2>>,
    /// The forward's attention sinks ([`FwdParams::sinks`](super::FwdParams::sinks)): dQ, dK, dV
    /// see them through the LSE.
    pub sinks: Option<TensorView<1>>,
    /// The sinks' gradient, fp32 of Hq elements, overwritten: `-Σ_{b,i} exp(sinks[h] - lse[b,h,i]) ·
    /// delta[b,h,i]`, summed in a fixed order (one more kernel after the others). Needs `sinks`;
    /// `None`: not computed.
    pub dsinks: Option<TensorView<1>>,
    /// The forward's mask.
    pub mask: Mask,
    /// The forward's bias, if it had one.
    pub bias: Option<TensorView<4>>,
    /// The bias gradient, overwritten; same sizes as `bias` (summed over its broadcast
    /// dimensions). Needs `bias`. Its kernel runs one program per bias batch and head, and per
    /// block of at least 16 keys, on grid axes limited to 65535: `sizes[0]·sizes[1]` ≤ 65535
    /// and Sk ≤ 65535·16 = 1,048,560 (else `TooLarge`).
    pub dbias: Option<TensorView<4>>,
    /// The forward's dropout, with the seed and offset it used (its `seed_out`/`offset_out`).
    pub dropout: Option<Dropout>,
    /// The forward's packing of variable-length sequences.
    pub varlen: Option<Varlen<'a>>,
    /// fp32 only: the forward's TF32 choice.
    pub allow_tf32: bool,
    /// Require bitwise-reproducible gradients. The portable kernels are deterministic in both
    /// settings (no atomics); the Gluon backend accumulates dQ with reduce-adds (summation
    /// order varies) at head dims up to 128 unless this is set, in which case it computes dQ
    /// with a kernel of its own, which writes each element once (as it always does above 128).
    pub deterministic: bool,
    /// Which kernel family serves the call; `new` sets [`Backend::Auto`] (see the module docs
    /// of `flash`).
    pub backend: Backend,
    /// Scratch device memory for the Gluon backend (16-byte aligned), at least
    /// [`attn_bwd_workspace_bytes`] bytes; `None` (the default) keeps `Auto` on the portable
    /// kernels, which need none.
    pub workspace: Option<Workspace>,
}

impl<'a> BwdParams<'a> {
    /// The backward of a forward over `q`, `k`, `v` that wrote `o` and `lse`, given `d_o`:
    /// writes `dq`, `dk`, `dv` (and `delta`). The scale is 1/√D, and no mask, bias, dropout,
    /// packing, TF32, workspace; `Backend::Auto`, not deterministic. Set the fields the forward
    /// used.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        q: TensorView<4>,
        k: TensorView<4>,
        v: TensorView<4>,
        o: TensorView<4>,
        d_o: TensorView<4>,
        lse: TensorView<3>,
        delta: TensorView<3>,
        dq: TensorView<4>,
        dk: TensorView<4>,
        dv: TensorView<4>,
    ) -> Self {
        let head_dim = q.sizes[3].max(1) as f32;
        BwdParams {
            q,
            k,
            v,
            o,
            d_o,
            lse,
            delta,
            dq,
            dk,
            dv,
            sm_scale: 1.0 / head_dim.sqrt(),
            softcap: 0.0,
            alibi_slopes: None,
            sinks: None,
            dsinks: None,
            mask: Mask::NONE,
            bias: None,
            dbias: None,
            dropout: None,
            varlen: None,
            allow_tf32: false,
            deterministic: false,
            backend: Backend::Auto,
            workspace: None,
        }
    }
}

/// Enqueues the backward pass on `stream`. All kernels are chosen and loaded before the first
/// is enqueued, so an error leaves nothing half-done. After the first call with a given
/// configuration, a call allocates no host memory and never waits on the device.
///
/// With a workspace of [`attn_bwd_workspace_bytes`] (0 where the portable kernels serve), so
/// that `Backend::Auto` can take the sm_90 Gluon kernels (a whole program:
/// `examples/attn_bwd.rs`):
///
/// ```no_run
/// use aotriton::flash::{self, BwdParams, Workspace};
/// use aotriton::{DType, Stream, TensorView};
/// # let (q, k, v, o, d_o, lse, delta, dq, dk, dv) = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
/// # let allocate = |bytes: u64| 0u64;
/// let (b, h, s, d) = (2, 16, 4096, 128);
/// let t = |ptr| TensorView::contiguous(ptr, [b, h, s, d], DType::BF16);
/// let rows = |ptr| TensorView::contiguous(ptr, [b, h, s], DType::F32);
/// let stream = Stream::null();
/// let mut params =
///     BwdParams::new(t(q), t(k), t(v), t(o), t(d_o), rows(lse), rows(delta), t(dq), t(dk), t(dv));
/// let bytes = flash::attn_bwd_workspace_bytes(&params, stream)?;
/// if bytes > 0 {
///     params.workspace = Some(Workspace { ptr: allocate(bytes), bytes }); // 16-byte aligned
/// }
/// flash::attn_bwd(&params, stream)?;
/// # Ok::<(), aotriton::Error>(())
/// ```
pub fn attn_bwd(params: &BwdParams, stream: Stream) -> Result<()> {
    let (shape, mask) = validate(params)?;
    let key = super::tuning_key(&shape, &mask);
    let (dtype, tf32) = (params.q.dtype, params.allow_tf32);
    let preprocess_axes = preprocess_functional_axes(dtype, &shape);
    let features = [("dropout", params.dropout.is_some()), ("bias", params.bias.is_some())];
    let mut main_axes = axes(dtype, tf32, &shape, &features);
    score_modifiers(params).push_axes(&mut main_axes);
    shape.push_head_dim_v(&mut main_axes);
    let dbias_axes = axes(dtype, tf32, &shape, &features[..1]);
    let preprocess_args = preprocess_args(params, &shape)?;
    let args = kernel_args(params, &shape, &mask)?;
    let args = args.args()?;
    let main_axes = main_axes.as_slice()?;
    let preprocess = Request { family: "attn_bwd_preprocess", axes: preprocess_axes.as_slice()?, args: preprocess_args.args()? };
    let dkdv = Request { family: "attn_bwd_dkdv", axes: main_axes, args };
    let dq = Request { family: "attn_bwd_dq", axes: main_axes, args };
    let dbias = Request { family: "attn_bwd_dbias", axes: dbias_axes.as_slice()?, args };
    let mut dsink_axes = Axes::new();
    dsink_axes.push("dtype", DType::F32.triton_name());
    let dsink = Request { family: "attn_bwd_dsink", axes: dsink_axes.as_slice()?, args };
    let gluon_inputs = gluon::select_by_inputs(params.backend, || {
        gluon::bwd_inputs(params, &shape).and_then(|g| gluon::check_workspace(params.workspace, &g).map(|()| g))
    })
    .map_err(|why| why.error("attn_bwd", None))?;

    let launcher = Launcher::new(stream)?;
    if let (Some(g), Some(workspace)) = (gluon_inputs, params.workspace) {
        let call = gluon::BwdCall::new(params, &shape, &mask, &g, &workspace)?;
        let [pre, main, convert, gluon_dq, dkdv] = call.requests()?;
        let all = [&pre, &main, gluon::dq_request(&launcher, &g, [&convert, &gluon_dq, &dq], key), &dkdv];
        let gluon_kernels = gluon::bwd_kernels(&g, &all);
        let ready = gluon::device_ready(&launcher, gluon_kernels, key);
        if gluon::select_by_device(params.backend, ready).map_err(|why| why.error("attn_bwd", Some(launcher.device())))? {
            return gluon::launch_bwd(&launcher, gluon_kernels, &shape, &g, key);
        }
    }
    let choose = |f: &Functional, k: KernelSet, _: &DeviceInfo| choose_kernel(f, k, key);
    let kernels = [
        launcher.prepare(&preprocess, choose, |m| Ok(preprocess_grid(&shape, kernel_blocks(m))))?,
        launcher.prepare(&dkdv, choose, |m| Ok(dkdv_grid(&shape, kernel_blocks(m))))?,
        launcher.prepare(&dq, choose, |m| Ok(dq_grid(&shape, kernel_blocks(m))))?,
    ];
    let dbias_kernel = match &params.dbias {
        Some(db) => Some(launcher.prepare(&dbias, choose, |m| dbias_grid(db, &shape, kernel_blocks(m)))?),
        None => None,
    };
    let dsink_kernel = match &params.dsinks {
        Some(_) => Some(launcher.prepare(&dsink, choose, |_| Ok(dsink_grid(&shape)))?),
        None => None,
    };
    for kernel in kernels.iter().chain(&dbias_kernel).chain(&dsink_kernel) {
        launcher.launch(kernel)?;
    }
    Ok(())
}

/// The workspace bytes [`attn_bwd`] needs for `params` on `stream`'s device: 0 when the call
/// would run the portable kernels (`Backend::Portable`, or `Auto` on inputs or a device the
/// Gluon backend does not serve), else `B·Hq·SQ_PAD·(W + 2)·4` with `SQ_PAD` = Sq rounded up to
/// 128 and `W` = the head dim rounded up to 64 or 128 where the Gluon kernels accumulate dQ
/// themselves, 0 where dQ has its own kernel (`deterministic`, or head dims above 128); plus
/// `2·2·B·Hk·Sk·128·4` for the fp32 dK/dV partials of a GQA head split (groups of 4 or more query
/// heads per K/V head with `G·Sq` ≥ 24576 at head dims 65-128, fixed-length: `flash::gluon` `head_split`). The Gluon backend
/// does not serve calls whose workspace TMA cannot address (`B·Hq·SQ_PAD` ≥ 2^32 rows). The
/// workspace itself is ignored. Errors: those `attn_bwd` reports before launching (validation,
/// a forced backend that cannot serve the call, no driver, an invalid stream).
pub fn attn_bwd_workspace_bytes(params: &BwdParams, stream: Stream) -> Result<u64> {
    let (shape, mask) = validate(params)?;
    preprocess_args(params, &shape)?;
    kernel_args(params, &shape, &mask)?;
    let Some(g) = gluon::select_by_inputs(params.backend, || gluon::bwd_inputs(params, &shape))
        .map_err(|why| why.error("attn_bwd", None))?
    else {
        return Ok(0);
    };
    let launcher = Launcher::new(stream)?;
    // Whether the kernels would serve the call depends on the workspace only through its
    // alignment: any 16-byte aligned stand-in answers it.
    let stand_in = Workspace { ptr: 1 << 20, bytes: g.workspace_bytes };
    let call = gluon::BwdCall::new(params, &shape, &mask, &g, &stand_in)?;
    let [pre, main, convert, gluon_dq, dkdv] = call.requests()?;
    let portable_args = kernel_args(params, &shape, &mask)?;
    let features = [("dropout", params.dropout.is_some()), ("bias", false)];
    let portable_axes = axes(params.q.dtype, params.allow_tf32, &shape, &features);
    let dq = Request { family: "attn_bwd_dq", axes: portable_axes.as_slice()?, args: portable_args.args()? };
    // The same rule as attn_bwd, so the answer is the workspace the call will use.
    let key = super::tuning_key(&shape, &mask);
    let all = [&pre, &main, gluon::dq_request(&launcher, &g, [&convert, &gluon_dq, &dq], key), &dkdv];
    let ready = gluon::device_ready(&launcher, gluon::bwd_kernels(&g, &all), key);
    let gluon = gluon::select_by_device(params.backend, ready).map_err(|why| why.error("attn_bwd", Some(launcher.device())))?;
    Ok(if gluon { g.workspace_bytes } else { 0 })
}

/// The smallest BLOCK_M or BLOCK_N of any compiled attention kernel (`tl.dot` tiles are at least
/// 16 wide): grids computed with it bound every device's real ones from above.
const MIN_BLOCK: u64 = 16;

/// Blocks of a portable kernel's `key` (BLOCK_M, BLOCK_N; 64 where its config does not say)
/// covering `len` rows.
pub(crate) fn kernel_blocks(meta: &KernelMeta) -> impl Fn(u64, &str) -> u64 + '_ {
    move |len, key| blocks(len, meta, key, 64)
}

/// Grids of the portable backward kernels (kernels/flash/bwd_*.py), from `blocks(len, key)`.
fn preprocess_grid(shape: &AttnShape, blocks: impl Fn(u64, &str) -> u64) -> [u64; 3] {
    [blocks(shape.seqlen_q, "BLOCK_M"), shape.heads_q, shape.batch]
}

fn dkdv_grid(shape: &AttnShape, blocks: impl Fn(u64, &str) -> u64) -> [u64; 3] {
    [blocks(shape.seqlen_k, "BLOCK_N"), shape.heads_k, shape.batch]
}

pub(crate) fn dq_grid(shape: &AttnShape, blocks: impl Fn(u64, &str) -> u64) -> [u64; 3] {
    [blocks(shape.seqlen_q, "BLOCK_M"), shape.heads_q, shape.batch]
}

/// One program per query head, walking every sequence's rows.
fn dsink_grid(shape: &AttnShape) -> [u64; 3] {
    [shape.heads_q, 1, 1]
}

/// One program per query block (one in all when the bias is broadcast over rows), key block,
/// and bias batch × head.
fn dbias_grid(dbias: &TensorView<4>, shape: &AttnShape, blocks: impl Fn(u64, &str) -> u64) -> Result<[u64; 3]> {
    let rows = if dbias.sizes[2] == 1 { 1 } else { shape.seqlen_q };
    let programs = checked_product("dbias programs (its batches · heads)", &dbias.sizes[..2])?;
    Ok([blocks(rows, "BLOCK_M"), blocks(shape.seqlen_k, "BLOCK_N"), programs])
}

/// Checks before the driver is touched that the portable kernels' grids fit the launch limits
/// with any compiled block sizes (each at least [`MIN_BLOCK`]), so that whether a call is
/// refused does not depend on the device; [`Launcher::prepare`] checks the real grids.
fn check_grids(p: &BwdParams, shape: &AttnShape) -> Result<()> {
    let floor = |len: u64, _: &str| len.div_ceil(MIN_BLOCK);
    check_grid("attn_bwd_preprocess", preprocess_grid(shape, floor))?;
    check_grid("attn_bwd_dkdv", dkdv_grid(shape, floor))?;
    check_grid("attn_bwd_dq", dq_grid(shape, floor))?;
    if let Some(db) = &p.dbias {
        check_grid("attn_bwd_dbias", dbias_grid(db, shape, floor)?)?;
    }
    if p.dsinks.is_some() {
        check_grid("attn_bwd_dsink", dsink_grid(shape))?;
    }
    Ok(())
}

/// The backward's aliasing check: dq, dk, dv, delta, dbias and the workspace are written, so
/// none may overlap another of them or any input.
fn check_aliasing(p: &BwdParams) -> Result<()> {
    let ([seed, offset], _) = dropout_regions(p.dropout.as_ref())?;
    let ([cu_q, cu_k], status) = varlen_regions(p.varlen.as_ref())?;
    let dbias = match &p.dbias {
        Some(db) => Region::output("dbias", db)?,
        None => Region::NONE,
    };
    let workspace = match &p.workspace {
        Some(ws) => Region::raw("workspace", ws.ptr, ws.bytes)?,
        None => Region::NONE,
    };
    let dsinks = match &p.dsinks {
        Some(ds) => Region::output("dsinks", ds)?,
        None => Region::NONE,
    };
    let [slopes, sinks] = score_modifiers(p).regions()?;
    check_no_aliasing(
        &[
            Region::output("dq", &p.dq)?,
            Region::output("dk", &p.dk)?,
            Region::output("dv", &p.dv)?,
            Region::output("delta", &p.delta)?,
            dbias,
            dsinks,
            workspace,
            status,
        ],
        &[
            Region::input("q", &p.q)?,
            Region::input("k", &p.k)?,
            Region::input("v", &p.v)?,
            Region::input("o", &p.o)?,
            Region::input("d_o", &p.d_o)?,
            Region::input("lse", &p.lse)?,
            optional_input("bias", p.bias.as_ref())?,
            slopes,
            sinks,
            seed,
            offset,
            cu_q,
            cu_k,
        ],
    )
}

/// Size arguments the kernels take as int32, or `TooLarge` naming the first that does not fit.
pub(crate) fn int32_args<T: Copy + TryInto<i32> + std::fmt::Display, const N: usize>(
    sizes: [(&'static str, T); N],
) -> Result<[(&'static str, ArgValue); N]> {
    let mut args = [("", ArgValue::I32(0)); N];
    for (arg, (name, value)) in args.iter_mut().zip(sizes) {
        let Ok(int) = value.try_into() else {
            bail!(TooLarge, "{name} = {value} does not fit the kernels' int32 argument");
        };
        *arg = (name, ArgValue::I32(int));
    }
    Ok(args)
}

/// The portable backward families' config choice: the `aligned` variant when its hints fit; among
/// those the kernel the tuning database picked for the call's cell ([`TuningKey::tuned`]), else
/// the first (the heuristic compiles one config per functional).
pub(crate) fn choose_kernel(functional: &Functional, fitting: KernelSet, key: TuningKey) -> usize {
    let pool = preferred_variant(functional, fitting);
    key.tuned(functional, &pool).or_else(|| heuristic_pool(functional, pool).first()).unwrap_or(0)
}

pub(crate) fn preprocess_args(p: &BwdParams, shape: &AttnShape) -> Result<ArgList> {
    use ArgValue::Ptr;
    let mut args = ArgList::new();
    args.extend([("O", Ptr(p.o.ptr)), ("DO", Ptr(p.d_o.ptr)), ("DELTA", Ptr(p.delta.ptr))]);
    args.extend(strides4(["stride_oz", "stride_oh", "stride_om"], &p.o, shape));
    args.extend(strides4(["stride_doz", "stride_doh", "stride_dom"], &p.d_o, shape));
    args.extend(strides3(["stride_deltaz", "stride_deltah"], &p.delta, shape));
    // O and dO have V's head dim.
    args.extend(int32_args([("N_CTX_Q", shape.seqlen_q), ("D_HEAD", shape.head_dim_v)])?);
    args.extend(super::varlen_args(shape));
    Ok(args)
}

/// `attn_bwd_preprocess`'s axes: the dtype and V's head-dim bucket (it reads O and dO).
pub(crate) fn preprocess_functional_axes(dtype: DType, shape: &AttnShape) -> Axes {
    let mut axes = Axes::new();
    axes.push("dtype", dtype.triton_name());
    axes.push("head_dim", shape.head_dim_v_axis);
    axes
}

pub(crate) fn score_modifiers<'p>(p: &'p BwdParams) -> ScoreModifiers<'p> {
    ScoreModifiers { softcap: p.softcap, alibi_slopes: p.alibi_slopes.as_ref(), sinks: p.sinks.as_ref() }
}

/// Arguments of `attn_bwd_dkdv`, `attn_bwd_dq` and `attn_bwd_dbias` by name (each takes the ones
/// it declares).
pub(crate) fn kernel_args(p: &BwdParams, shape: &AttnShape, mask: &MaskArgs) -> Result<ArgList> {
    use ArgValue::{F32, I64, Ptr};
    let mut args = ArgList::new();
    args.extend([
        ("Q", Ptr(p.q.ptr)),
        ("K", Ptr(p.k.ptr)),
        ("V", Ptr(p.v.ptr)),
        ("DO", Ptr(p.d_o.ptr)),
        ("LSE", Ptr(p.lse.ptr)),
        ("DELTA", Ptr(p.delta.ptr)),
        ("DQ", Ptr(p.dq.ptr)),
        ("DK", Ptr(p.dk.ptr)),
        ("DV", Ptr(p.dv.ptr)),
        ("sm_scale", F32(p.sm_scale)),
    ]);
    args.extend(score_modifiers(p).args());
    args.extend(strides4(["stride_qz", "stride_qh", "stride_qm"], &p.q, shape));
    args.extend(strides4(["stride_kz", "stride_kh", "stride_kn"], &p.k, shape));
    args.extend(strides4(["stride_vz", "stride_vh", "stride_vn"], &p.v, shape));
    args.extend(strides4(["stride_doz", "stride_doh", "stride_dom"], &p.d_o, shape));
    args.extend(strides4(["stride_dqz", "stride_dqh", "stride_dqm"], &p.dq, shape));
    args.extend(strides4(["stride_dkz", "stride_dkh", "stride_dkn"], &p.dk, shape));
    args.extend(strides4(["stride_dvz", "stride_dvh", "stride_dvn"], &p.dv, shape));
    args.extend(strides3(["stride_lz", "stride_lh"], &p.lse, shape));
    args.extend(strides3(["stride_deltaz", "stride_deltah"], &p.delta, shape));
    bias_args(&mut args, p.bias.as_ref(), shape, p.q.dtype)?;
    let (dbias, [dbz, dbh, dbm], sizes) = match &p.dbias {
        Some(db) => (db.ptr, broadcast_strides(db), db.sizes),
        None => (0, [0; 3], [1; 4]),
    };
    args.extend([("DBIAS", Ptr(dbias)), ("stride_dbz", I64(dbz)), ("stride_dbh", I64(dbh)), ("stride_dbm", I64(dbm))]);
    args.extend([("SINKS", Ptr(p.sinks.map_or(0, |s| s.ptr))), ("DSINK", Ptr(p.dsinks.map_or(0, |s| s.ptr)))]);
    args.extend(int32_args([
        ("N_BATCH", shape.batch),
        ("BIAS_BATCHES", sizes[0]),
        ("BIAS_HEADS", sizes[1]),
        ("BIAS_ROWS", sizes[2]),
        ("N_HEADS_Q", shape.heads_q),
    ])?);
    args.extend(common_args(shape, mask));
    dropout_args(&mut args, p.dropout.as_ref(), false)?;
    Ok(args)
}

/// Checks every argument before anything touches the GPU (bias and dropout are checked where
/// their arguments are built, which `attn_bwd` also does first).
pub(crate) fn validate(p: &BwdParams) -> Result<(AttnShape, MaskArgs)> {
    let shape = check_qkv(&p.q, &p.k, &p.v, p.varlen.as_ref(), "attn_bwd_dq", &ATTENTION_INPUTS)?;
    let dtype = p.q.dtype;
    if p.lse.is_null() {
        bail!(NullPointer, "lse: the backward needs the forward's log-sum-exp (ask attn_fwd for it)");
    }
    let (tokens_q, tokens_k) = (p.q.sizes[2], p.k.sizes[2]);
    let rows = [p.q.sizes[0], shape.heads_q, tokens_q];
    // O, dO and dV have V's head dim; dQ and dK Q/K's.
    let mut o_sizes = p.q.sizes;
    o_sizes[3] = shape.head_dim_v;
    for (name, t, sizes, tokens) in [
        ("o", &p.o, o_sizes, tokens_q),
        ("d_o", &p.d_o, o_sizes, tokens_q),
        ("dq", &p.dq, p.q.sizes, tokens_q),
        ("dk", &p.dk, p.k.sizes, tokens_k),
        ("dv", &p.dv, p.v.sizes, tokens_k),
    ] {
        check_tensor(name, t, sizes, dtype)?;
        check_rows(name, t, tokens, sizes[3])?;
    }
    check_tensor("lse", &p.lse, rows, DType::F32)?;
    check_tensor("delta", &p.delta, rows, DType::F32)?;
    super::check_scalars(&shape, p.dropout.as_ref(), p.sm_scale)?;
    score_modifiers(p).check(&shape, dtype, p.dropout.is_some(), p.bias.is_some())?;
    if let Some(dsinks) = &p.dsinks {
        if p.sinks.is_none() {
            bail!(InvalidArgument, "dsinks: the sinks' gradient needs the forward's sinks (pass them too)");
        }
        check_tensor("dsinks", dsinks, [shape.heads_q], DType::F32)?;
    }
    if let Some(ws) = &p.workspace {
        if ws.ptr == 0 {
            bail!(NullPointer, "workspace: pointer is null (pass no workspace instead)");
        }
        if !ws.ptr.is_multiple_of(16) {
            bail!(MisalignedPointer, "workspace: address {:#x} is not 16-byte aligned", ws.ptr);
        }
    }
    if let Some(db) = &p.dbias {
        let Some(bias) = &p.bias else {
            bail!(InvalidArgument, "dbias is given without a bias");
        };
        check_broadcastable("dbias", db, &shape, dtype)?;
        if db.sizes != bias.sizes {
            bail!(ShapeMismatch, "dbias.sizes is {:?}, expected the bias's {:?}", db.sizes, bias.sizes);
        }
    }
    check_grids(p, &shape)?;
    check_aliasing(p)?;
    Ok((shape, mask_args(&p.mask, &shape)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    /// A backward call B×Hq×Sq×64 fp16 (Hk = 1) with a bias and its gradient of `bias_sizes`,
    /// each tensor at its own fake device address 2^32 bytes apart.
    fn with_dbias(b: u64, hq: u64, sq: u64, sk: u64, bias_sizes: [u64; 4]) -> BwdParams<'static> {
        let at = |i: u64| i << 32;
        let t = |i, h, s| TensorView::contiguous(at(i), [b, h, s, 64], DType::F16);
        let rows = |i| TensorView::contiguous(at(i), [b, hq, sq], DType::F32);
        let (q, kv) = (|i| t(i, hq, sq), |i| t(i, 1, sk));
        let mut p = BwdParams::new(q(1), kv(2), kv(3), q(4), q(5), rows(6), rows(7), q(8), kv(9), kv(10));
        p.bias = Some(TensorView::contiguous(at(11), bias_sizes, DType::F16));
        p.dbias = Some(TensorView::contiguous(at(12), bias_sizes, DType::F16));
        p
    }

    #[test]
    fn dbias_grids_above_the_launch_limits_are_refused_before_anything_is_launched() {
        // z = B·Hq = 65536 dBias programs.
        let full = with_dbias(256, 256, 16, 16, [256, 256, 16, 16]);
        // y = ⌈Sk / BLOCK_N⌉ = 2^23 / 64 or more.
        let keys = with_dbias(1, 1, 16, 1 << 23, [1, 1, 1, 1 << 23]);
        for (p, axis, extent) in [(full, "z", "65536"), (keys, "y", "")] {
            for err in [attn_bwd(&p, Stream::null()).unwrap_err(), attn_bwd_workspace_bytes(&p, Stream::null()).unwrap_err()] {
                assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
                let message = err.message();
                assert!(message.contains("attn_bwd_dbias") && message.contains(&format!("{axis} = {extent}")), "{err}");
            }
        }
        // The same calls with the bias broadcast over batch and heads stay within the grid.
        let p = with_dbias(256, 256, 16, 16, [1, 256, 16, 16]);
        assert!(validate(&p).is_ok());
    }

    #[test]
    fn v_head_dim_sizes_o_do_dv_and_the_preprocess() {
        // Q/K head dim 64, V's 32: O, dO and dV take V's; the preprocess (O, dO) runs at its bucket.
        let (b, hq, sq, sk) = (2, 4, 33, 17);
        let at = |i: u64| i << 32;
        let t = |i, h, s, d| TensorView::contiguous(at(i), [b, h, s, d], DType::F16);
        let rows = |i| TensorView::contiguous(at(i), [b, hq, sq], DType::F32);
        let (q, k) = (|i, d| t(i, hq, sq, d), |i, d| t(i, 1, sk, d));
        let p = BwdParams::new(q(1, 64), k(2, 64), k(3, 32), q(4, 32), q(5, 32), rows(6), rows(7), q(8, 64), k(9, 64), k(10, 32));
        let (shape, mask) = validate(&p).unwrap();
        assert_eq!((shape.head_dim, shape.head_dim_v, shape.head_dim_v_axis), (64, 32, "32"));
        let axes = preprocess_functional_axes(DType::F16, &shape);
        assert_eq!(axes.as_slice().unwrap(), &[("dtype", "fp16"), ("head_dim", "32")]);
        let pre = preprocess_args(&p, &shape).unwrap();
        assert!(pre.args().unwrap().contains(&("D_HEAD", ArgValue::I32(32))));
        let args = kernel_args(&p, &shape, &mask).unwrap();
        let args = args.args().unwrap();
        assert!(args.contains(&("D_HEAD", ArgValue::I32(64))) && args.contains(&("D_HEAD_V", ArgValue::I32(32))));
        // Each of O, dO and dV must have V's head dim; dQ and dK Q's.
        for (name, wrong) in [
            ("o", BwdParams { o: q(4, 64), ..p }),
            ("d_o", BwdParams { d_o: q(5, 64), ..p }),
            ("dv", BwdParams { dv: k(10, 64), ..p }),
            ("dq", BwdParams { dq: q(8, 32), ..p }),
        ] {
            let err = validate(&wrong).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ShapeMismatch, "{err}");
            assert!(err.message().starts_with(&format!("{name}.sizes")), "{err}");
        }
    }

    #[test]
    fn the_sinks_gradient_needs_the_sinks_and_its_own_memory() {
        let (b, hq, sq, sk) = (2, 4, 33, 17);
        let sinks = |i: u64, n| TensorView::contiguous(i << 32, [n], DType::F32);
        let mut p = with_dbias(b, hq, sq, sk, [b, hq, sq, sk]);
        (p.bias, p.dbias) = (None, None);
        p.dsinks = Some(sinks(13, hq));
        let err = validate(&p).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.message().contains("dsinks"), "{err}");
        p.sinks = Some(sinks(14, hq));
        assert!(validate(&p).is_ok());
        p.dsinks = Some(sinks(14, hq)); // the gradient over the sinks themselves
        assert_eq!(validate(&p).unwrap_err().kind(), ErrorKind::InvalidArgument);
        p.dsinks = Some(sinks(13, hq - 1));
        assert_eq!(validate(&p).unwrap_err().kind(), ErrorKind::ShapeMismatch);
        // Sinks with a bias are not built.
        p.dsinks = None;
        p.bias = Some(TensorView::contiguous(11 << 32, [b, hq, sq, sk], DType::F16));
        assert_eq!(validate(&p).unwrap_err().kind(), ErrorKind::InvalidArgument);
    }
}
