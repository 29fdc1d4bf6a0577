//! A causal forward pass on bf16 data, B×H×S×D, with the log-sum-exp the backward needs.
//! Run: `cargo run --example attn_fwd` (needs an NVIDIA GPU the build has kernels for).
mod common;

use aotriton::flash::{self, FwdParams, Mask, MaskAlign};
use aotriton::interop::{tensor_view, tensor_view_mut};
use aotriton::DType;

fn main() -> std::process::ExitCode {
    common::main_with("attn_fwd", |stream| {
        let (b, h, s, d) = (2u64, 8u64, 512u64, 64u64);
        let n = (b * h * s * d) as usize;
        let q = stream.clone_htod(&common::bf16_data(n, 1))?;
        let k = stream.clone_htod(&common::bf16_data(n, 2))?;
        let v = stream.clone_htod(&common::bf16_data(n, 3))?;
        let mut o = stream.alloc_zeros::<u16>(n)?;
        let mut lse = stream.alloc_zeros::<f32>((b * h * s) as usize)?;

        let shape = [b, h, s, d];
        let mut params = FwdParams::new(
            tensor_view(&q, stream, shape, DType::BF16)?,
            tensor_view(&k, stream, shape, DType::BF16)?,
            tensor_view(&v, stream, shape, DType::BF16)?,
            tensor_view_mut(&mut o, stream, shape, DType::BF16)?,
            Some(tensor_view_mut(&mut lse, stream, [b, h, s], DType::F32)?),
        );
        params.mask = Mask::causal(MaskAlign::TopLeft);
        flash::attn_fwd(&params, stream.as_ref().into())?;

        let o = stream.clone_dtoh(&o)?;
        let lse = stream.clone_dtoh(&lse)?;
        // Query 0 sees only key 0: its output row is v's row 0, and its lse is q₀·k₀/√D.
        let first: Vec<f32> = o[..4].iter().map(|&x| common::bf16_to_f32(x)).collect();
        println!("o[0, 0, 0, :4] = {first:?}, lse[0, 0, :4] = {:?}", &lse[..4]);
        Ok(())
    })
}
