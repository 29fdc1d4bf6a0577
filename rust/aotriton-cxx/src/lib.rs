//! The cxx bridge behind the C++ API (v2src/). Only v2src sees the generated header: the public
//! headers in include/aotriton/ expose plain C-compatible types. Errors travel as an Outcome
//! (code + message); panics are caught here and never unwind into C++.
use std::panic::{AssertUnwindSafe, catch_unwind};

use aotriton::{DType, Error, ErrorKind, Stream, TensorView, flash};

#[cxx::bridge(namespace = "aotriton::bridge")]
mod ffi {
    struct TensorView4 {
        ptr: u64,
        sizes: [u64; 4],
        strides: [i64; 4],
        dtype: i32,
    }

    struct TensorView3 {
        ptr: u64,
        sizes: [u64; 3],
        strides: [i64; 3],
        dtype: i32,
    }

    /// Version 1 of aotriton::v2::flash::FwdParams.
    struct FwdParamsV1 {
        q: TensorView4,
        k: TensorView4,
        v: TensorView4,
        o: TensorView4,
        lse: TensorView3,
        sm_scale: f32,
        causal: bool,
    }

    /// 0 on success, else an aotriton::Status value, with the message naming the cause.
    struct Outcome {
        code: i32,
        message: String,
    }

    extern "Rust" {
        fn version() -> String;
        fn attn_fwd(params: &FwdParamsV1, stream: usize) -> Outcome;
    }
}

use ffi::Outcome;

/// Runs `f`, turning its error or a panic into an Outcome.
fn guard(f: impl FnOnce() -> Result<(), Error>) -> Outcome {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Outcome { code: 0, message: String::new() },
        Ok(Err(e)) => Outcome { code: e.kind() as i32, message: e.message().to_string() },
        Err(_) => Outcome { code: ErrorKind::Internal as i32, message: "panic in the aotriton runtime".into() },
    }
}

fn version() -> String {
    format!("{} ({})", env!("CARGO_PKG_VERSION"), aotriton::built_archs().join(", "))
}

fn dtype(raw: i32, name: &str) -> Result<DType, Error> {
    DType::from_raw(raw).ok_or_else(|| Error::new(ErrorKind::InvalidArgument, format!("{name}: unknown dtype value {raw}")))
}

macro_rules! view {
    ($t:expr, $name:expr) => {
        TensorView::new($t.ptr, $t.sizes, $t.strides, dtype($t.dtype, $name)?)
    };
}

fn attn_fwd(p: &ffi::FwdParamsV1, stream: usize) -> Outcome {
    guard(|| {
        let mut params = flash::FwdParams::new(
            view!(p.q, "q"),
            view!(p.k, "k"),
            view!(p.v, "v"),
            view!(p.o, "o"),
            view!(p.lse, "lse"),
        );
        params.sm_scale = p.sm_scale;
        params.causal = p.causal;
        flash::attn_fwd(&params, Stream::from_raw(stream))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t4() -> ffi::TensorView4 {
        ffi::TensorView4 { ptr: 0, sizes: [1, 1, 1, 64], strides: [64, 64, 64, 1], dtype: 1 }
    }

    #[test]
    fn errors_and_panics_become_outcomes() {
        let p = ffi::FwdParamsV1 {
            q: t4(),
            k: t4(),
            v: t4(),
            o: t4(),
            lse: ffi::TensorView3 { ptr: 0, sizes: [1, 1, 1], strides: [1, 1, 1], dtype: 3 },
            sm_scale: 0.125,
            causal: false,
        };
        let out = attn_fwd(&p, 0);
        assert_eq!(out.code, ErrorKind::NullPointer as i32, "{}", out.message);
        assert!(out.message.contains("q"), "{}", out.message);
        let mut bad = p;
        bad.q.dtype = 42;
        assert_eq!(attn_fwd(&bad, 0).code, ErrorKind::InvalidArgument as i32);
        assert_eq!(guard(|| panic!("expected in this test")).code, ErrorKind::Internal as i32);
    }
}
