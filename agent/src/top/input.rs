//! Keys in: what each key asks of the view ([`action`], pure), and the terminal the
//! keys come from ([`Keyboard`], which also tells when that terminal has hung up).

use std::io::IsTerminal as _;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::state::{Command, SortKey};

/// What a key asks of the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing: a key without a meaning, or a release.
    Continue,
    /// Change the order, the filter or the scroll position.
    Apply(Command),
    Quit,
}

/// What one key asks; only presses count (terminals that report releases send both).
/// While the filter prompt is open (`prompt_open`), characters are typed into the
/// filter, Backspace deletes, Enter keeps the filter and Esc clears it; the keys
/// that type nothing still scroll, and Ctrl-C still quits.
pub fn action(key: KeyEvent, prompt_open: bool) -> Action {
    if key.kind != KeyEventKind::Press {
        return Action::Continue;
    }
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return match key.code {
            KeyCode::Char('c') => Action::Quit,
            _ => Action::Continue,
        };
    }
    if prompt_open {
        let command = match key.code {
            // Alt with a key is no text.
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::ALT) => {
                Command::FilterPush(c)
            }
            KeyCode::Backspace => Command::FilterPop,
            KeyCode::Enter => Command::FilterKeep,
            KeyCode::Esc => Command::FilterClear,
            KeyCode::Up => Command::Up,
            KeyCode::Down => Command::Down,
            KeyCode::PageUp => Command::PageUp,
            KeyCode::PageDown => Command::PageDown,
            KeyCode::Home => Command::First,
            KeyCode::End => Command::Last,
            _ => return Action::Continue,
        };
        return Action::Apply(command);
    }
    let command = match key.code {
        KeyCode::Char('q') | KeyCode::Esc => return Action::Quit,
        KeyCode::Char('/') => Command::FilterOpen,
        KeyCode::Char('p') => Command::SortBy(SortKey::Problems),
        KeyCode::Char('c') => Command::SortBy(SortKey::CeRatio),
        KeyCode::Char('n') => Command::SortBy(SortKey::CnpRate),
        KeyCode::Char('b') => Command::SortBy(SortKey::Bitrate),
        KeyCode::Char('r') => Command::Reverse,
        KeyCode::Char('o') => Command::ToggleQps,
        KeyCode::Up | KeyCode::Char('k') => Command::Up,
        KeyCode::Down | KeyCode::Char('j') => Command::Down,
        KeyCode::PageUp => Command::PageUp,
        KeyCode::PageDown => Command::PageDown,
        KeyCode::Home | KeyCode::Char('g') => Command::First,
        KeyCode::End | KeyCode::Char('G') => Command::Last,
        _ => return Action::Continue,
    };
    Action::Apply(command)
}

/// The terminal the keys come from, watched with poll(2) before crossterm reads it:
/// crossterm 0.29 loops forever on a terminal that hung up (its reads return 0), so
/// it is only asked while the terminal is still there.
pub struct Keyboard {
    /// `/dev/tty` when stdin is not the terminal (crossterm then reads it too).
    _tty: Option<std::fs::File>,
    fd: std::os::fd::RawFd,
}

impl Keyboard {
    pub fn open() -> std::io::Result<Keyboard> {
        use std::os::fd::AsRawFd as _;
        if std::io::stdin().is_terminal() {
            return Ok(Keyboard {
                _tty: None,
                fd: std::io::stdin().as_raw_fd(),
            });
        }
        let tty = std::fs::File::open("/dev/tty")?;
        let fd = tty.as_raw_fd();
        Ok(Keyboard {
            _tty: Some(tty),
            fd,
        })
    }

    /// Waits up to `timeout` for a key or a hang-up; true when the terminal hung up
    /// (its window closed, its tmux server killed: nobody is watching). A signal ends
    /// the wait early, so the caller sees a stop request at once.
    pub fn gone_after(&self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd, alive for the whole call.
        let ready = unsafe { libc::poll(&mut pfd, 1, millis) };
        ready > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(code: KeyCode) -> Action {
        action(KeyEvent::new(code, KeyModifiers::NONE), false)
    }

    /// A key pressed while the filter prompt is open.
    fn typed(code: KeyCode, modifiers: KeyModifiers) -> Action {
        action(KeyEvent::new(code, modifiers), true)
    }

    #[test]
    fn quit_keys() {
        assert_eq!(press(KeyCode::Char('q')), Action::Quit);
        assert_eq!(press(KeyCode::Esc), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(action(ctrl_c, false), Action::Quit);
        assert_eq!(press(KeyCode::Char('x')), Action::Continue);
        let mut release = KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE);
        release.kind = KeyEventKind::Release;
        assert_eq!(action(release, false), Action::Continue);
    }

    #[test]
    fn ctrl_c_is_not_c() {
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_ne!(action(ctrl_c, false), press(KeyCode::Char('c')));
        let ctrl_r = KeyEvent::new(KeyCode::Char('r'), KeyModifiers::CONTROL);
        assert_eq!(action(ctrl_r, false), Action::Continue);
    }

    #[test]
    fn every_documented_key_has_its_command() {
        use Command::*;
        for (code, command) in [
            (KeyCode::Char('p'), SortBy(SortKey::Problems)),
            (KeyCode::Char('c'), SortBy(SortKey::CeRatio)),
            (KeyCode::Char('n'), SortBy(SortKey::CnpRate)),
            (KeyCode::Char('b'), SortBy(SortKey::Bitrate)),
            (KeyCode::Char('r'), Reverse),
            (KeyCode::Up, Up),
            (KeyCode::Char('k'), Up),
            (KeyCode::Down, Down),
            (KeyCode::Char('j'), Down),
            (KeyCode::PageUp, PageUp),
            (KeyCode::PageDown, PageDown),
            (KeyCode::Home, First),
            (KeyCode::Char('g'), First),
            (KeyCode::End, Last),
            (KeyCode::Char('G'), Last),
            (KeyCode::Char('/'), FilterOpen),
            (KeyCode::Char('o'), ToggleQps),
        ] {
            assert_eq!(press(code), Action::Apply(command), "{code:?}");
        }
    }

    #[test]
    fn the_open_prompt_takes_text_and_enter_keeps_esc_clears() {
        use Command::*;
        let none = KeyModifiers::NONE;
        // The letters that are commands outside the prompt are text in it.
        for c in ['q', 'p', 'r', '/', 'G', '0', '.', ':'] {
            assert_eq!(typed(KeyCode::Char(c), none), Action::Apply(FilterPush(c)));
        }
        assert_eq!(
            typed(KeyCode::Char('A'), KeyModifiers::SHIFT),
            Action::Apply(FilterPush('A'))
        );
        assert_eq!(typed(KeyCode::Backspace, none), Action::Apply(FilterPop));
        assert_eq!(typed(KeyCode::Enter, none), Action::Apply(FilterKeep));
        assert_eq!(typed(KeyCode::Esc, none), Action::Apply(FilterClear));
        // Keys that type nothing still scroll; Ctrl-C still quits.
        assert_eq!(typed(KeyCode::Down, none), Action::Apply(Down));
        assert_eq!(typed(KeyCode::PageUp, none), Action::Apply(PageUp));
        assert_eq!(typed(KeyCode::End, none), Action::Apply(Last));
        assert_eq!(
            typed(KeyCode::Char('c'), KeyModifiers::CONTROL),
            Action::Quit
        );
        assert_eq!(
            typed(KeyCode::Char('x'), KeyModifiers::ALT),
            Action::Continue
        );
        assert_eq!(typed(KeyCode::Tab, none), Action::Continue);
        // Outside the prompt, Enter and Backspace mean nothing and Esc quits.
        assert_eq!(press(KeyCode::Enter), Action::Continue);
        assert_eq!(press(KeyCode::Backspace), Action::Continue);
        assert_eq!(press(KeyCode::Esc), Action::Quit);
    }
}
