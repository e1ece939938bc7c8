//! The terminal taken and given back: [`TerminalGuard`] holds raw mode, the alternate
//! screen and a hidden cursor, and restores them however the view ends (return,
//! error, unwinding, or a panic through the hook); [`stop_on_signals`] turns SIGTERM,
//! SIGHUP and SIGINT into a stop request that the loop sees like `q`.

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};

/// Whether this process has the terminal in raw mode on the alternate screen, so
/// that exactly one of the guard's drop and the panic hook gives it back.
static TERMINAL_TAKEN: AtomicBool = AtomicBool::new(false);
/// Set by SIGTERM, SIGHUP or SIGINT: the view ends as if `q` was pressed.
static STOP: AtomicBool = AtomicBool::new(false);

/// Raw mode, alternate screen and a hidden cursor while it lives; the terminal as it
/// was when it is dropped (on return, on error, on unwinding) or, before the panic
/// message is printed, by the panic hook.
pub struct TerminalGuard(());

impl TerminalGuard {
    pub fn enter() -> std::io::Result<TerminalGuard> {
        install_panic_hook();
        crossterm::terminal::enable_raw_mode()?;
        TERMINAL_TAKEN.store(true, AtomicOrdering::SeqCst);
        // From here on, a failure restores the terminal when `guard` drops.
        let guard = TerminalGuard(());
        crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Raw mode off, main screen back, cursor shown; once, whoever calls first.
fn restore_terminal() {
    if TERMINAL_TAKEN.swap(false, AtomicOrdering::SeqCst) {
        let _ = crossterm::terminal::disable_raw_mode();
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::LeaveAlternateScreen,
            crossterm::cursor::Show
        );
    }
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Before the message, or it would be printed on the alternate screen and lost.
            restore_terminal();
            previous(info);
        }));
    });
}

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, AtomicOrdering::SeqCst);
}

/// A kill, a closed terminal or a SIGINT from another process ends the view through
/// the same path as `q`, so the terminal is restored.
pub fn stop_on_signals() {
    let handler = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, handler) };
    }
}

/// Whether one of the signals of [`stop_on_signals`] has arrived.
pub fn stop_requested() -> bool {
    STOP.load(AtomicOrdering::SeqCst)
}
