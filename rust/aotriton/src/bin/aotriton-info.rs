//! `aotriton-info`: the kernel archives this build of aotriton carries (embedded, or read from
//! `AOTRITON_IMAGE_DIR`) and, where a GPU driver is present, the device it sees, its arch and
//! whether the library serves it.
//!
//! Exit status: 0 when a device is served and no device seen is refused (a runtime whose library
//! is installed but shows no device, e.g. HIP on an NVIDIA machine, is reported, not a failure;
//! with `--runtime` that runtime's device must be served); 1 when a device is not served, no
//! device or no GPU driver is found, or an archive fails its checks; 2 for usage errors.

use std::io::{self, Write};
use std::process::ExitCode;

use aotriton::{DeviceSupport, ImageSource, Runtime, Stream};
use clap::{Arg, ArgAction, ArgMatches, Command, value_parser};

fn cli() -> Command {
    Command::new("aotriton-info")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Lists the kernel archives this build of aotriton carries and says whether it serves this machine's GPU")
        .arg(Arg::new("functionals").long("functionals").action(ArgAction::SetTrue).help("List every functional of each archive"))
        .arg(
            Arg::new("device")
                .long("device")
                .value_parser(value_parser!(usize))
                .default_value("0")
                .help("CUDA device ordinal to look at (HIP: the current device)"),
        )
        .arg(
            Arg::new("runtime")
                .long("runtime")
                .value_parser(["cuda", "hip"])
                .help("Look only at this runtime's device (default: each runtime whose driver library is present)"),
        )
}

/// Why the program ends unsuccessfully.
enum Failure {
    /// Already reported on stdout; just the exit status.
    Reported,
    /// Writing the output failed (EPIPE: the reader went away).
    Output(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Output(e)
    }
}

fn main() -> ExitCode {
    let matches = match cli().try_get_matches() {
        Ok(matches) => matches,
        // --help and --version arrive here too, with a success status.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    match report(&matches, &mut io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Reported) => ExitCode::from(1),
        Err(Failure::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::from(1),
        Err(Failure::Output(e)) => {
            let _ = writeln!(io::stderr(), "aotriton-info: cannot write the output: {e}");
            ExitCode::from(1)
        }
    }
}

fn report(matches: &ArgMatches, out: &mut impl Write) -> Result<(), Failure> {
    writeln!(out, "aotriton {}", env!("CARGO_PKG_VERSION"))?;
    let archives_ok = archives(matches.get_flag("functionals"), out)?;
    let runtimes: Vec<Runtime> = match matches.get_one::<String>("runtime").map(String::as_str) {
        Some("hip") => vec![Runtime::Hip],
        Some(_) => vec![Runtime::Cuda],
        None => [Runtime::Cuda, Runtime::Hip].into_iter().filter(|r| aotriton::library_present(*r)).collect(),
    };
    let devices_ok = if runtimes.is_empty() {
        // Neither library is there: the runtime's own NoDriver error says what it looked for.
        let message = match aotriton::device_support(Stream::cuda(0)) {
            Err(e) => e.to_string(),
            Ok(_) => "no GPU driver library found".into(),
        };
        writeln!(out, "device:   none: no GPU driver ({message})")?;
        false
    } else {
        let ordinal = *matches.get_one::<usize>("device").unwrap_or(&0);
        let mut seen = Vec::with_capacity(runtimes.len());
        for runtime in runtimes {
            seen.push(device(runtime, ordinal, out)?);
        }
        // A runtime asked for by name must serve its device. Otherwise a machine passes when some
        // runtime's device is served and none that has a device is refused: a HIP runtime installed
        // on an NVIDIA machine (no AMD device) is not a failure.
        if matches.get_one::<String>("runtime").is_some() {
            seen.iter().all(|s| *s == Some(true))
        } else {
            seen.contains(&Some(true)) && !seen.contains(&Some(false))
        }
    };
    out.flush()?;
    if archives_ok && devices_ok { Ok(()) } else { Err(Failure::Reported) }
}

/// Prints where the archives come from and a line per archive; false if one fails its checks.
fn archives(functionals: bool, out: &mut impl Write) -> Result<bool, Failure> {
    let source = match aotriton::image_source() {
        Ok(source) => source,
        Err(e) => {
            writeln!(out, "images:   refused: {e}")?;
            return Ok(false);
        }
    };
    let archs = aotriton::available_archs();
    match (&source, &archs) {
        (ImageSource::Embedded, Ok(a)) if a.is_empty() => {
            writeln!(out, "images:   none (a no-images build; set AOTRITON_IMAGE_DIR to a directory of archives)")?
        }
        (ImageSource::Embedded, _) => writeln!(out, "images:   embedded in the library")?,
        (ImageSource::Dir(dir), _) => writeln!(out, "images:   directory {} (AOTRITON_IMAGE_DIR or the built-in default)", dir.display())?,
    }
    let archs = match archs {
        Ok(archs) => archs,
        Err(e) => {
            writeln!(out, "images:   cannot list: {e}")?;
            return Ok(false);
        }
    };
    let mut ok = true;
    for arch in archs {
        let summary = aotriton::with_archive(&arch, |a| {
            let kernels: usize = a.functionals().iter().map(|f| f.kernels.len()).sum();
            let mut families: Vec<&str> = a.functionals().iter().map(|f| f.family.as_str()).collect();
            families.dedup();
            let names: Vec<String> = a.functionals().iter().map(|f| f.display_name()).collect();
            let line = format!(
                "archive:  {arch}: {}, Triton {}, {} functionals, {kernels} kernels ({})",
                a.name(),
                a.triton_version(),
                a.functionals().len(),
                families.join(", ")
            );
            (line, names)
        });
        match summary {
            Ok((line, names)) => {
                writeln!(out, "{line}")?;
                if functionals {
                    for name in names {
                        writeln!(out, "  {name}")?;
                    }
                }
            }
            Err(e) => {
                writeln!(out, "archive:  {arch}: refused: {e}")?;
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// Prints what `runtime` shows of its device: `Some(true)` if the library serves it,
/// `Some(false)` if not, `None` if the runtime shows no device (or cannot be asked).
fn device(runtime: Runtime, ordinal: usize, out: &mut impl Write) -> Result<Option<bool>, Failure> {
    let support = match runtime {
        Runtime::Cuda => aotriton::interop::cuda_device_support(ordinal).map_err(|e| e.to_string()),
        Runtime::Hip => aotriton::device_support(Stream::hip(0)).map_err(|e| e.to_string()),
    };
    let DeviceSupport { arch, target_id, ordinal, multiprocessors, served_by, unsupported, .. } = match support {
        Ok(support) => support,
        Err(message) => {
            writeln!(out, "device:   {}: none: {message}", runtime.name())?;
            return Ok(None);
        }
    };
    writeln!(out, "device:   {} device {ordinal}: {arch} ({target_id}), {multiprocessors} multiprocessors", runtime.name())?;
    let served = served_by.is_some();
    match served_by {
        Some(served) if served == arch => writeln!(out, "served:   yes, by the {served} archive")?,
        Some(served) => writeln!(out, "served:   yes, by the {served} archive (binary compatible with {arch})")?,
        None => writeln!(out, "served:   no: {}", unsupported.unwrap_or_default())?,
    }
    Ok(Some(served))
}

