//! A packed batch of three sequences of different lengths (varlen): Q, K, V stored as
//! total_tokens × H × D and passed as [1, H, total, D] views, with the offsets on the device
//! and, so that they are checked before launching, on the host.
//! Run: `cargo run --example varlen` (needs an NVIDIA GPU the build has kernels for).
mod common;

use aotriton::flash::{self, FwdParams, Varlen};
use aotriton::{DType, TensorView};
use cudarc::driver::{DevicePtr, DevicePtrMut};

fn main() -> std::process::ExitCode {
    common::main_with("varlen", |stream| {
        let cu_seqlens: [i32; 4] = [0, 100, 356, 400];
        let (h, d) = (4u64, 64u64);
        let total = cu_seqlens[3] as u64;
        let max_seqlen = cu_seqlens.windows(2).map(|w| (w[1] - w[0]) as u64).max().unwrap_or(0);
        let n = (total * h * d) as usize;
        let q = stream.clone_htod(&common::bf16_data(n, 1))?;
        let k = stream.clone_htod(&common::bf16_data(n, 2))?;
        let v = stream.clone_htod(&common::bf16_data(n, 3))?;
        let mut o = stream.alloc_zeros::<u16>(n)?;
        let cu = stream.clone_htod(&cu_seqlens)?;

        // Token-major storage (total × H × D) seen as [1, H, total, D].
        let sizes = [1, h, total, d];
        let strides = [0, d as i64, (h * d) as i64, 1];
        let packed = |ptr| TensorView::new(ptr, sizes, strides, DType::BF16);
        let (q_ptr, _q) = q.device_ptr(stream);
        let (k_ptr, _k) = k.device_ptr(stream);
        let (v_ptr, _v) = v.device_ptr(stream);
        let (o_ptr, _o) = o.device_ptr_mut(stream);
        let (cu_ptr, _cu) = cu.device_ptr(stream);
        let offsets = TensorView::contiguous(cu_ptr, [cu_seqlens.len() as u64], DType::I32);

        let mut varlen = Varlen::new(offsets, offsets, max_seqlen, max_seqlen);
        varlen.host_cu_seqlens = Some((&cu_seqlens, &cu_seqlens));
        let mut params = FwdParams::new(packed(q_ptr), packed(k_ptr), packed(v_ptr), packed(o_ptr), None);
        params.varlen = Some(varlen);
        flash::attn_fwd(&params, stream.as_ref().into())?;

        drop((_q, _k, _v, _o, _cu));
        let o = stream.clone_dtoh(&o)?;
        let first: Vec<f32> = o[..4].iter().map(|&x| common::bf16_to_f32(x)).collect();
        println!("3 sequences, {total} tokens; o[token 0, head 0, :4] = {first:?}");
        Ok(())
    })
}
