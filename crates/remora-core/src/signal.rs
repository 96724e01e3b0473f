//! Linux signals by name and number, as container images and CRI name them: the stop signal a
//! container is stopped with (an image config's `StopSignal`, CRI's `ContainerConfig.stop_signal`).
//!
//! The names are those moby's `signal.ParseSignal` accepts on Linux (containerd parses stop
//! signals with it): the standard signals with their aliases (`SIGIOT`, `SIGCLD`, `SIGPOLL`)
//! and the real-time signals by offset (`SIGRTMIN+3`, `SIGRTMAX-1`), in any case, with or
//! without `SIG`; or a number. CRI's `Signal` enum (KEP-4960) names the same signals.

use std::fmt;

/// The first real-time signal as programs see it: glibc (and musl) keep the kernel's first two
/// (32 and 33) for their own threading, so `SIGRTMIN` is 34, as moby counts it too.
const SIGRTMIN: i32 = 34;
/// The last real-time signal (the kernel's `_NSIG - 1`).
const SIGRTMAX: i32 = 64;

/// Every signal name (with `SIG`) and its number. Where two names share a number, the first
/// listed is the one a number is named by (`6` is `SIGABRT`, not `SIGIOT`).
const NAMES: [(&str, i32); 65] = [
    ("SIGABRT", libc::SIGABRT),
    ("SIGALRM", libc::SIGALRM),
    ("SIGBUS", libc::SIGBUS),
    ("SIGCHLD", libc::SIGCHLD),
    // No `libc::SIGCLD`: it is SIGCHLD's old System V name.
    ("SIGCLD", libc::SIGCHLD),
    ("SIGCONT", libc::SIGCONT),
    ("SIGFPE", libc::SIGFPE),
    ("SIGHUP", libc::SIGHUP),
    ("SIGILL", libc::SIGILL),
    ("SIGINT", libc::SIGINT),
    ("SIGIO", libc::SIGIO),
    ("SIGIOT", libc::SIGIOT),
    ("SIGKILL", libc::SIGKILL),
    ("SIGPIPE", libc::SIGPIPE),
    ("SIGPOLL", libc::SIGPOLL),
    ("SIGPROF", libc::SIGPROF),
    ("SIGPWR", libc::SIGPWR),
    ("SIGQUIT", libc::SIGQUIT),
    ("SIGSEGV", libc::SIGSEGV),
    ("SIGSTKFLT", libc::SIGSTKFLT),
    ("SIGSTOP", libc::SIGSTOP),
    ("SIGSYS", libc::SIGSYS),
    ("SIGTERM", libc::SIGTERM),
    ("SIGTRAP", libc::SIGTRAP),
    ("SIGTSTP", libc::SIGTSTP),
    ("SIGTTIN", libc::SIGTTIN),
    ("SIGTTOU", libc::SIGTTOU),
    ("SIGURG", libc::SIGURG),
    ("SIGUSR1", libc::SIGUSR1),
    ("SIGUSR2", libc::SIGUSR2),
    ("SIGVTALRM", libc::SIGVTALRM),
    ("SIGWINCH", libc::SIGWINCH),
    ("SIGXCPU", libc::SIGXCPU),
    ("SIGXFSZ", libc::SIGXFSZ),
    ("SIGRTMIN", SIGRTMIN),
    ("SIGRTMIN+1", SIGRTMIN + 1),
    ("SIGRTMIN+2", SIGRTMIN + 2),
    ("SIGRTMIN+3", SIGRTMIN + 3),
    ("SIGRTMIN+4", SIGRTMIN + 4),
    ("SIGRTMIN+5", SIGRTMIN + 5),
    ("SIGRTMIN+6", SIGRTMIN + 6),
    ("SIGRTMIN+7", SIGRTMIN + 7),
    ("SIGRTMIN+8", SIGRTMIN + 8),
    ("SIGRTMIN+9", SIGRTMIN + 9),
    ("SIGRTMIN+10", SIGRTMIN + 10),
    ("SIGRTMIN+11", SIGRTMIN + 11),
    ("SIGRTMIN+12", SIGRTMIN + 12),
    ("SIGRTMIN+13", SIGRTMIN + 13),
    ("SIGRTMIN+14", SIGRTMIN + 14),
    ("SIGRTMIN+15", SIGRTMIN + 15),
    ("SIGRTMAX-14", SIGRTMAX - 14),
    ("SIGRTMAX-13", SIGRTMAX - 13),
    ("SIGRTMAX-12", SIGRTMAX - 12),
    ("SIGRTMAX-11", SIGRTMAX - 11),
    ("SIGRTMAX-10", SIGRTMAX - 10),
    ("SIGRTMAX-9", SIGRTMAX - 9),
    ("SIGRTMAX-8", SIGRTMAX - 8),
    ("SIGRTMAX-7", SIGRTMAX - 7),
    ("SIGRTMAX-6", SIGRTMAX - 6),
    ("SIGRTMAX-5", SIGRTMAX - 5),
    ("SIGRTMAX-4", SIGRTMAX - 4),
    ("SIGRTMAX-3", SIGRTMAX - 3),
    ("SIGRTMAX-2", SIGRTMAX - 2),
    ("SIGRTMAX-1", SIGRTMAX - 1),
    ("SIGRTMAX", SIGRTMAX),
];

/// A signal: its number, and its name as given (spelt as in [`NAMES`]) or, for one given by
/// number, the first name of that number. Only 32 and 33 have none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal {
    number: i32,
    name: Option<&'static str>,
}

impl Signal {
    /// SIGTERM, what a container is stopped with when nothing names another signal.
    pub const TERM: Signal = Signal {
        number: libc::SIGTERM,
        name: Some("SIGTERM"),
    };

    /// Parses a signal as an image's `StopSignal` gives it, as moby and containerd accept it: a
    /// name in any case, with or without `SIG` (`SIGQUIT`, `quit`, `SIGRTMIN+3`), or a number
    /// (`3`). Unlike moby, a number must be a Linux signal (1 to 64): `kill` refuses others.
    pub fn parse(s: &str) -> Option<Signal> {
        let s = s.trim();
        if let Ok(number) = s.parse::<i32>() {
            return Self::from_number(number);
        }
        let upper = s.to_ascii_uppercase();
        let full = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        NAMES
            .iter()
            .find(|(name, _)| *name == full)
            .map(|&(name, number)| Signal {
                number,
                name: Some(name),
            })
    }

    /// The signal numbered `number`, if Linux has one.
    pub fn from_number(number: i32) -> Option<Signal> {
        if !(1..=SIGRTMAX).contains(&number) {
            return None;
        }
        let name = NAMES
            .iter()
            .find(|(_, n)| *n == number)
            .map(|(name, _)| *name);
        Some(Signal { number, name })
    }

    /// Its number.
    pub fn number(&self) -> i32 {
        self.number
    }

    /// Its name with `SIG` (`SIGRTMIN+3`); `None` for 32 and 33, which have none.
    pub fn name(&self) -> Option<&'static str> {
        self.name
    }
}

/// The name, else the number: what [`Signal::parse`] reads back as the same signal.
impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name {
            Some(name) => f.write_str(name),
            None => write!(f, "{}", self.number),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number(s: &str) -> Option<i32> {
        Signal::parse(s).map(|s| s.number())
    }

    #[test]
    fn names_as_moby_accepts_them() {
        assert_eq!(number("SIGQUIT"), Some(libc::SIGQUIT));
        assert_eq!(number("QUIT"), Some(libc::SIGQUIT));
        assert_eq!(number("quit"), Some(libc::SIGQUIT));
        assert_eq!(number("SigQuit"), Some(libc::SIGQUIT));
        assert_eq!(number(" SIGTERM\n"), Some(libc::SIGTERM));
        assert_eq!(number("SIGRTMIN+3"), Some(37));
        assert_eq!(number("RTMIN+3"), Some(37));
        assert_eq!(number("sigrtmax-1"), Some(63));
        assert_eq!(number("SIGRTMIN"), Some(34));
        assert_eq!(number("SIGRTMAX"), Some(64));
        // Aliases keep the name given, for CRI's enum has them too.
        assert_eq!(Signal::parse("IOT").and_then(|s| s.name()), Some("SIGIOT"));
        assert_eq!(Signal::parse("cld").and_then(|s| s.name()), Some("SIGCLD"));
    }

    #[test]
    fn numbers_are_named_by_their_first_name() {
        let named = |s: &str| Signal::parse(s).and_then(|s| s.name());
        assert_eq!(number("3"), Some(3));
        assert_eq!(named("3"), Some("SIGQUIT"));
        assert_eq!(named("6"), Some("SIGABRT"));
        assert_eq!(named("17"), Some("SIGCHLD"));
        assert_eq!(named("29"), Some("SIGIO"));
        assert_eq!(named("37"), Some("SIGRTMIN+3"));
        assert_eq!(named("64"), Some("SIGRTMAX"));
        // glibc's own: real signals, no name.
        assert_eq!(number("32"), Some(32));
        assert_eq!(named("32"), None);
        assert_eq!(
            Signal::parse("33").map(|s| s.to_string()),
            Some("33".into())
        );
    }

    #[test]
    fn not_signals() {
        for s in [
            "",
            "SIG",
            "SIGBOGUS",
            "0",
            "-15",
            "65",
            "SIGRTMIN+16",
            "SIGRTMAX-15",
            "RTMIN+-1",
            "SIGTERM2",
            "15.0",
        ] {
            assert_eq!(Signal::parse(s), None, "{s:?}");
        }
    }

    /// Checked against the C library rather than against the table's own arithmetic: the
    /// standard signals are `libc` constants, the real-time ones glibc's (or musl's) own
    /// `SIGRTMIN`/`SIGRTMAX` at run time.
    #[test]
    fn real_time_signals_match_the_c_library() {
        assert_eq!(SIGRTMIN, libc::SIGRTMIN());
        assert_eq!(SIGRTMAX, libc::SIGRTMAX());
        for offset in 0..=15 {
            let plus = if offset == 0 {
                "SIGRTMIN".to_string()
            } else {
                format!("SIGRTMIN+{offset}")
            };
            assert_eq!(number(&plus), Some(libc::SIGRTMIN() + offset), "{plus}");
            let minus = if offset == 0 {
                "SIGRTMAX".to_string()
            } else {
                format!("SIGRTMAX-{offset}")
            };
            if offset <= 14 {
                assert_eq!(number(&minus), Some(libc::SIGRTMAX() - offset), "{minus}");
            }
        }
    }

    #[test]
    fn every_name_reads_back_as_itself() {
        for (name, n) in NAMES {
            let s = Signal::parse(name).expect(name);
            assert_eq!((s.name(), s.number()), (Some(name), n));
            assert_eq!(Signal::parse(&s.to_string()), Some(s));
        }
        // Every Linux signal number is parsed, and all but glibc's two are named.
        for n in 1..=64 {
            let s = Signal::from_number(n).expect("a Linux signal");
            assert_eq!(s.name().is_none(), n == 32 || n == 33, "{n}");
        }
    }
}
