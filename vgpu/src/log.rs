//! One-line messages on stderr, each kind at most once per process.
//!
//! The library lives inside someone else's program: it must not flood that
//! program's stderr, so every message names a [`Once`] kind and is printed
//! the first time only, prefixed `tessera-vgpu:`. Levels follow HAMi-core's
//! `LIBCUDA_LOG_LEVEL`: 0 and 1 errors only (errors are always printed),
//! 2 warnings (the default), 3 info, 4 debug. Until the configuration is loaded, the level comes from
//! `LIBCUDA_LOG_LEVEL` in the environment.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Message severity; a message is printed when its level is at most the
/// configured level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// A limit could not be applied as configured.
    Error = 1,
    /// Something is degraded (a call passed through unenforced).
    Warn = 2,
    /// What the library decided (limits in force).
    Info = 3,
    /// Details for debugging the library itself.
    Debug = 4,
}

/// The level in force: 255 means "not set yet".
static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);

/// The environment variable HAMi-core reads for its log level.
pub const LEVEL_ENV: &str = tessera_model::contract::env::hami::LOG_LEVEL;

/// The default level: errors and warnings.
pub const DEFAULT_LEVEL: u8 = 2;

/// Sets the level (from the loaded configuration).
pub fn set_level(level: u8) {
    LEVEL.store(level, Ordering::Relaxed);
}

/// The level in force.
pub fn level() -> u8 {
    match LEVEL.load(Ordering::Relaxed) {
        u8::MAX => {
            let level = std::env::var(LEVEL_ENV)
                .ok()
                .and_then(|v| v.trim().parse::<u8>().ok())
                .unwrap_or(DEFAULT_LEVEL)
                .clamp(1, 4);
            // Another thread may have set the configured level meanwhile: keep it.
            let _ = LEVEL.compare_exchange(u8::MAX, level, Ordering::Relaxed, Ordering::Relaxed);
            LEVEL.load(Ordering::Relaxed)
        }
        level => level,
    }
}

/// Whether messages of `level` are printed.
pub fn enabled(level: Level) -> bool {
    level as u8 <= self::level()
}

/// A kind of message printed at most once per process.
pub struct Once(AtomicBool);

impl Once {
    /// A kind not printed yet.
    pub const fn new() -> Self {
        Once(AtomicBool::new(false))
    }
}

impl Default for Once {
    fn default() -> Self {
        Self::new()
    }
}

/// Prints `message` (built lazily) on one line of stderr, the first time
/// `once` is used and if `level` is enabled.
pub fn once(once: &Once, level: Level, message: impl FnOnce() -> String) {
    if !enabled(level) || once.0.swap(true, Ordering::Relaxed) {
        return;
    }
    line(&message());
}

/// Prints `message` if `level` is enabled (for messages that are rare by
/// construction, such as a denied allocation at debug level).
pub fn log(level: Level, message: impl FnOnce() -> String) {
    if enabled(level) {
        line(&message());
    }
}

fn line(message: &str) {
    use std::io::Write;
    // One write call, so lines of concurrent threads do not interleave; a
    // closed stderr is not our problem to report.
    let text = format!("tessera-vgpu: {}\n", message.replace('\n', " "));
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_reported_once() {
        let kind = Once::new();
        set_level(4);
        let mut calls = 0;
        once(&kind, Level::Debug, || {
            calls += 1;
            "first".into()
        });
        once(&kind, Level::Debug, || {
            calls += 1;
            "second".into()
        });
        assert_eq!(calls, 1);
    }
}
