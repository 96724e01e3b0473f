//! CRI's `Signal` (KEP-4960, `ContainerConfig.stop_signal` and `ContainerStatus.stop_signal`)
//! ↔ [`Signal`]. containerd 2.3 derives the signal's name from the enum value's proto name
//! (`SIGRTMINPLUS3` → `SIGRTMIN+3`); remora lists them, so that a renamed value (cri-api
//! v0.37 prefixed them all with `SIGNAL_`) cannot change what a container is stopped with.

use super::{unknown_enum, ConvertError};
use crate::cri::v1;
use crate::signal::Signal;

/// Every CRI signal but `SIGNAL_RUNTIME_DEFAULT`, with its name as [`Signal`] spells it; in the
/// proto's order.
const SIGNALS: [(v1::Signal, &str); 65] = [
    (v1::Signal::Sigabrt, "SIGABRT"),
    (v1::Signal::Sigalrm, "SIGALRM"),
    (v1::Signal::Sigbus, "SIGBUS"),
    (v1::Signal::Sigchld, "SIGCHLD"),
    (v1::Signal::Sigcld, "SIGCLD"),
    (v1::Signal::Sigcont, "SIGCONT"),
    (v1::Signal::Sigfpe, "SIGFPE"),
    (v1::Signal::Sighup, "SIGHUP"),
    (v1::Signal::Sigill, "SIGILL"),
    (v1::Signal::Sigint, "SIGINT"),
    (v1::Signal::Sigio, "SIGIO"),
    (v1::Signal::Sigiot, "SIGIOT"),
    (v1::Signal::Sigkill, "SIGKILL"),
    (v1::Signal::Sigpipe, "SIGPIPE"),
    (v1::Signal::Sigpoll, "SIGPOLL"),
    (v1::Signal::Sigprof, "SIGPROF"),
    (v1::Signal::Sigpwr, "SIGPWR"),
    (v1::Signal::Sigquit, "SIGQUIT"),
    (v1::Signal::Sigsegv, "SIGSEGV"),
    (v1::Signal::Sigstkflt, "SIGSTKFLT"),
    (v1::Signal::Sigstop, "SIGSTOP"),
    (v1::Signal::Sigsys, "SIGSYS"),
    (v1::Signal::Sigterm, "SIGTERM"),
    (v1::Signal::Sigtrap, "SIGTRAP"),
    (v1::Signal::Sigtstp, "SIGTSTP"),
    (v1::Signal::Sigttin, "SIGTTIN"),
    (v1::Signal::Sigttou, "SIGTTOU"),
    (v1::Signal::Sigurg, "SIGURG"),
    (v1::Signal::Sigusr1, "SIGUSR1"),
    (v1::Signal::Sigusr2, "SIGUSR2"),
    (v1::Signal::Sigvtalrm, "SIGVTALRM"),
    (v1::Signal::Sigwinch, "SIGWINCH"),
    (v1::Signal::Sigxcpu, "SIGXCPU"),
    (v1::Signal::Sigxfsz, "SIGXFSZ"),
    (v1::Signal::Sigrtmin, "SIGRTMIN"),
    (v1::Signal::Sigrtminplus1, "SIGRTMIN+1"),
    (v1::Signal::Sigrtminplus2, "SIGRTMIN+2"),
    (v1::Signal::Sigrtminplus3, "SIGRTMIN+3"),
    (v1::Signal::Sigrtminplus4, "SIGRTMIN+4"),
    (v1::Signal::Sigrtminplus5, "SIGRTMIN+5"),
    (v1::Signal::Sigrtminplus6, "SIGRTMIN+6"),
    (v1::Signal::Sigrtminplus7, "SIGRTMIN+7"),
    (v1::Signal::Sigrtminplus8, "SIGRTMIN+8"),
    (v1::Signal::Sigrtminplus9, "SIGRTMIN+9"),
    (v1::Signal::Sigrtminplus10, "SIGRTMIN+10"),
    (v1::Signal::Sigrtminplus11, "SIGRTMIN+11"),
    (v1::Signal::Sigrtminplus12, "SIGRTMIN+12"),
    (v1::Signal::Sigrtminplus13, "SIGRTMIN+13"),
    (v1::Signal::Sigrtminplus14, "SIGRTMIN+14"),
    (v1::Signal::Sigrtminplus15, "SIGRTMIN+15"),
    (v1::Signal::Sigrtmaxminus14, "SIGRTMAX-14"),
    (v1::Signal::Sigrtmaxminus13, "SIGRTMAX-13"),
    (v1::Signal::Sigrtmaxminus12, "SIGRTMAX-12"),
    (v1::Signal::Sigrtmaxminus11, "SIGRTMAX-11"),
    (v1::Signal::Sigrtmaxminus10, "SIGRTMAX-10"),
    (v1::Signal::Sigrtmaxminus9, "SIGRTMAX-9"),
    (v1::Signal::Sigrtmaxminus8, "SIGRTMAX-8"),
    (v1::Signal::Sigrtmaxminus7, "SIGRTMAX-7"),
    (v1::Signal::Sigrtmaxminus6, "SIGRTMAX-6"),
    (v1::Signal::Sigrtmaxminus5, "SIGRTMAX-5"),
    (v1::Signal::Sigrtmaxminus4, "SIGRTMAX-4"),
    (v1::Signal::Sigrtmaxminus3, "SIGRTMAX-3"),
    (v1::Signal::Sigrtmaxminus2, "SIGRTMAX-2"),
    (v1::Signal::Sigrtmaxminus1, "SIGRTMAX-1"),
    (v1::Signal::Sigrtmax, "SIGRTMAX"),
];

/// A configured stop signal (`value` of the CRI field `field`): `None` for
/// `SIGNAL_RUNTIME_DEFAULT` (the image's, else SIGTERM), a number the proto does not define
/// refused.
pub fn stop_signal(value: i32, field: &str) -> Result<Option<Signal>, ConvertError> {
    let cri = v1::Signal::try_from(value).map_err(|_| unknown_enum(field, value))?;
    if cri == v1::Signal::RuntimeDefault {
        return Ok(None);
    }
    // Every other value is in the table and its name parses (the tests check both), so the
    // error is only for a proto newer than the table.
    SIGNALS
        .iter()
        .find(|(s, _)| *s == cri)
        .and_then(|(_, name)| Signal::parse(name))
        .map(Some)
        .ok_or_else(|| unknown_enum(field, value))
}

/// A stop signal as CRI reports it: by its name, so an alias stays itself (`SIGIOT`, not
/// `SIGABRT`). 32 and 33 have no name and no CRI value: `SIGNAL_RUNTIME_DEFAULT`.
pub fn signal_to_cri(signal: Signal) -> v1::Signal {
    signal
        .name()
        .and_then(|name| SIGNALS.iter().find(|(_, n)| *n == name))
        .map_or(v1::Signal::RuntimeDefault, |(s, _)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value the generated enum has: the numbers from 0 up to the first it refuses.
    fn every_cri_signal() -> Vec<v1::Signal> {
        (0..).map_while(|n| v1::Signal::try_from(n).ok()).collect()
    }

    #[test]
    fn the_table_names_every_cri_signal_as_containerd_does() {
        let all = every_cri_signal();
        assert_eq!(all.len(), 66, "SIGNAL_RUNTIME_DEFAULT and 65 signals");
        for cri in all.into_iter().skip(1) {
            // containerd's `convertFromCRISignal`, on the proto name without cri-api v0.37's
            // prefix.
            let proto = cri.as_str_name();
            let expected = proto
                .strip_prefix("SIGNAL_")
                .unwrap_or(proto)
                .replacen("PLUS", "+", 1)
                .replacen("MINUS", "-", 1);
            let signal = stop_signal(cri as i32, "config.stop_signal")
                .expect("a known value")
                .expect("a signal");
            assert_eq!(signal.name(), Some(expected.as_str()), "{proto}");
            assert_eq!(signal_to_cri(signal), cri, "{proto} reads back as itself");
        }
    }

    #[test]
    fn cri_signals_are_linux_signal_numbers() {
        let number = |cri: v1::Signal| {
            stop_signal(cri as i32, "f")
                .ok()
                .flatten()
                .map(|s| s.number())
        };
        assert_eq!(number(v1::Signal::Sigquit), Some(libc::SIGQUIT));
        assert_eq!(number(v1::Signal::Sigiot), Some(libc::SIGABRT));
        assert_eq!(number(v1::Signal::Sigcld), Some(libc::SIGCHLD));
        assert_eq!(number(v1::Signal::Sigpoll), Some(libc::SIGIO));
        assert_eq!(number(v1::Signal::Sigstkflt), Some(16));
        assert_eq!(number(v1::Signal::Sigrtmin), Some(34));
        assert_eq!(number(v1::Signal::Sigrtminplus15), Some(49));
        assert_eq!(number(v1::Signal::Sigrtmaxminus14), Some(50));
        assert_eq!(number(v1::Signal::Sigrtmax), Some(64));
        // Every number a CRI signal names is distinct but for the three aliases.
        let mut numbers: Vec<i32> = every_cri_signal().into_iter().filter_map(number).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), 62, "64 Linux signals but glibc's 32 and 33");
    }

    #[test]
    fn runtime_default_is_no_signal_and_unknown_values_are_refused() {
        assert_eq!(stop_signal(0, "config.stop_signal"), Ok(None));
        for value in [66, -1, i32::MAX] {
            assert_eq!(
                stop_signal(value, "config.stop_signal"),
                Err(ConvertError::UnknownEnum {
                    field: "config.stop_signal".into(),
                    value
                })
            );
        }
    }

    #[test]
    fn image_stop_signals_as_cri_reports_them() {
        let cri = |s: &str| signal_to_cri(Signal::parse(s).expect(s));
        assert_eq!(cri("SIGQUIT"), v1::Signal::Sigquit);
        assert_eq!(cri("QUIT"), v1::Signal::Sigquit);
        assert_eq!(cri("3"), v1::Signal::Sigquit);
        assert_eq!(cri("SIGRTMIN+3"), v1::Signal::Sigrtminplus3);
        assert_eq!(cri("rtmax-1"), v1::Signal::Sigrtmaxminus1);
        assert_eq!(cri("IOT"), v1::Signal::Sigiot);
        assert_eq!(cri("6"), v1::Signal::Sigabrt);
        assert_eq!(cri("SIGTERM"), v1::Signal::Sigterm);
        // glibc's two have no CRI value.
        assert_eq!(cri("32"), v1::Signal::RuntimeDefault);
    }
}
