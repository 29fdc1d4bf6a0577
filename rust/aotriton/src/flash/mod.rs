//! FlashAttention operators.
//!
//! Layouts: Q, K, V and O are B×H×S×D views with any element strides whose last stride is 1 (so
//! both B×H×S×D and B×S×H×D memory work). The log-sum-exp output is a B×H×Sq fp32 view (last
//! stride 1) holding, for each query row, the natural-log `m + ln(Σ exp(s - m))` of its scaled
//! scores `s = sm_scale · q·k`; the backward pass consumes it.
mod fwd;

pub use fwd::{FwdParams, attn_fwd};
