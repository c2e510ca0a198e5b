//! A tiny stderr logger: `tessera-hook: <level>: <message>` lines.
//!
//! Deliberately not `tracing`: the hook runs for every container, statically
//! linked, and says at most a few lines. The level comes from `hook.toml`
//! (`log_level`), never from the environment; until the file is read it is `warn`.

use std::sync::atomic::{AtomicU8, Ordering};

use serde::Deserialize;

/// How much the hook says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Only the error that fails the hook.
    Error = 0,
    /// Also what was ignored or refused without failing.
    Warn = 1,
    /// Also what was done.
    Info = 2,
    /// Also each step.
    Debug = 3,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Sets the level for the rest of the run.
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether messages of `level` are shown.
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one line at `level` if enabled.
pub fn emit(level: Level, message: std::fmt::Arguments<'_>) {
    if enabled(level) {
        let tag = match level {
            Level::Error => "error",
            Level::Warn => "warning",
            Level::Info => "info",
            Level::Debug => "debug",
        };
        eprintln!("tessera-hook: {tag}: {message}");
    }
}

/// Logs at `warn`.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::log::emit($crate::log::Level::Warn, format_args!($($arg)*)) };
}

/// Logs at `info`.
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::log::emit($crate::log::Level::Info, format_args!($($arg)*)) };
}

/// Logs at `debug`.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => { $crate::log::emit($crate::log::Level::Debug, format_args!($($arg)*)) };
}
