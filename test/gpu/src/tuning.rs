//! The tuner's override (`aotriton::tuning::force_kernel`) on the GPU: forcing a kernel of the
//! call's functional launches that kernel (the forced count moves) and its result agrees with
//! dispatch's own pick; forcing a kernel of another functional changes nothing (same bits, count
//! unchanged); clearing it restores dispatch. bf16, B=2, Hq=Hk=8, S=1024, D=64, causal, on the
//! portable backend (the tuner's), forcing that functional's `generic` kernel, which dispatch never
//! picks for these aligned tensors.
use super::*;

pub(crate) fn override_case(stream: sys::CUstream) -> Result<Outcome, String> {
    let t = Lowp::BF16;
    let (b, h, s, d) = (2usize, 8usize, 1024usize, 64usize);
    let mut rng = SplitMix64::new(0x70E_0000);
    let mut draw = |n: usize| (0..n).map(|_| t.encode(rng.normal_in(t))).collect::<Vec<u16>>();
    let n = b * h * s * d;
    let dev = StepTensors::contiguous([b, h, h, s, s, d], [&draw(n), &draw(n), &draw(n), &draw(n)], POISON16, stream)?;
    let mut p = dev.fwd_params(dtype_of(t));
    p.mask = Mask::causal(MaskAlign::TopLeft);
    p.backend = flash::Backend::Portable;
    let st = Stream::cuda(stream as usize);
    let support = aotriton::device_support(st).map_err(|e| e.to_string())?;
    let arch = support.served_by.ok_or_else(|| support.unsupported.unwrap_or_default())?;
    let ids = aotriton::with_archive(&arch, |a| {
        a.functionals()
            .iter()
            .filter(|f| {
                let axis = |k: &str| f.axes.get(k).map(String::as_str);
                f.family == "attn_fwd"
                    && axis("dtype") == Some("bf16")
                    && axis("head_dim") == Some("64")
                    && axis("dropout") == Some("false")
                    && axis("bias") == Some("false")
                    // Optional axes (rules.OPTIONAL_AXES) are named only when on, and this call has
                    // them all off: the functional has the base axes and no other.
                    && f.axes.keys().all(|k| ["dtype", "tf32", "head_dim", "dropout", "bias"].contains(&k.as_str()))
            })
            .flat_map(|f| f.kernels.iter().filter(|k| k.variant == "generic").map(|k| k.id.clone()))
            .collect::<Vec<_>>()
    })
    .map_err(|e| e.to_string())?;
    let Some(generic) = ids.first() else { return Err("no generic bf16 hd64 attn_fwd kernel in the archive".into()) };
    let run = |p: &flash::FwdParams| -> Result<Vec<u16>, String> {
        flash::attn_fwd(p, st).map_err(|e| e.to_string())?;
        Ok(dev.outputs(stream)?.0)
    };
    aotriton::tuning::force_kernel(None);
    let own = run(&p)?;
    let c0 = aotriton::tuning::forced_count();
    aotriton::tuning::force_kernel(Some(generic));
    let forced = run(&p);
    let c1 = aotriton::tuning::forced_count();
    aotriton::tuning::force_kernel(Some("attn_bwd_dq-not-this-functional"));
    let other = run(&p);
    let c2 = aotriton::tuning::forced_count();
    aotriton::tuning::force_kernel(None);
    let again = run(&p)?;
    let (forced, other) = (forced?, other?);
    // The read is the contiguous tensor (n elements) and then its poisoned guard: the guard must
    // come back untouched; over the tensor, the largest difference (a NaN counts as infinite)
    // and where it is, as (b, h, row, col).
    let guard_intact = forced[n..] == own[n..];
    let (diff, worst) = own[..n]
        .iter()
        .zip(&forced[..n])
        .map(|(&a, &g)| (t.decode(a) as f64 - t.decode(g) as f64).abs())
        .enumerate()
        .fold((0.0f64, 0usize), |(m, at), (i, x)| {
            let x = if x.is_nan() { f64::INFINITY } else { x };
            if x > m { (x, i) } else { (m, at) }
        });
    let non_finite = forced[..n].iter().filter(|&&x| !t.decode(x).is_finite()).count();
    let at = [worst / (h * s * d), worst / (s * d) % h, worst / d % s, worst % d];
    let pass = c1 == c0 + 1 && c2 == c1 && other == own && again == own && guard_intact && diff <= 2e-2;
    Ok(Outcome {
        pass,
        line: format!(
            "tuning override: forced {generic}: count +{} (want 1), max|forced - own| {diff:.2e} (bound 2e-2) at {at:?}, {non_finite} non-finite, guard {}; \
             another functional's id: count +{} (want 0), bits {}; cleared: bits {}  {}",
            c1 - c0,
            if guard_intact { "intact" } else { "WRITTEN" },
            c2 - c1,
            if other == own { "equal" } else { "DIFFER" },
            if again == own { "equal" } else { "DIFFER" },
            if pass { "ok" } else { "FAIL" }
        ),
    })
}
