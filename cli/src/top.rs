//! `cuslice top`: the frame of [`crate::frame`], refreshed in place.
//!
//! On a terminal: raw mode and the alternate screen, `q` (or Esc, Ctrl-C)
//! quits; the terminal is restored however it ends (a key, SIGINT, SIGTERM,
//! SIGHUP, an error, a panic). Not on a terminal (a pipe): frames one after
//! the other, each after a clear-screen. `--once`: one frame, measured over
//! one interval, and exit (scripts, the docs).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossterm::style::{Attribute, Print, SetAttribute};
use crossterm::terminal::{self, ClearType};
use crossterm::{cursor, execute, queue};

use crate::frame::{Line, frame};
use crate::view::{Snapshot, Viewer};

const TITLE: &str = "cuslice top";

/// The width to lay a frame out for when not drawing on a terminal:
/// `$COLUMNS`, else 80.
fn plain_width() -> usize {
    if std::io::stdout().is_terminal()
        && let Ok((w, _)) = terminal::size()
    {
        return usize::from(w);
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|w| *w > 0)
        .unwrap_or(80)
}

/// The lines as text; with `ansi`, ended tenants' rows dimmed (SGR 2).
pub fn text(lines: &[Line], ansi: bool) -> String {
    let mut out = String::new();
    for l in lines {
        if ansi && l.dim {
            out.push_str(&format!("\x1b[2m{}\x1b[0m\n", l.text));
        } else {
            out.push_str(&l.text);
            out.push('\n');
        }
    }
    out
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Puts the terminal back as it was, when dropped.
struct Screen;

impl Screen {
    fn enter() -> std::io::Result<Screen> {
        terminal::enable_raw_mode()?;
        let s = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        Ok(s)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            SetAttribute(Attribute::Reset),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

fn draw(snap: &Snapshot, hint: &str) -> std::io::Result<()> {
    let (w, h) = terminal::size()?;
    let (w, h) = (usize::from(w), usize::from(h));
    let mut lines = frame(snap, TITLE, w, true);
    // The key hint on the title line, right-aligned where it fits.
    if let Some(first) = lines.first_mut() {
        let used = first.text.chars().count();
        if used + 2 + hint.len() <= w {
            first.text = format!("{}{:>pad$}", first.text, hint, pad = w - used);
        }
    }
    let mut out = std::io::stdout().lock();
    queue!(out, cursor::MoveTo(0, 0))?;
    for (i, l) in lines.iter().take(h).enumerate() {
        queue!(out, cursor::MoveTo(0, i as u16))?;
        if l.dim {
            queue!(out, SetAttribute(Attribute::Dim))?;
        }
        queue!(
            out,
            Print(&l.text),
            SetAttribute(Attribute::Reset),
            terminal::Clear(ClearType::UntilNewLine)
        )?;
    }
    if lines.len() < h {
        queue!(
            out,
            cursor::MoveTo(0, lines.len() as u16),
            terminal::Clear(ClearType::FromCursorDown)
        )?;
    }
    out.flush()
}

/// Waits up to `d` for a key on stdin: true if it asks to quit (`q`, `Q`,
/// Esc, Ctrl-C), if a signal asked to stop, or if the terminal is gone
/// (hang-up, end of file). Redraws when the terminal's size changes.
///
/// Keys are read here with poll(2) and read(2), not through crossterm's
/// event reader: that one spins on a terminal that hung up (read() keeps
/// returning 0), never returning and ignoring its timeout, so that a `top`
/// whose terminal closed lived on at full CPU.
fn wait_keys(d: Duration, snap: &Snapshot, hint: &str) -> std::io::Result<bool> {
    let end = Instant::now() + d;
    let mut size = terminal::size()?;
    loop {
        if STOP.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let now = terminal::size()?;
        if now != size {
            size = now;
            draw(snap, hint)?;
        }
        let mut p = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        // Short polls: a signal sets STOP, and a resize is seen, within
        // 100 ms.
        let ms = left.min(Duration::from_millis(100)).as_millis() as libc::c_int;
        // SAFETY: one valid pollfd, count 1.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            continue;
        }
        if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return Ok(true);
        }
        let mut buf = [0u8; 64];
        // SAFETY: reading into a local buffer of that length.
        let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 {
            return Ok(true);
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if matches!(
                e.kind(),
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
            ) {
                continue;
            }
            return Err(e);
        }
        let keys = &buf[..n as usize];
        // Esc alone; an escape sequence (an arrow key: ESC [ A) is not one.
        let esc = keys == [0x1b];
        if esc || keys.iter().any(|k| matches!(k, b'q' | b'Q' | 0x03)) {
            return Ok(true);
        }
    }
}

fn interactive(mut obs: Viewer, dt: Duration) -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing a handler that only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let _screen = Screen::enter()?;
    let hint = "q: quit";
    loop {
        let snap = obs.read();
        draw(&snap, hint)?;
        if wait_keys(dt, &snap, hint)? {
            return Ok(());
        }
    }
}

/// Runs `top` until `q` (or a signal); with `once`, prints one frame.
pub fn run(mut obs: Viewer, interval: f64, once: bool) -> Result<(), String> {
    let dt = Duration::from_secs_f64(interval.clamp(0.1, 3600.0));
    let stdout = std::io::stdout();
    if once {
        obs.read();
        std::thread::sleep(dt);
        let snap = obs.read();
        print!(
            "{}",
            text(
                &frame(&snap, TITLE, plain_width(), true),
                stdout.is_terminal()
            )
        );
        return Ok(());
    }
    if stdout.is_terminal() && std::io::stdin().is_terminal() {
        return interactive(obs, dt).map_err(|e| format!("terminal: {e}"));
    }
    loop {
        let snap = obs.read();
        let mut out = stdout.lock();
        // Clear the screen and home the cursor, then the frame. A reader
        // that went away ends it.
        if write!(
            out,
            "\x1b[2J\x1b[H{}",
            text(&frame(&snap, TITLE, plain_width(), true), false)
        )
        .and_then(|()| out.flush())
        .is_err()
        {
            return Ok(());
        }
        drop(out);
        std::thread::sleep(dt);
    }
}
