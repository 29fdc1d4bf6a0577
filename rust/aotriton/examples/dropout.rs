//! A forward pass with dropout: the seed and offset live in device memory (so a captured graph
//! can be replayed with a new offset), and the generator's offset advances by
//! `dropout_offsets_consumed` per call. The seed and offset used are written back for the backward.
//! Run: `cargo run --example dropout` (needs an NVIDIA GPU the build has kernels for).
mod common;

use aotriton::flash::{self, Dropout, FwdParams};
use aotriton::interop::{tensor_view, tensor_view_mut};
use aotriton::DType;
use cudarc::driver::{DevicePtr, DevicePtrMut};

fn main() -> std::process::ExitCode {
    common::main_with("dropout", |stream| {
        let (b, h, s, d) = (2u64, 8u64, 256u64, 64u64);
        let n = (b * h * s * d) as usize;
        let shape = [b, h, s, d];
        let q = stream.clone_htod(&common::bf16_data(n, 1))?;
        let k = stream.clone_htod(&common::bf16_data(n, 2))?;
        let v = stream.clone_htod(&common::bf16_data(n, 3))?;
        let mut o = stream.alloc_zeros::<u16>(n)?;
        let mut lse = stream.alloc_zeros::<f32>((b * h * s) as usize)?;
        let mut offset_host = 0u64;
        let philox = stream.clone_htod(&[0x5eed_u64, offset_host])?;
        let mut used = stream.alloc_zeros::<u64>(2)?;

        for call in 0..2 {
            let (seed_ptr, _philox) = philox.device_ptr(stream);
            let (used_ptr, _used) = used.device_ptr_mut(stream);
            let mut dropout = Dropout::new(0.1, seed_ptr, seed_ptr + 8);
            dropout.offset_base = offset_host;
            dropout.seed_out = used_ptr;
            dropout.offset_out = used_ptr + 8;
            let mut params = FwdParams::new(
                tensor_view(&q, stream, shape, DType::BF16)?,
                tensor_view(&k, stream, shape, DType::BF16)?,
                tensor_view(&v, stream, shape, DType::BF16)?,
                tensor_view_mut(&mut o, stream, shape, DType::BF16)?,
                Some(tensor_view_mut(&mut lse, stream, [b, h, s], DType::F32)?),
            );
            params.dropout = Some(dropout);
            flash::attn_fwd(&params, stream.as_ref().into())?;
            drop((_philox, _used));
            // The next call draws fresh masks: advance past the counters this one consumed.
            offset_host += flash::dropout_offsets_consumed(b, h, s, s)?;
            let used = stream.clone_dtoh(&used)?;
            println!("call {call}: seed {:#x}, offset {} (the backward takes these)", used[0], used[1]);
        }
        Ok(())
    })
}
