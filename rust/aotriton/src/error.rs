//! The one error type of the runtime: a stable code (mirrored by the C++ `Status` enum) plus a
//! message that names the cause (the argument, the kernel, the archive file, the driver call).
use std::fmt;

/// What went wrong, as a stable number. The C++ API returns these values as `aotriton::v2::Status`
/// (include/aotriton/runtime.h); never renumber, only append.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A parameter is wrong in a way no more specific kind covers (e.g. a non-finite `sm_scale`).
    InvalidArgument = 1,
    /// Tensors that must share a dtype do not, or a tensor has a dtype the operator does not take.
    DTypeMismatch = 2,
    /// Tensor sizes disagree with each other (batch, heads, sequence or head dim).
    ShapeMismatch = 3,
    /// A stride is negative, the last stride is not 1, or an offset would overflow the kernel's index type.
    BadStrides = 4,
    /// The head dim is not one the library was built for.
    UnsupportedHeadDim = 5,
    /// A required tensor has a null data pointer.
    NullPointer = 6,
    /// A data pointer is not aligned to its element size.
    MisalignedPointer = 7,
    /// A sequence length (Sq or Sk), the batch or the head count is 0.
    EmptyInput = 8,
    /// The dtype is not supported by this operator.
    UnsupportedDType = 9,
    /// The problem is larger than the launch grid or the kernel's index arithmetic allows.
    TooLarge = 10,
    /// A versioned parameter struct carries a version this library does not know.
    UnsupportedVersion = 11,
    /// The backend the caller forced (`flash::Backend::Gluon`, ...) cannot serve these inputs on
    /// this device (the message names the reason: dtype, head dim, a feature, a stride, the
    /// arch, a missing or short workspace). `Backend::Auto` never reports this: it falls back.
    UnsupportedByBackend = 12,
    /// No GPU driver library could be loaded on this machine.
    NoDriver = 20,
    /// A driver call failed; the message names the call and the driver's error.
    Driver = 21,
    /// The GPU's architecture has no images in this build, or the images' target features do
    /// not match the device's.
    UnsupportedGpu = 22,
    /// No compiled kernel serves these inputs (functional not built, or no variant fits).
    KernelNotFound = 23,
    /// A kernel archive is corrupt, truncated or does not match this runtime.
    BadArchive = 24,
    /// The stream's runtime library is present but reports no GPU.
    NoDevice = 25,
    /// The images `AOTRITON_IMAGE_DIR` names are not trusted: the path is not absolute or not a
    /// directory, it or a file in it can be changed by other users, or an archive's SHA-256 is not
    /// one the library trusts. The message names the path and the reason.
    UntrustedImages = 26,
    /// A bug in aotriton (e.g. a caught panic). Please report it.
    Internal = 99,
}

/// An error with its kind and a message naming the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error of `kind` with `message` (which names the argument, kernel, file or driver call).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }
    /// The cause, one per C++ `Status` value.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// What went wrong, naming the argument, kernel, archive file or driver call.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

impl From<crate::archive::ArchiveError> for Error {
    fn from(e: crate::archive::ArchiveError) -> Self {
        Error::new(ErrorKind::BadArchive, e.to_string())
    }
}

/// The result of every fallible call of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand used by validation code: `bail!(ShapeMismatch, "k.sizes[0]={} ...", x)`.
macro_rules! bail {
    ($kind:ident, $($fmt:tt)+) => {
        return Err($crate::error::Error::new($crate::error::ErrorKind::$kind, format!($($fmt)+)))
    };
}
pub(crate) use bail;

/// The product of caller-given sizes (`what` names it in the error), or `TooLarge`: the one helper
/// for every product of caller sizes, so none wraps in release or panics with overflow checks.
pub(crate) fn checked_product(what: &str, factors: &[u64]) -> Result<u64> {
    if factors.contains(&0) {
        return Ok(0); // even where a partial product of the others would overflow
    }
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| Error::new(ErrorKind::TooLarge, format!("{what}: the product {factors:?} overflows 64 bits")))
}

/// `a + b` of caller-given sizes or addresses, or `TooLarge` naming `what`.
pub(crate) fn checked_sum(what: &str, a: u64, b: u64) -> Result<u64> {
    a.checked_add(b).ok_or_else(|| Error::new(ErrorKind::TooLarge, format!("{what}: {a} + {b} overflows 64 bits")))
}
