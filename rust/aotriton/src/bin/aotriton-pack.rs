//! `aotriton-pack`: build, list and verify aotriton kernel archives.
//!
//! ```text
//! aotriton-pack pack <kernel-dir> <out-file>   pack a compile-driver output directory
//! aotriton-pack list <archive>                 show the functionals and kernels inside
//! aotriton-pack verify <archive>               decompress and check everything
//! aotriton-pack --version                      the version of aotriton it belongs to
//! ```
//!
//! Errors go to stderr with exit status 1; usage errors exit with 2. Output that cannot be
//! written ends the program with status 1: quietly when the reader went away (`... | head`),
//! with a message otherwise.

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use aotriton::archive::{Archive, ArchiveError, pack_dir};

const USAGE: &str = "usage:
  aotriton-pack pack <kernel-dir> <out-file>
  aotriton-pack list <archive>
  aotriton-pack verify <archive>
  aotriton-pack --version";

/// Why a command stopped.
#[derive(Debug)]
enum Failure {
    Archive(ArchiveError),
    /// Writing the output failed (e.g. EPIPE when the reader closed the pipe).
    Output(io::Error),
    Usage,
}

impl From<ArchiveError> for Failure {
    fn from(e: ArchiveError) -> Self {
        Failure::Archive(e)
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Output(e)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = command(&args, &mut io::stdout().lock());
    // Messages go through writeln! on stderr, not eprintln!, which would panic if stderr is closed.
    let mut stderr = io::stderr();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage) => {
            let _ = writeln!(stderr, "{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Archive(e)) => {
            let _ = writeln!(stderr, "aotriton-pack: {e}");
            ExitCode::from(1)
        }
        // The reader stopped reading: nothing is wrong with the archive, and nobody is listening.
        Err(Failure::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::from(1),
        Err(Failure::Output(e)) => {
            let _ = writeln!(stderr, "aotriton-pack: cannot write the output: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs the command `args` names, writing its report to `out` (flushed before returning).
fn command(args: &[&str], out: &mut impl Write) -> Result<(), Failure> {
    match args {
        ["pack", dir, file] => pack(Path::new(dir), Path::new(file), out)?,
        ["list", archive] => list(Path::new(archive), out)?,
        ["verify", archive] => verify(Path::new(archive), out)?,
        ["-h" | "--help" | "help"] => writeln!(out, "{USAGE}")?,
        ["-V" | "--version"] => writeln!(out, "aotriton-pack {}", env!("CARGO_PKG_VERSION"))?,
        _ => return Err(Failure::Usage),
    }
    Ok(out.flush()?)
}

fn pack(dir: &Path, file: &Path, out: &mut impl Write) -> Result<(), Failure> {
    let s = pack_dir(dir, file)?;
    let ratio = if s.raw_bytes == 0 {
        0.0
    } else {
        s.archive_bytes as f64 / s.raw_bytes as f64
    };
    writeln!(
        out,
        "{}: {} functionals, {} kernels, {} raw bytes -> {} archive bytes ({:.1}%)",
        file.display(),
        s.functionals,
        s.kernels,
        s.raw_bytes,
        s.archive_bytes,
        ratio * 100.0
    )?;
    Ok(())
}

fn list(path: &Path, out: &mut impl Write) -> Result<(), Failure> {
    let a = Archive::open(path)?;
    let kernels: usize = a.functionals().iter().map(|f| f.kernels.len()).sum();
    writeln!(out, "archive:        {}", a.name())?;
    writeln!(out, "arch:           {}", a.arch())?;
    writeln!(out, "triton version: {}", a.triton_version())?;
    writeln!(out, "target:         {}", a.target())?;
    writeln!(out, "functionals:    {}, kernels: {kernels}, xz streams: {}", a.functionals().len(), a.stream_count())?;
    for f in a.functionals() {
        let (packed, raw) = a.stream_sizes(f.stream()).unwrap_or_default();
        writeln!(
            out,
            "{}  ({} kernels, {} bytes; stream {}: {raw} -> {packed} bytes)",
            f.display_name(),
            f.kernels.len(),
            f.uncompressed_size(),
            f.stream()
        )?;
        for (i, k) in f.kernels.iter().enumerate() {
            let config: Vec<String> = k.config.iter().map(|(n, v)| format!("{n}={v}")).collect();
            let mut tuned = match (k.tuned_for.len(), k.tuned_only) {
                (0, false) => String::new(),
                (cells, only) => format!("  tuned_for={cells} cells{}", if only { " (tuned only)" } else { "" }),
            };
            if !k.portable_for.is_empty() {
                tuned.push_str(&format!("  portable_for={} cells", k.portable_for.len()));
            }
            writeln!(
                out,
                "  {}  variant={} {}  shared={} warps={} ctas={}  image={} bytes{tuned}",
                k.id,
                k.variant,
                config.join(" "),
                k.shared,
                k.num_warps,
                k.num_ctas,
                f.image_size(i).unwrap_or(0)
            )?;
        }
    }
    Ok(())
}

fn verify(path: &Path, out: &mut impl Write) -> Result<(), Failure> {
    let a = Archive::open(path)?;
    let mut kernels = 0usize;
    let mut bytes = 0u64;
    for i in 0..a.functionals().len() {
        let images = a.load_images(i)?;
        kernels += images.len();
        bytes += images.iter().map(|im| im.len() as u64).sum::<u64>();
    }
    writeln!(
        out,
        "OK: {} ({}, triton {}): {} functionals, {kernels} kernels, {bytes} image bytes",
        a.name(),
        a.arch(),
        a.triton_version(),
        a.functionals().len()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aotriton::archive::{ArchiveWriter, KernelMeta};
    use std::collections::BTreeMap;

    /// Takes `room` bytes, then fails as a pipe whose reader has gone (`| head`).
    struct ClosingPipe {
        room: usize,
    }

    impl Write for ClosingPipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn small_archive(path: &Path) {
        let mut writer = ArchiveWriter::new("sm_90", "3.6.0", serde_json::json!({"backend": "cuda", "arch": 90, "warp_size": 32}));
        for i in 0..50 {
            let meta = KernelMeta {
                id: format!("k{i:02}"),
                symbol: "k".into(),
                variant: "aligned".into(),
                config: BTreeMap::from([("BLOCK_M".to_string(), 64)]),
                args: vec![],
                shared: 0,
                num_warps: 4,
                warp_size: 32,
                num_ctas: 1,
                global_scratch_size: 0,
                global_scratch_align: 1,
                profile_scratch_size: 0,
                profile_scratch_align: 1,
                tuned_for: Vec::new(),
                tuned_only: false,
                portable_for: Vec::new(),
            };
            writer.add("attn_fwd", &[("head_dim", &format!("{}", 16 * (i % 4 + 1)))], meta, vec![i as u8; 100]).unwrap();
        }
        writer.write(path).unwrap();
    }

    #[test]
    fn a_closed_pipe_ends_the_output_without_a_panic() {
        let path = std::env::temp_dir().join(format!("aotriton-pack-test-{}.images", std::process::id()));
        small_archive(&path);
        let name = path.to_str().unwrap();
        for room in [0, 10, 300] {
            for args in [["list", name], ["verify", name]] {
                let result = command(&args, &mut ClosingPipe { room });
                let is_epipe = matches!(&result, Err(Failure::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe);
                assert!(is_epipe || (args[0] == "verify" && room == 300 && result.is_ok()), "{args:?} {room}: {result:?}");
            }
        }
        let mut all = Vec::new();
        command(&["list", name], &mut all).unwrap();
        assert!(String::from_utf8(all).unwrap().contains("k49  variant=aligned BLOCK_M=64"));
        let _ = std::fs::remove_file(&path);
    }
}
