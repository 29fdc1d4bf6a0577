//! The seed-compatible C++ API (ROCm/aotriton 0.10: `aotriton::v2::flash` positional functions,
//! `aotriton::v3::flash` params structs, `check_gpu`; include/aotriton/flash.h documents the
//! contract) translated into the runtime's own calls. v2src/seed.cpp only copies the caller's
//! arguments into the bridge structs; every decision (layouts, masks, dropout, refusals, the
//! hipError_t of each outcome) is made here.
use aotriton::flash::{self, Dropout, Mask, MaskAlign, Varlen};
use aotriton::{Error, ErrorKind, TensorView, device_support};

use super::ffi::{Scalar, SeedBwdArgs, SeedDropout, SeedFwdArgs, SeedOutcome, SeedShape, StreamSpec, TensorView2, TensorView4};
use super::{caught, dtype, dtype_name, optional, stream};

/// HIP's status values the seed API returns (hip_runtime_api.h; include/aotriton/hip_error.h).
mod hip {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_VALUE: i32 = 1;
    pub const INVALID_SYMBOL: i32 = 13;
    pub const INSUFFICIENT_DRIVER: i32 = 35;
    pub const NO_DEVICE: i32 = 100;
    pub const INVALID_IMAGE: i32 = 200;
    pub const NO_BINARY_FOR_GPU: i32 = 209;
    pub const PEER_ACCESS_UNSUPPORTED: i32 = 217;
    pub const SHARED_OBJECT_SYMBOL_NOT_FOUND: i32 = 302;
    pub const NOT_SUPPORTED: i32 = 801;
    pub const UNKNOWN: i32 = 999;
}

/// The seed's WindowValue sentinels.
const TOP_LEFT_ALIGNED: i32 = -2147483647;
const BOTTOM_RIGHT_ALIGNED: i32 = -2147483646;
/// CausalType and VarlenType values.
const CAUSAL_NONE: i32 = 0;
const CAUSAL_WINDOWED: i32 = 3;
const VARLEN_NONE: i32 = 0;
const VARLEN_COMPACT: i32 = 1;
const VARLEN_PADDED: i32 = 2;
const VARLEN_STRIDED: i32 = 3;

/// The hipError_t the seed returns for what went wrong.
fn hip_status(kind: ErrorKind) -> i32 {
    use ErrorKind::*;
    match kind {
        InvalidArgument | DTypeMismatch | ShapeMismatch | BadStrides | UnsupportedHeadDim | NullPointer | MisalignedPointer
        | EmptyInput | UnsupportedDType | TooLarge => hip::INVALID_VALUE,
        UnsupportedVersion => hip::INVALID_SYMBOL,
        UnsupportedByBackend => hip::PEER_ACCESS_UNSUPPORTED,
        NoDriver => hip::INSUFFICIENT_DRIVER,
        NoDevice => hip::NO_DEVICE,
        UnsupportedGpu => hip::NO_BINARY_FOR_GPU,
        KernelNotFound => hip::SHARED_OBJECT_SYMBOL_NOT_FOUND,
        BadArchive | UntrustedImages => hip::INVALID_IMAGE,
        Driver | Internal => hip::UNKNOWN,
    }
}

/// A seed feature this library does not have: hipErrorNotSupported, kept apart from argument
/// errors so the caller can fall back. Its aotriton::Status is kInvalidArgument.
struct NotSupported(String);

/// What a seed call can fail with.
enum Failure {
    Error(Error),
    NotSupported(NotSupported),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Error(e)
    }
}

impl From<NotSupported> for Failure {
    fn from(n: NotSupported) -> Self {
        Failure::NotSupported(n)
    }
}

type Seeded<T> = std::result::Result<T, Failure>;

fn invalid(message: String) -> Failure {
    Failure::Error(Error::new(ErrorKind::InvalidArgument, message))
}

/// Runs `f` inside the bridge's panic guard and turns its outcome into the seed's.
fn seeded(f: impl FnOnce() -> Seeded<()>) -> SeedOutcome {
    let mut refused: Option<String> = None;
    let outcome = caught(|| match f() {
        Ok(()) => Ok(()),
        Err(Failure::Error(e)) => Err(e),
        Err(Failure::NotSupported(NotSupported(message))) => {
            refused = Some(message);
            Ok(())
        }
    });
    match (refused, outcome) {
        (Some(message), _) => SeedOutcome { hip: hip::NOT_SUPPORTED, code: ErrorKind::InvalidArgument as i32, message },
        (None, Ok(())) => SeedOutcome { hip: hip::SUCCESS, code: 0, message: String::new() },
        (None, Err(e)) => SeedOutcome { hip: hip_status(e.kind()), code: e.kind() as i32, message: e.message().to_string() },
    }
}

pub fn seed_not_supported(what: &str) -> SeedOutcome {
    seeded(|| Err(NotSupported(what.to_string()).into()))
}

pub fn seed_check_gpu(s: &StreamSpec) -> SeedOutcome {
    seeded(|| {
        let support = device_support(stream(s)?)?;
        match support.served_by {
            Some(_) => Ok(()),
            None => Err(Error::new(
                ErrorKind::UnsupportedGpu,
                format!("check_gpu: {} ({}): {}", support.arch, support.target_id, support.unsupported.unwrap_or_default()),
            )
            .into()),
        }
    })
}

/// The archs whose kernels this release has run on hardware (README, "Which archs run where"):
/// every other one is experimental to the seed's callers (PyTorch then asks its user to opt in
/// with TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1 before routing attention here).
const VALIDATED_ARCHS: [&str; 1] = ["sm_90"];

pub fn seed_arch_experimental(s: &StreamSpec, experimental: &mut bool) -> SeedOutcome {
    *experimental = false;
    seeded(|| {
        let support = device_support(stream(s)?)?;
        *experimental = !support.served_by.as_deref().is_some_and(|arch| VALIDATED_ARCHS.contains(&arch));
        Ok(())
    })
}

pub fn seed_multiprocessors(s: &StreamSpec, count: &mut i32) -> SeedOutcome {
    *count = 0;
    seeded(|| {
        let support = device_support(stream(s)?)?;
        *count = i32::try_from(support.multiprocessors).unwrap_or(i32::MAX);
        Ok(())
    })
}

fn view4(t: &TensorView4, name: &str) -> Result<TensorView<4>, Error> {
    Ok(TensorView::new(t.ptr, t.sizes, t.strides, dtype(t.dtype, name)?))
}

/// Whether a seed tensor argument is given: the seed's callers pass empty views (null data or a
/// zero size) for "none".
fn given(ptr: u64, sizes: &[u64]) -> bool {
    ptr != 0 && sizes.iter().all(|&n| n != 0)
}

fn product(what: &str, a: u64, b: u64) -> Result<u64, Error> {
    a.checked_mul(b).ok_or_else(|| Error::new(ErrorKind::TooLarge, format!("{what}: {a} · {b} overflows 64 bits")))
}

fn stride_product(what: &str, a: u64, stride: i64) -> Result<i64, Error> {
    i64::try_from(a)
        .ok()
        .and_then(|a| a.checked_mul(stride))
        .ok_or_else(|| Error::new(ErrorKind::TooLarge, format!("{what}: stride {stride} · {a} overflows 64 bits")))
}

/// The seed's (rows, columns) fp32 row statistics (softmax_lse, delta) as the runtime's
/// B×Hq×Sq view. `q` is the query view (B×Hq×Sq×D, or 1×Hq×total_q×D when packed with `packed`
/// = (batch, max_seqlen_q)). A null view stays null (the runtime then says what it requires).
fn rows(t: &TensorView2, name: &str, q: &TensorView4, packed: Option<(u64, u64)>) -> Result<Option<TensorView<3>>, Error> {
    if t.ptr == 0 {
        return Ok(None);
    }
    let element = dtype(t.dtype, name)?;
    let [_, hq, sq, _] = q.sizes;
    let [rows, columns] = t.sizes;
    let [row_stride, column_stride] = t.strides;
    let strided = |b: u64| -> Result<TensorView<3>, Error> {
        let batch_stride = stride_product(name, hq, row_stride)?;
        Ok(TensorView::new(t.ptr, [b, hq, columns], [batch_stride, row_stride, column_stride], element))
    };
    match packed {
        None => {
            let b = q.sizes[0];
            if rows != product(name, b, hq)? || columns != sq {
                return Err(Error::new(
                    ErrorKind::ShapeMismatch,
                    format!("{name}: sizes ({rows}, {columns}); the seed's layout is (B·Hq, Sq) = ({}, {sq})", b.saturating_mul(hq)),
                ));
            }
            Ok(Some(strided(b)?))
        }
        Some((batch, max_q)) => {
            let total_q = sq;
            if rows == hq && columns == total_q {
                return Ok(Some(strided(1)?));
            }
            // The 0.10 callers' (B·Hq, max_seqlen_q) buffer: used, when dense and large enough, as
            // a dense (Hq, total_q) one in its first Hq·total_q elements.
            let dense = column_stride == 1 && u64::try_from(row_stride).ok() == Some(columns);
            let fits = total_q <= product(name, batch, max_q)?;
            if rows == product(name, batch, hq)? && columns == max_q && dense && fits {
                let total = i64::try_from(total_q).map_err(|_| Error::new(ErrorKind::TooLarge, format!("{name}: total_q {total_q}")))?;
                return Ok(Some(TensorView::new(t.ptr, [1, hq, total_q], [stride_product(name, hq, total)?, total, 1], element)));
            }
            Err(Error::new(
                ErrorKind::ShapeMismatch,
                format!(
                    "{name}: sizes ({rows}, {columns}) strides ({row_stride}, {column_stride}); a packed batch takes (Hq, total_q) = \
                     ({hq}, {total_q}), or a dense (B·Hq, max_seqlen_q) = ({}, {max_q}) buffer",
                    batch.saturating_mul(hq)
                ),
            ))
        }
    }
}

/// A required row statistic: a null one becomes a null view of the expected sizes, so the
/// runtime reports it as kNullPointer naming it.
fn required_rows(t: &TensorView2, name: &str, q: &TensorView4, packed: Option<(u64, u64)>) -> Result<TensorView<3>, Error> {
    match rows(t, name, q, packed)? {
        Some(view) => Ok(view),
        None => {
            let [b, hq, sq, _] = q.sizes;
            let element = dtype(t.dtype, name)?;
            Ok(TensorView::contiguous(0, [b, hq, sq], element))
        }
    }
}

fn mask(shape: &SeedShape) -> Seeded<Mask> {
    match shape.causal_type {
        CAUSAL_NONE => Ok(Mask::NONE),
        CAUSAL_WINDOWED => {
            let sentinel = |w: i32| w == TOP_LEFT_ALIGNED || w == BOTTOM_RIGHT_ALIGNED;
            let (left, right) = (shape.window_left, shape.window_right);
            if sentinel(left) && sentinel(right) && left != right {
                return Err(invalid(format!(
                    "window_left and window_right: one is TopLeftAligned, the other BottomRightAligned ({left}, {right})"
                )));
            }
            let align = if left == BOTTOM_RIGHT_ALIGNED || right == BOTTOM_RIGHT_ALIGNED {
                MaskAlign::BottomRight
            } else {
                MaskAlign::TopLeft
            };
            let side = |name: &str, w: i32, at_sentinel: i32| -> Seeded<i32> {
                match w {
                    w if sentinel(w) => Ok(at_sentinel),
                    w if w >= 0 => Ok(w),
                    w => Err(invalid(format!("{name} {w}: a window is >= 0 or a WindowValue sentinel"))),
                }
            };
            // A sentinel on the left leaves that side unbounded; on the right it is the diagonal.
            Ok(Mask::window(side("window_left", left, -1)?, side("window_right", right, 0)?, align))
        }
        other => Err(invalid(format!("causal_type {other}: this library takes CausalType::None (0) or WindowedAttention (3)"))),
    }
}

/// The packing of a seed call: the runtime's Varlen and (batch, max_seqlen_q) for the row
/// statistics' layouts.
fn varlen(shape: &SeedShape) -> Seeded<Option<(Varlen<'static>, (u64, u64))>> {
    match shape.varlen_type {
        VARLEN_NONE => {
            if shape.cu_seqlens_q.ptr != 0 || shape.cu_seqlens_k.ptr != 0 {
                return Err(invalid("cu_seqlens_q/k are given but varlen_type is VarlenType::None".to_string()));
            }
            Ok(None)
        }
        VARLEN_COMPACT => {
            let max = |name: &str, n: i32| u64::try_from(n).map_err(|_| invalid(format!("{name} {n} is negative")));
            let (max_q, max_k) = (max("max_seqlen_q", shape.max_seqlen_q)?, max("max_seqlen_k", shape.max_seqlen_k)?);
            let cu = |t: &super::ffi::TensorView1, name: &str| -> Result<TensorView<1>, Error> {
                Ok(TensorView::new(t.ptr, t.sizes, t.strides, dtype(t.dtype, name)?))
            };
            let batch = shape.cu_seqlens_q.sizes[0].saturating_sub(1);
            let packing = Varlen {
                cu_seqlens_q: cu(&shape.cu_seqlens_q, "cu_seqlens_q")?,
                cu_seqlens_k: cu(&shape.cu_seqlens_k, "cu_seqlens_k")?,
                max_seqlen_q: max_q,
                max_seqlen_k: max_k,
                host_cu_seqlens: None,
                status: 0,
            };
            Ok(Some((packing, (batch, max_q))))
        }
        VARLEN_PADDED | VARLEN_STRIDED => Err(NotSupported(format!(
            "varlen_type {}: only VarlenType::None and CompactVarlen are implemented",
            shape.varlen_type
        ))
        .into()),
        other => Err(invalid(format!("varlen_type {other} is not a VarlenType"))),
    }
}

/// The seed's 64-bit integer scalars (dropout seed and offsets).
fn u64_scalar(s: &Scalar, name: &str) -> Result<u64, Error> {
    if s.ptr != 0 && s.dtype != 13 && s.dtype != 23 {
        return Err(Error::new(
            ErrorKind::UnsupportedDType,
            format!("{name}: dtype {}; the seed's scalars here are kUInt64 or kInt64", dtype_name(s.dtype)),
        ));
    }
    Ok(s.ptr)
}

fn dropout(d: &SeedDropout, outputs: Option<(&Scalar, &Scalar)>) -> Result<Option<Dropout>, Error> {
    if d.p == 0.0 {
        return Ok(None);
    }
    if d.offset2_signed && (d.offset2 as i64) < 0 {
        return Err(Error::new(ErrorKind::InvalidArgument, format!("philox_offset2 {} is negative", d.offset2 as i64)));
    }
    let mut out = Dropout {
        p: d.p,
        seed: u64_scalar(&d.seed, "philox_seed")?,
        offset: u64_scalar(&d.offset1, "philox_offset1")?,
        offset_base: d.offset2,
        seed_out: 0,
        offset_out: 0,
    };
    if let Some((seed_out, offset_out)) = outputs {
        out.seed_out = u64_scalar(seed_out, "philox_seed_output")?;
        out.offset_out = u64_scalar(offset_out, "philox_offset_output")?;
    }
    Ok(Some(out))
}

fn tuning(force_backend_index: i32) -> Seeded<()> {
    match force_backend_index {
        -1 => Ok(()),
        other => Err(NotSupported(format!(
            "force_backend_index {other}: this library chooses its kernels itself; pass -1"
        ))
        .into()),
    }
}

fn version(params_version: i32, known: i32, what: &str) -> Result<(), Error> {
    if params_version != known {
        return Err(Error::new(
            ErrorKind::UnsupportedVersion,
            format!("{what} params_version {params_version}: this library implements version {known}"),
        ));
    }
    Ok(())
}

pub fn seed_attn_fwd(a: &SeedFwdArgs, params_version: i32, known: i32, s: &StreamSpec) -> SeedOutcome {
    seeded(|| {
        version(params_version, known, "attn_fwd_params")?;
        tuning(a.force_backend_index)?;
        if a.alibi.ptr != 0 {
            return Err(NotSupported("A (ALiBi slopes): not implemented; pass a null view".to_string()).into());
        }
        let packing = varlen(&a.shape)?;
        let packed = packing.as_ref().map(|(_, layout)| *layout);
        let lse = rows(&a.lse, "softmax_lse", &a.q, packed)?;
        let mut p = flash::FwdParams::new(view4(&a.q, "q")?, view4(&a.k, "k")?, view4(&a.v, "v")?, view4(&a.out, "Out")?, lse);
        p.sm_scale = a.sm_scale;
        p.mask = mask(&a.shape)?;
        p.bias = if given(a.bias.ptr, &a.bias.sizes) { optional(&a.bias, "b")? } else { None };
        p.dropout = dropout(&a.dropout, Some((&a.seed_output, &a.offset_output)))?;
        p.varlen = packing.map(|(v, _)| v);
        let stream = stream(s)?;
        let encoded = encoded_softmax(a, &p)?;
        flash::attn_fwd(&p, stream)?;
        if let (Some(view), Some(d)) = (encoded, p.dropout) {
            let d = Dropout { seed_out: 0, offset_out: 0, ..d };
            flash::debug_dropout_mask(&view, &d, stream)?;
        }
        Ok(())
    })
}

/// The forward's encoded_softmax, checked before anything is launched: the keep-mask of the
/// call's dropout, fp32, B×Hq×Sq×Sk (max lengths when packed).
fn encoded_softmax(a: &SeedFwdArgs, p: &flash::FwdParams) -> Seeded<Option<TensorView<4>>> {
    let e = &a.encoded_softmax;
    if !given(e.ptr, &e.sizes) {
        return Ok(None);
    }
    if p.dropout.is_none() {
        return Err(NotSupported("encoded_softmax without dropout: this library writes only the dropout keep-mask".to_string()).into());
    }
    let view = view4(e, "encoded_softmax")?;
    let [b, hq, sq, _] = a.q.sizes;
    let sk = a.k.sizes[2];
    let want = match &p.varlen {
        Some(v) => [a.shape.cu_seqlens_q.sizes[0].saturating_sub(1), hq, v.max_seqlen_q, v.max_seqlen_k],
        None => [b, hq, sq, sk],
    };
    if view.dtype != aotriton::DType::F32 || view.sizes != want {
        return Err(Error::new(
            ErrorKind::ShapeMismatch,
            format!(
                "encoded_softmax: {:?} {:?}; this library writes the keep-mask as fp32 {want:?} (B, Hq, Sq, Sk)",
                view.dtype, view.sizes
            ),
        )
        .into());
    }
    Ok(Some(view))
}

pub fn seed_attn_bwd(a: &SeedBwdArgs, params_version: i32, known: i32, s: &StreamSpec) -> SeedOutcome {
    seeded(|| {
        version(params_version, known, "attn_bwd_params")?;
        tuning(a.force_backend_index)?;
        let packing = varlen(&a.shape)?;
        let packed = packing.as_ref().map(|(_, layout)| *layout);
        let lse = required_rows(&a.lse, "softmax_lse", &a.q, packed)?;
        let delta = required_rows(&a.delta, "delta", &a.q, packed)?;
        let mut p = flash::BwdParams::new(
            view4(&a.q, "q")?,
            view4(&a.k, "k")?,
            view4(&a.v, "v")?,
            view4(&a.out, "out")?,
            view4(&a.d_o, "dout")?,
            lse,
            delta,
            view4(&a.dq, "dq")?,
            view4(&a.dk, "dk")?,
            view4(&a.dv, "dv")?,
        );
        p.sm_scale = a.sm_scale;
        p.mask = mask(&a.shape)?;
        p.bias = if given(a.bias.ptr, &a.bias.sizes) { optional(&a.bias, "b")? } else { None };
        p.dbias = if given(a.dbias.ptr, &a.dbias.sizes) { optional(&a.dbias, "db")? } else { None };
        p.dropout = dropout(&a.dropout, None)?;
        p.varlen = packing.map(|(v, _)| v);
        flash::attn_bwd(&p, stream(s)?)?;
        Ok(())
    })
}

pub fn seed_debug_simulate_encoded_softmax(r: &TensorView4, d: &SeedDropout, s: &StreamSpec) -> SeedOutcome {
    seeded(|| {
        let Some(dropout) = dropout(d, None)? else {
            return Err(invalid("debug_simulate_encoded_softmax: dropout_p is 0".to_string()));
        };
        flash::debug_dropout_mask(&view4(r, "r")?, &dropout, stream(s)?)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::super::ffi::TensorView1;
    use super::*;

    fn t4(sizes: [u64; 4]) -> TensorView4 {
        let [_, h, s, d] = sizes;
        TensorView4 { ptr: 0x1000, sizes, strides: [(h * s * d) as i64, (s * d) as i64, d as i64, 1], dtype: 2 }
    }

    fn no_cu() -> TensorView1 {
        TensorView1 { ptr: 0, sizes: [0], strides: [1], dtype: 12 }
    }

    fn shape(causal_type: i32, left: i32, right: i32) -> SeedShape {
        SeedShape {
            causal_type,
            window_left: left,
            window_right: right,
            varlen_type: VARLEN_NONE,
            cu_seqlens_q: no_cu(),
            cu_seqlens_k: no_cu(),
            max_seqlen_q: 0,
            max_seqlen_k: 0,
        }
    }

    #[test]
    fn dtypes_use_the_seed_numbering() {
        assert_eq!(dtype(1, "x").unwrap(), aotriton::DType::F32);
        assert_eq!(dtype(2, "x").unwrap(), aotriton::DType::F16);
        assert_eq!(dtype(3, "x").unwrap(), aotriton::DType::BF16);
        assert_eq!(dtype(12, "x").unwrap(), aotriton::DType::I32);
        let e = dtype(13, "x").unwrap_err();
        assert!(e.kind() == ErrorKind::UnsupportedDType && e.message().contains("kInt64"), "{e}");
        assert_eq!(dtype(4, "x").unwrap_err().kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn windows_and_sentinels_become_masks() {
        let tl = TOP_LEFT_ALIGNED;
        let br = BOTTOM_RIGHT_ALIGNED;
        let m = |c, l, r| mask(&shape(c, l, r)).ok().unwrap();
        assert_eq!(m(CAUSAL_NONE, 5, 5), Mask::NONE);
        assert_eq!(m(CAUSAL_WINDOWED, tl, tl), Mask::causal(MaskAlign::TopLeft));
        assert_eq!(m(CAUSAL_WINDOWED, br, br), Mask::causal(MaskAlign::BottomRight));
        assert_eq!(m(CAUSAL_WINDOWED, 16, 0), Mask::window(16, 0, MaskAlign::TopLeft));
        assert_eq!(m(CAUSAL_WINDOWED, 16, br), Mask::window(16, 0, MaskAlign::BottomRight));
        assert!(mask(&shape(CAUSAL_WINDOWED, tl, br)).is_err());
        assert!(mask(&shape(CAUSAL_WINDOWED, -1, 0)).is_err());
        assert!(mask(&shape(1, tl, tl)).is_err());
    }

    #[test]
    fn row_statistics_take_the_seed_layouts() {
        let q = t4([2, 3, 5, 64]);
        let lse = |sizes: [u64; 2], strides: [i64; 2]| TensorView2 { ptr: 0x2000, sizes, strides, dtype: 1 };
        let v = rows(&lse([6, 5], [5, 1]), "L", &q, None).unwrap().unwrap();
        assert_eq!((v.sizes, v.strides), ([2, 3, 5], [15, 5, 1]));
        assert_eq!(rows(&lse([3, 5], [5, 1]), "L", &q, None).unwrap_err().kind(), ErrorKind::ShapeMismatch);
        // Packed: 1 × 3 heads × 9 tokens, B = 2 with max_seqlen_q 5.
        let q = t4([1, 3, 9, 64]);
        let v = rows(&lse([3, 9], [16, 1]), "L", &q, Some((2, 5))).unwrap().unwrap();
        assert_eq!((v.sizes, v.strides), ([1, 3, 9], [48, 16, 1]));
        let v = rows(&lse([6, 5], [5, 1]), "L", &q, Some((2, 5))).unwrap().unwrap();
        assert_eq!((v.sizes, v.strides), ([1, 3, 9], [27, 9, 1]));
        assert_eq!(rows(&lse([6, 4], [4, 1]), "L", &q, Some((2, 4))).unwrap_err().kind(), ErrorKind::ShapeMismatch);
    }

    #[test]
    fn outcomes_carry_the_seeds_status() {
        assert_eq!(hip_status(ErrorKind::UnsupportedGpu), hip::NO_BINARY_FOR_GPU);
        assert_eq!(hip_status(ErrorKind::UnsupportedVersion), hip::INVALID_SYMBOL);
        let out = seed_not_supported("attn_bwd_fused");
        assert_eq!((out.hip, out.code), (hip::NOT_SUPPORTED, ErrorKind::InvalidArgument as i32));
        assert!(out.message.contains("attn_bwd_fused"));
        let d = SeedDropout {
            p: 0.1,
            seed: Scalar { ptr: 0x10, dtype: 23 },
            offset1: Scalar { ptr: 0x20, dtype: 13 },
            offset2: (-3i64) as u64,
            offset2_signed: true,
        };
        let out = seed_debug_simulate_encoded_softmax(&t4([1, 1, 4, 4]), &d, &StreamSpec { handle: 0, runtime: 1 });
        assert_eq!(out.hip, hip::INVALID_VALUE, "{}", out.message);
        assert!(out.message.contains("philox_offset2"), "{}", out.message);
    }
}
