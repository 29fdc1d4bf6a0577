//! What a crate user's first program does: which archives it carries, whether they open, and a
//! forward call that passes validation and reaches the GPU driver (without a driver: NoDriver).
use std::process::ExitCode;

use aotriton::flash::{self, FwdParams};
use aotriton::{DType, ErrorKind, Runtime, Stream, TensorView};

fn main() -> ExitCode {
    println!("embedded archs: {}", aotriton::built_archs().join(" "));
    let archs = match aotriton::available_archs() {
        Ok(archs) => archs,
        Err(e) => {
            println!("archives: {e}");
            return ExitCode::FAILURE;
        }
    };
    for arch in &archs {
        match aotriton::with_archive(arch, |a| format!("{} ({} functionals)", a.name(), a.functionals().len())) {
            Ok(summary) => println!("archive {arch}: {summary}"),
            Err(e) => {
                println!("archive {arch}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if aotriton::library_present(Runtime::Cuda) {
        // The addresses below are made up: with a driver they would be launched on.
        println!("attn_fwd: skipped (this machine has the CUDA driver)");
        return ExitCode::SUCCESS;
    }
    let (batch, heads, seqlen, head_dim) = (1, 2, 128, 64);
    let tensor = |ptr| TensorView::contiguous(ptr, [batch, heads, seqlen, head_dim], DType::F16);
    let size = batch * heads * seqlen * head_dim * 2;
    let params = FwdParams::new(tensor(1 << 20), tensor((1 << 20) + size), tensor((1 << 20) + 2 * size), tensor((1 << 20) + 3 * size), None);
    match flash::attn_fwd(&params, Stream::cuda(0)) {
        Err(e) if e.kind() == ErrorKind::NoDriver => {
            println!("attn_fwd: {e}");
            ExitCode::SUCCESS
        }
        other => {
            println!("attn_fwd: expected NoDriver, got {other:?}");
            ExitCode::FAILURE
        }
    }
}
