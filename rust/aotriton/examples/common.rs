//! What the examples share: device 0's stream through cudarc, and made-up input data.
// Each example uses part of it.
#![allow(dead_code)]
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

/// A new stream on CUDA device 0, or why there is none: without the driver, the runtime's own
/// NoDriver message (it names the library it looked for).
pub fn cuda_stream() -> Result<Arc<CudaStream>, String> {
    if !aotriton::library_present(aotriton::Runtime::Cuda) {
        return Err(match aotriton::device_support(aotriton::Stream::cuda(0)) {
            Err(e) => e.to_string(),
            Ok(_) => "the CUDA driver library is missing".into(),
        });
    }
    let context = CudaContext::new(0).map_err(|e| format!("CUDA device 0: {e:?}"))?;
    context.new_stream().map_err(|e| format!("CUDA device 0: cannot create a stream: {e:?}"))
}

/// `n` values in [-1, 1), the same for the same `seed`, as bf16 bit patterns (truncated f32).
pub fn bf16_data(n: usize, seed: u32) -> Vec<u16> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let value = (state >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
            (value.to_bits() >> 16) as u16
        })
        .collect()
}

/// The f32 a bf16 bit pattern stands for.
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Runs an example's body; without a usable GPU says why and fails.
pub fn main_with(name: &str, body: impl FnOnce(&Arc<CudaStream>) -> Result<(), Box<dyn std::error::Error>>) -> std::process::ExitCode {
    let stream = match cuda_stream() {
        Ok(stream) => stream,
        Err(why) => {
            eprintln!("{name}: needs an NVIDIA GPU: {why}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match body(&stream) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
