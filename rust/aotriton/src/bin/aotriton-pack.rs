//! `aotriton-pack`: build, list and verify aotriton kernel archives.
//!
//! ```text
//! aotriton-pack pack <kernel-dir> <out-file>   pack a compile-driver output directory
//! aotriton-pack list <archive>                 show the functionals and kernels inside
//! aotriton-pack verify <archive>               decompress and check everything
//! ```
//!
//! Errors go to stderr with exit status 1; usage errors exit with 2.

use std::path::Path;
use std::process::ExitCode;

use aotriton::archive::{Archive, ArchiveError, pack_dir};

const USAGE: &str = "usage:
  aotriton-pack pack <kernel-dir> <out-file>
  aotriton-pack list <archive>
  aotriton-pack verify <archive>";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["pack", dir, out] => pack(Path::new(dir), Path::new(out)),
        ["list", archive] => list(Path::new(archive)),
        ["verify", archive] => verify(Path::new(archive)),
        ["-h" | "--help" | "help"] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aotriton-pack: {e}");
            ExitCode::from(1)
        }
    }
}

fn pack(dir: &Path, out: &Path) -> Result<(), ArchiveError> {
    let s = pack_dir(dir, out)?;
    let ratio = if s.raw_bytes == 0 {
        0.0
    } else {
        s.archive_bytes as f64 / s.raw_bytes as f64
    };
    println!(
        "{}: {} functionals, {} kernels, {} raw bytes -> {} archive bytes ({:.1}%)",
        out.display(),
        s.functionals,
        s.kernels,
        s.raw_bytes,
        s.archive_bytes,
        ratio * 100.0
    );
    Ok(())
}

fn list(path: &Path) -> Result<(), ArchiveError> {
    let a = Archive::open(path)?;
    let kernels: usize = a.functionals().iter().map(|f| f.kernels.len()).sum();
    println!("archive:        {}", a.name());
    println!("arch:           {}", a.arch());
    println!("triton version: {}", a.triton_version());
    println!("target:         {}", a.target());
    println!(
        "functionals:    {}, kernels: {kernels}",
        a.functionals().len()
    );
    for f in a.functionals() {
        println!(
            "{}  ({} kernels, {} -> {} bytes)",
            f.display_name(),
            f.kernels.len(),
            f.uncompressed_size(),
            f.compressed_size()
        );
        for (i, k) in f.kernels.iter().enumerate() {
            let config: Vec<String> = k.config.iter().map(|(n, v)| format!("{n}={v}")).collect();
            println!(
                "  {}  variant={} {}  shared={} warps={} ctas={}  image={} bytes",
                k.id,
                k.variant,
                config.join(" "),
                k.shared,
                k.num_warps,
                k.num_ctas,
                f.image_size(i).unwrap_or(0)
            );
        }
    }
    Ok(())
}

fn verify(path: &Path) -> Result<(), ArchiveError> {
    let a = Archive::open(path)?;
    let mut kernels = 0usize;
    let mut bytes = 0u64;
    for i in 0..a.functionals().len() {
        let images = a.load_images(i)?;
        kernels += images.len();
        bytes += images.iter().map(|im| im.len() as u64).sum::<u64>();
    }
    println!(
        "OK: {} ({}, triton {}): {} functionals, {kernels} kernels, {bytes} image bytes",
        a.name(),
        a.arch(),
        a.triton_version(),
        a.functionals().len()
    );
    Ok(())
}
