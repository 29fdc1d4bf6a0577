//! What the fuzz targets share: a seeded RNG, the time budget and seed from the environment, and a
//! loop that runs each case under `catch_unwind` with a watchdog for hangs.
//!
//! Environment:
//! - `AOTRITON_FUZZ_SECONDS`: time budget per target (default 20, so `cargo test` stays quick;
//!   CI sets more).
//! - `AOTRITON_FUZZ_SEED`: the run's seed (hex `0x...` or decimal); default from the clock. Every
//!   run prints it, and each case's RNG is derived from (seed, case number).
//! - `AOTRITON_FUZZ_CASE`: run only this case number of that seed (replays one failure).
//! - `AOTRITON_FUZZ_CASE_SECONDS`: a case running longer than this is a hang (default 60): the
//!   watchdog prints the seed and the case and aborts the process.
#![allow(dead_code)]

use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// xorshift64*: small, fast, good enough to pick mutations; fully determined by its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so that nearby seeds (case numbers) give unrelated streams and
        // the state is never 0.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    /// Uniform in lo..=hi.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    /// True with probability 1/n.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())]
    }
}

/// Budget and seed of one fuzz run, read from the environment.
#[derive(Debug, Clone, Copy)]
pub struct FuzzConfig {
    pub seconds: f64,
    pub seed: u64,
    /// Replay only this case.
    pub only_case: Option<u64>,
    pub case_limit: Duration,
}

fn parse_u64(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

impl FuzzConfig {
    pub fn from_env() -> FuzzConfig {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let seconds = var("AOTRITON_FUZZ_SECONDS")
            .map(|v| v.trim().parse::<f64>().unwrap_or_else(|_| panic!("AOTRITON_FUZZ_SECONDS={v} is not a number")))
            .unwrap_or(20.0);
        let seed = match var("AOTRITON_FUZZ_SEED") {
            Some(v) => parse_u64(&v).unwrap_or_else(|| panic!("AOTRITON_FUZZ_SEED={v} is not a number")),
            None => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                now.as_nanos() as u64 ^ ((std::process::id() as u64) << 32)
            }
        };
        let only_case = var("AOTRITON_FUZZ_CASE").map(|v| parse_u64(&v).unwrap_or_else(|| panic!("AOTRITON_FUZZ_CASE={v}")));
        let case_limit = var("AOTRITON_FUZZ_CASE_SECONDS")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(Duration::from_secs(60), Duration::from_secs_f64);
        FuzzConfig { seconds, seed, only_case, case_limit }
    }

    /// The RNG of case `n` of this run.
    pub fn case_rng(&self, n: u64) -> Rng {
        Rng::new(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

/// What one fuzz loop saw.
#[derive(Debug, Default)]
pub struct FuzzReport {
    pub cases: u64,
    pub panics: u64,
    /// Cases that broke a property other than "no panic" (wrong error kind, ...).
    pub violations: u64,
    /// One example per kind of failure (see [`signature`]), with how often that kind occurred:
    /// the case number, what went wrong and the case.
    pub failures: Vec<(String, u64, String)>,
    pub slowest: Duration,
    pub elapsed: Duration,
}

impl FuzzReport {
    pub fn failed(&self) -> bool {
        self.panics + self.violations > 0
    }

    /// Counts a failure under its kind, keeping the first example of each kind.
    fn record(&mut self, text: String) {
        let kind = signature(&text);
        if let Some(entry) = self.failures.iter_mut().find(|(k, _, _)| *k == kind) {
            entry.1 += 1;
        } else if self.failures.len() < KEPT_FAILURES {
            self.failures.push((kind, 1, text));
        }
    }
}

/// The kind of a failure, so that one bug hit by thousands of cases is listed once: its text
/// after the case number, up to the first digit or the end of the first line (a panic's
/// location, or the start of a property's message).
fn signature(text: &str) -> String {
    let after_case = text.split_once(": ").map_or(text, |(_, rest)| rest);
    let first_line = after_case.lines().next().unwrap_or("");
    let location = first_line.strip_prefix("PANIC panicked at ").map(|l| format!("panic at {}", l.trim_end_matches(':')));
    location.unwrap_or_else(|| first_line.chars().take_while(|c| !c.is_ascii_digit()).collect())
}

/// Most kinds of failure kept for the final message.
const KEPT_FAILURES: usize = 16;

thread_local! {
    /// The panic message with its location, recorded by the hook installed during the loop.
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    static IN_FUZZ_LOOP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The case the fuzz loop is running, for the watchdog's message.
static CURRENT: Mutex<Option<(u64, String)>> = Mutex::new(None);
static CASE_STARTED_MS: AtomicU64 = AtomicU64::new(0);
/// The seed and case number running now (readable without locking or allocating, e.g. from a
/// global allocator that wants to say where it refused a request).
static RUNNING_SEED: AtomicU64 = AtomicU64::new(0);
static RUNNING_CASE: AtomicU64 = AtomicU64::new(u64::MAX);
static LOOP_RUNNING: AtomicBool = AtomicBool::new(false);

fn millis_since(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

/// Runs `case(n, rng)` for n = 0, 1, ... until the budget is spent (or only the replayed case),
/// each under `catch_unwind`. `case` calls [`note_case`] with the case's Debug text once it has
/// generated it (a panic or a hang prints that text), and returns `Err(problem)` when a property
/// other than "no panic" failed. A case running past the per-case limit aborts the process after
/// printing seed and case (a hang cannot be unwound).
pub fn fuzz_loop(target: &str, config: &FuzzConfig, mut case: impl FnMut(u64, &mut Rng) -> Result<(), String>) -> FuzzReport {
    println!(
        "{target}: seed {:#018x} (replay: AOTRITON_FUZZ_SEED={:#x}), budget {} s",
        config.seed, config.seed, config.seconds
    );
    let start = Instant::now();
    let watchdog = spawn_watchdog(target, config, start);
    // Panics of the fuzz thread are recorded silently (thousands of cases may hit one bug); other
    // threads (the test harness, tests running beside this one) keep the usual hook.
    let previous_hook: std::sync::Arc<Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync>> =
        std::sync::Arc::new(std::panic::take_hook());
    let fallback = previous_hook.clone();
    IN_FUZZ_LOOP.with(|f| f.set(true));
    std::panic::set_hook(Box::new(move |info| {
        if IN_FUZZ_LOOP.with(|f| f.get()) {
            let text = info.to_string();
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(text));
        } else {
            fallback(info);
        }
    }));

    let mut report = FuzzReport::default();
    let budget = Duration::from_secs_f64(config.seconds.max(0.0));
    let mut n = config.only_case.unwrap_or(0);
    loop {
        if config.only_case.is_some_and(|only| n != only) || (config.only_case.is_none() && start.elapsed() >= budget) {
            break;
        }
        let case_start = Instant::now();
        *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some((n, String::new()));
        RUNNING_SEED.store(config.seed, Ordering::SeqCst);
        RUNNING_CASE.store(n, Ordering::SeqCst);
        CASE_STARTED_MS.store(millis_since(start).max(1), Ordering::SeqCst);
        let mut rng = config.case_rng(n);
        let outcome = catch_unwind(AssertUnwindSafe(|| case(n, &mut rng)));
        CASE_STARTED_MS.store(0, Ordering::SeqCst);
        RUNNING_CASE.store(u64::MAX, Ordering::SeqCst);
        report.slowest = report.slowest.max(case_start.elapsed());
        report.cases += 1;
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(problem)) => {
                report.violations += 1;
                report.record(format!("case {n}: {problem}"));
            }
            Err(payload) => {
                report.panics += 1;
                let message = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| payload_text(&payload));
                let text = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|c| c.1.clone()).unwrap_or_default();
                report.record(format!("case {n}: PANIC {message}\n    the case: {text}"));
            }
        }
        n += 1;
    }
    IN_FUZZ_LOOP.with(|f| f.set(false));
    let _ = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| previous_hook(info)));
    LOOP_RUNNING.store(false, Ordering::SeqCst);
    let _ = watchdog.join();
    report.elapsed = start.elapsed();
    println!(
        "{target}: seed {:#018x} {} cases in {:.1} s, {} panics, {} other failures (slowest case {:.3} s)",
        config.seed,
        report.cases,
        report.elapsed.as_secs_f64(),
        report.panics,
        report.violations,
        report.slowest.as_secs_f64()
    );
    report
}

/// (seed, case number) of the case running now, if any. Allocation-free.
pub fn running_case() -> Option<(u64, u64)> {
    let case = RUNNING_CASE.load(Ordering::SeqCst);
    (case != u64::MAX).then(|| (RUNNING_SEED.load(Ordering::SeqCst), case))
}

/// Records the case text for the watchdog (call at the start of a case, once it is generated).
pub fn note_case(text: impl FnOnce() -> String) {
    if let Ok(mut current) = CURRENT.lock()
        && let Some((_, slot)) = current.as_mut()
    {
        *slot = text();
    }
}

fn spawn_watchdog(target: &str, config: &FuzzConfig, start: Instant) -> std::thread::JoinHandle<()> {
    LOOP_RUNNING.store(true, Ordering::SeqCst);
    let (target, seed, limit) = (target.to_string(), config.seed, config.case_limit);
    std::thread::spawn(move || {
        while LOOP_RUNNING.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
            let started = CASE_STARTED_MS.load(Ordering::SeqCst);
            if started != 0 && millis_since(start).saturating_sub(started) > limit.as_millis() as u64 {
                let current = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let (n, text) = current.unwrap_or_default();
                eprintln!(
                    "{target}: HANG: case {n} of seed {seed:#x} ran over {} s (replay: AOTRITON_FUZZ_SEED={seed:#x} AOTRITON_FUZZ_CASE={n})\n    the case: {text}",
                    limit.as_secs_f64()
                );
                std::process::abort();
            }
        }
    })
}

pub fn payload_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}

/// Fails the test with every kept failure and how to replay it.
pub fn assert_clean(target: &str, config: &FuzzConfig, report: &FuzzReport) {
    if report.failed() {
        let mut text = format!(
            "{target}: {} panics and {} other failures in {} cases (seed {:#x}; replay one case with AOTRITON_FUZZ_SEED={:#x} AOTRITON_FUZZ_CASE=<n>):\n",
            report.panics, report.violations, report.cases, config.seed, config.seed
        );
        for (_, count, example) in &report.failures {
            text.push_str(&format!("  [{count} like this] {example}\n"));
        }
        panic!("{text}");
    }
}

/// Runs `f` and returns its value, or the panic's message.
pub fn no_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| payload_text(&payload))
}

/// Short Debug text of a long list: its length and first few items.
pub fn short_list<T: Debug>(items: &[T]) -> String {
    if items.len() <= 8 {
        format!("{items:?}")
    } else {
        format!("{:?}... ({} entries, last {:?})", &items[..8], items.len(), items.last().unwrap())
    }
}
