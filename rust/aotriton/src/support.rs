//! Which device a stream runs on and whether this build can serve it: the seed's `check_gpu`,
//! `aotriton-info`, and frameworks that decide before calling whether to route attention here.
use crate::driver::{Runtime, Stream, StreamContext};
use crate::error::{ErrorKind, Result};
use crate::images;

/// What aotriton sees of a stream's device, and the kernel archive that serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSupport {
    /// The runtime of the stream (CUDA or HIP).
    pub runtime: Runtime,
    /// The device's ordinal in its runtime.
    pub ordinal: i32,
    /// The device's arch: `sm_90`, `sm_86`, `gfx942`, ...
    pub arch: String,
    /// The full target the device reports, e.g. `gfx942:sramecc+:xnack-` (= `arch` on CUDA).
    pub target_id: String,
    /// Streaming multiprocessors (compute units on AMD).
    pub multiprocessors: u32,
    /// The arch of the kernel archive that serves the device (its own, or a binary-compatible
    /// one: sm_80's for sm_86/sm_87/sm_89), or `None` with the reason in [`unsupported`](Self::unsupported).
    pub served_by: Option<String>,
    /// Why this build cannot serve the device (no archive for its arch, images built for other
    /// target features, an archive that fails its checks), when `served_by` is `None`.
    pub unsupported: Option<String>,
}

/// Looks at `stream`'s device: its arch and whether this build (its embedded archives, or those
/// in `AOTRITON_IMAGE_DIR`) has kernels for it. Launches nothing; loads no kernel. An archive
/// that cannot serve the device is an answer (`served_by: None`), not an error; errors are those
/// of reaching the device (`NoDriver`, `NoDevice`, a driver error for an invalid stream) and of
/// an image directory that is not trusted (`UntrustedImages`).
pub fn device_support(stream: Stream) -> Result<DeviceSupport> {
    let context = StreamContext::enter(stream)?;
    let device = &context.device;
    let (served_by, unsupported) = match images::archive_for_device(device) {
        Ok(loaded) => (Some(loaded.archive.arch().to_string()), None),
        Err(e) if matches!(e.kind(), ErrorKind::UnsupportedGpu | ErrorKind::BadArchive) => (None, Some(e.message().to_string())),
        Err(e) => return Err(e),
    };
    Ok(DeviceSupport {
        runtime: device.runtime,
        ordinal: device.ordinal,
        arch: device.arch.clone(),
        target_id: device.target_id.clone(),
        multiprocessors: device.multiprocessors,
        served_by,
        unsupported,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_the_answer_is_no_driver() {
        if crate::library_present(Runtime::Cuda) {
            eprintln!("skipped: this machine has the CUDA driver (the GPU suite checks device_support there)");
            return;
        }
        let err = device_support(Stream::cuda(0)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoDriver, "{err}");
    }
}
