//! Env-gated logging (`CUSLICE_LOG=off|error|warn|info|debug`, default
//! `warn`). Every line is formatted into a stack buffer and written with one
//! `write(2)` to stderr: no allocation, no lock, safe in hooks and in the
//! fork child.
//!
//! At `debug`, each exported hook logs its first call (`intercepted NAME`)
//! and at exit one line per hook with its call count (`calls NAME N`).

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::generated::{COUNT, NAMES};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl Level {
    pub fn parse(s: &[u8]) -> Option<Level> {
        Some(match s {
            b"off" | b"none" | b"0" => Level::Off,
            b"error" => Level::Error,
            b"warn" | b"warning" => Level::Warn,
            b"info" => Level::Info,
            b"debug" | b"trace" => Level::Debug,
            _ => return None,
        })
    }

    fn word(self) -> &'static str {
        match self {
            Level::Off => "",
            Level::Error => "error",
            Level::Warn => "warning",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

#[inline(always)]
pub fn enabled(l: Level) -> bool {
    LEVEL.load(Ordering::Relaxed) >= l as u8
}

/// A fixed-size line buffer; what does not fit is cut (with a marker).
pub struct Line {
    buf: [u8; 512],
    len: usize,
    cut: bool,
}

impl Line {
    pub fn new() -> Line {
        Line {
            buf: [0; 512],
            len: 0,
            cut: false,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Default for Line {
    fn default() -> Self {
        Line::new()
    }
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Keep 4 bytes for "...\n".
        let room = self.buf.len() - 4 - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() {
            self.cut = true;
        }
        Ok(())
    }
}

/// Writes one log line at `level` (prefix `cuslice[pid]: level: `).
pub fn write_line(level: Level, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let mut line = Line::new();
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let _ = write!(line, "cuslice[{pid}]: {}: ", level.word());
    let _ = line.write_fmt(args);
    if line.cut {
        let _ = line.write_str("...");
    }
    line.buf[line.len] = b'\n';
    line.len += 1;
    write_stderr(line.as_bytes());
}

fn write_stderr(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live byte slice.
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            // EINTR: retry; anything else (closed stderr): give up silently,
            // logging must never fail the caller.
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

#[macro_export]
macro_rules! log_at {
    ($lvl:expr, $($arg:tt)*) => {
        if $crate::log::enabled($lvl) {
            $crate::log::write_line($lvl, format_args!($($arg)*));
        }
    };
}

#[macro_export]
macro_rules! error { ($($arg:tt)*) => { $crate::log_at!($crate::log::Level::Error, $($arg)*) }; }
#[macro_export]
macro_rules! warn { ($($arg:tt)*) => { $crate::log_at!($crate::log::Level::Warn, $($arg)*) }; }
#[macro_export]
macro_rules! info { ($($arg:tt)*) => { $crate::log_at!($crate::log::Level::Info, $($arg)*) }; }
#[macro_export]
macro_rules! debug { ($($arg:tt)*) => { $crate::log_at!($crate::log::Level::Debug, $($arg)*) }; }

/// Per-hook call counters (only touched at `debug`).
static CALLS: [AtomicU64; COUNT] = [const { AtomicU64::new(0) }; COUNT];

/// Counts one call of hook `id`; logs its first call. Free unless `debug`.
#[inline(always)]
pub fn count(id: usize) {
    if enabled(Level::Debug) {
        count_slow(id);
    }
}

#[cold]
#[inline(never)]
fn count_slow(id: usize) {
    if let Some(c) = CALLS.get(id)
        && c.fetch_add(1, Ordering::Relaxed) == 0
    {
        crate::debug!("intercepted {}", name(id));
    }
}

/// Symbol name of declared function `id`.
pub fn name(id: usize) -> &'static str {
    NAMES.get(id).and_then(|n| n.to_str().ok()).unwrap_or("?")
}

/// After fork the child counts its own calls only.
pub fn reset_counts() {
    for c in &CALLS {
        c.store(0, Ordering::Relaxed);
    }
}

/// At exit (debug): one line per hook that was called, with its count.
pub fn report_counts() {
    if !enabled(Level::Debug) {
        return;
    }
    for (id, c) in CALLS.iter().enumerate() {
        let n = c.load(Ordering::Relaxed);
        if n > 0 {
            crate::debug!("calls {} {}", name(id), n);
        }
    }
}

#[cold]
pub fn hook_panicked(id: usize) {
    crate::error!(
        "internal error (panic) in the hook for {}; returned an error status to the caller. Please report this.",
        name(id)
    );
}

/// A panic in a `pre` step (the launch gate): the call went through.
#[cold]
pub fn pre_step_panicked(id: usize) {
    crate::error!(
        "internal error (panic) in the compute gate for {}; the call was let through unlimited. Please report this.",
        name(id)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_not_overflowed() {
        let mut l = Line::new();
        for _ in 0..100 {
            let _ = l.write_str("0123456789");
        }
        assert!(l.cut);
        assert_eq!(l.as_bytes().len(), 512 - 4);
    }

    #[test]
    fn levels_parse() {
        assert_eq!(Level::parse(b"debug"), Some(Level::Debug));
        assert_eq!(Level::parse(b"off"), Some(Level::Off));
        assert_eq!(Level::parse(b"loud"), None);
    }
}
