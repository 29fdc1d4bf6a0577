//! `debug_dropout_mask`: the dropout keep-mask exactly as the attention kernels draw it, for
//! tests and for frameworks that check their RNG bookkeeping (like the seed's
//! `debug_simulate_encoded_softmax`). The kernel shares its Philox helper with the attention
//! kernels, so the two cannot drift apart.
use super::bwd::{int32_args, kernel_blocks};
use super::{Dropout, dropout_args};
use crate::dispatch::{ArgList, ArgValue, Axes, Launcher, Request, first_preferred};
use crate::driver::Stream;
use crate::error::{Result, bail};
use crate::tensor::{DType, TensorView};

/// Writes `out[b, h, i, j]` = 1.0 where attention with `dropout` over a B×H×Sq×Sk score matrix
/// keeps element (b, h, i, j), 0.0 where it drops it. `out` is fp32, B×H×Sq×Sk, unit last stride.
pub fn debug_dropout_mask(out: &TensorView<4>, dropout: &Dropout, stream: Stream) -> Result<()> {
    out.check_layout("out")?;
    if out.dtype != DType::F32 {
        bail!(DTypeMismatch, "out must be fp32, got {}", out.dtype.triton_name());
    }
    let [batch, heads, seqlen_q, seqlen_k] = out.sizes;
    if out.sizes.contains(&0) {
        bail!(EmptyInput, "out.sizes {:?} has a 0", out.sizes);
    }
    if heads > 65535 || batch > 65535 || seqlen_q > 1 << 30 || seqlen_k > 1 << 30 {
        bail!(TooLarge, "out.sizes {:?} exceeds the launch grid", out.sizes);
    }
    super::check_rows("out", out, seqlen_q, seqlen_k)?;
    let mut args = ArgList::new();
    args.extend([
        ("OUT", ArgValue::Ptr(out.ptr)),
        ("stride_oz", ArgValue::I64(out.strides[0])),
        ("stride_oh", ArgValue::I64(out.strides[1])),
    ]);
    args.extend(int32_args([("stride_om", out.strides[2])])?);
    args.extend(int32_args([("N_CTX_Q", seqlen_q), ("N_CTX_K", seqlen_k), ("N_HEADS", heads)])?);
    dropout_args(&mut args, Some(dropout), false)?;
    let axes = Axes::of(&[("dtype", "fp32")]);
    let request = Request { family: "debug_dropout_mask", axes: axes.as_slice()?, args: args.args()? };
    let launcher = Launcher::new(stream)?;
    let grid = |meta: &_| Ok([kernel_blocks(meta)(seqlen_q, "BLOCK_M"), heads, batch]);
    let kernel = launcher.prepare(&request, first_preferred, grid)?;
    launcher.launch(&kernel)
}
