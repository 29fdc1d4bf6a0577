//! Forward then backward on bf16 data, with the workspace that lets `Backend::Auto` take the
//! sm_90 Gluon kernels (`attn_bwd_workspace_bytes` is 0 where the portable kernels serve).
//! Run: `cargo run --example attn_bwd` (needs an NVIDIA GPU the build has kernels for).
mod common;

use aotriton::flash::{self, BwdParams, FwdParams, Workspace};
use aotriton::interop::{tensor_view, tensor_view_mut};
use aotriton::DType;
use cudarc::driver::DevicePtrMut;

fn main() -> std::process::ExitCode {
    common::main_with("attn_bwd", |stream| {
        let (b, h, s, d) = (2u64, 8u64, 1024u64, 128u64);
        let n = (b * h * s * d) as usize;
        let rows = (b * h * s) as usize;
        let shape = [b, h, s, d];
        let q = stream.clone_htod(&common::bf16_data(n, 1))?;
        let k = stream.clone_htod(&common::bf16_data(n, 2))?;
        let v = stream.clone_htod(&common::bf16_data(n, 3))?;
        let d_o = stream.clone_htod(&common::bf16_data(n, 4))?;
        let mut o = stream.alloc_zeros::<u16>(n)?;
        let mut lse = stream.alloc_zeros::<f32>(rows)?;
        let (mut dq, mut dk, mut dv) = (stream.alloc_zeros::<u16>(n)?, stream.alloc_zeros::<u16>(n)?, stream.alloc_zeros::<u16>(n)?);
        let mut delta = stream.alloc_zeros::<f32>(rows)?;

        let bf16 = |m, shape| tensor_view(m, stream, shape, DType::BF16);
        let fwd = FwdParams::new(
            bf16(&q, shape)?,
            bf16(&k, shape)?,
            bf16(&v, shape)?,
            tensor_view_mut(&mut o, stream, shape, DType::BF16)?,
            Some(tensor_view_mut(&mut lse, stream, [b, h, s], DType::F32)?),
        );
        flash::attn_fwd(&fwd, stream.as_ref().into())?;

        let mut bwd = BwdParams::new(
            bf16(&q, shape)?,
            bf16(&k, shape)?,
            bf16(&v, shape)?,
            tensor_view(&o, stream, shape, DType::BF16)?,
            bf16(&d_o, shape)?,
            tensor_view(&lse, stream, [b, h, s], DType::F32)?,
            tensor_view_mut(&mut delta, stream, [b, h, s], DType::F32)?,
            tensor_view_mut(&mut dq, stream, shape, DType::BF16)?,
            tensor_view_mut(&mut dk, stream, shape, DType::BF16)?,
            tensor_view_mut(&mut dv, stream, shape, DType::BF16)?,
        );
        // Ask first: the size depends on the inputs and on the stream's device.
        let bytes = flash::attn_bwd_workspace_bytes(&bwd, stream.as_ref().into())?;
        let mut workspace = stream.alloc_zeros::<u8>(bytes.max(16) as usize)?;
        if bytes > 0 {
            let (ptr, _recorded) = workspace.device_ptr_mut(stream);
            bwd.workspace = Some(Workspace { ptr, bytes });
        }
        flash::attn_bwd(&bwd, stream.as_ref().into())?;

        let dq = stream.clone_dtoh(&dq)?;
        let first: Vec<f32> = dq[..4].iter().map(|&x| common::bf16_to_f32(x)).collect();
        println!("workspace {bytes} bytes; dq[0, 0, 0, :4] = {first:?}");
        Ok(())
    })
}
