//! The process's arguments and environment, by the CRI/Kubernetes rules.

use super::SpecError;

/// `PATH` used when neither the image nor the config sets one (containerd's and Docker's).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The process arguments of a container.
///
/// Kubernetes semantics (also Docker's): `command` replaces the image entrypoint *and*
/// drops the image cmd; `args` replace the image cmd; with neither, entrypoint + cmd.
/// An image entrypoint of exactly `[""]` means "no entrypoint" (Docker's way of resetting
/// it). Nothing left to run is an error rather than an empty `args` that runc rejects later.
pub fn process_args(
    cfg_command: &[String],
    cfg_args: &[String],
    image_entrypoint: &[String],
    image_cmd: &[String],
) -> Result<Vec<String>, SpecError> {
    let (command, args): (&[String], &[String]) = if cfg_command.is_empty() {
        let entrypoint = if image_entrypoint.len() == 1 && image_entrypoint[0].is_empty() {
            &[][..]
        } else {
            image_entrypoint
        };
        let args = if cfg_args.is_empty() {
            image_cmd
        } else {
            cfg_args
        };
        (entrypoint, args)
    } else {
        (cfg_command, cfg_args)
    };
    let out: Vec<String> = command.iter().chain(args).cloned().collect();
    if out.is_empty() {
        return Err(SpecError::NoCommand);
    }
    Ok(out)
}

/// The process environment: default `PATH`, then `HOSTNAME`, then the image's env, then
/// the config's env.
///
/// A later entry with the same key replaces the earlier one *in place* (the key keeps its
/// first position), as containerd's `WithEnv` does, so the order is stable and the config
/// wins. An image entry without `=` removes the variable (Docker's "unset" form). Config
/// env entries always have a value (CRI `KeyValue`).
pub fn merge_env(
    image_env: &[String],
    config_env: &[(String, String)],
    hostname: &str,
) -> Vec<String> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
        ("HOSTNAME".to_owned(), hostname.to_owned()),
    ];
    for entry in image_env {
        match entry.split_once('=') {
            Some((k, v)) => set_env(&mut env, k, v),
            None => env.retain(|(k, _)| k != entry),
        }
    }
    for (k, v) in config_env {
        set_env(&mut env, k, v);
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The environment of a sandbox's pause process: default `PATH`, then the image's env.
pub fn sandbox_env(image_env: &[String]) -> Vec<String> {
    let mut env = vec![("PATH".to_owned(), DEFAULT_PATH.to_owned())];
    for entry in image_env {
        match entry.split_once('=') {
            Some((k, v)) => set_env(&mut env, k, v),
            None => env.retain(|(k, _)| k != entry),
        }
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn set_env(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    match env.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value.to_owned(),
        None => env.push((key.to_owned(), value.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn image_entrypoint_and_cmd_when_config_is_empty() {
        let got = process_args(&[], &[], &v(&["/ep"]), &v(&["a", "b"])).unwrap();
        assert_eq!(got, v(&["/ep", "a", "b"]));
    }

    #[test]
    fn command_overrides_entrypoint_and_drops_image_cmd() {
        let got = process_args(&v(&["/bin/sh"]), &[], &v(&["/ep"]), &v(&["a"])).unwrap();
        assert_eq!(got, v(&["/bin/sh"]));
        let got =
            process_args(&v(&["/bin/sh"]), &v(&["-c", "x"]), &v(&["/ep"]), &v(&["a"])).unwrap();
        assert_eq!(got, v(&["/bin/sh", "-c", "x"]));
    }

    #[test]
    fn args_override_cmd_and_keep_entrypoint() {
        let got = process_args(&[], &v(&["x"]), &v(&["/ep"]), &v(&["a"])).unwrap();
        assert_eq!(got, v(&["/ep", "x"]));
        let got = process_args(&[], &v(&["/bin/true"]), &[], &v(&["a"])).unwrap();
        assert_eq!(got, v(&["/bin/true"]));
    }

    #[test]
    fn empty_string_entrypoint_means_none() {
        let got = process_args(&[], &[], &v(&[""]), &v(&["/cmd"])).unwrap();
        assert_eq!(got, v(&["/cmd"]));
    }

    #[test]
    fn nothing_to_run_is_an_error() {
        assert!(matches!(
            process_args(&[], &[], &[], &[]),
            Err(SpecError::NoCommand)
        ));
        assert!(matches!(
            process_args(&[], &[], &v(&[""]), &[]),
            Err(SpecError::NoCommand)
        ));
    }

    #[test]
    fn env_order_and_overrides() {
        let image = v(&["A=1", "PATH=/img", "B=2"]);
        let config = vec![
            ("B".to_owned(), "3".to_owned()),
            ("C".to_owned(), "4".to_owned()),
            ("HOSTNAME".to_owned(), "mine".to_owned()),
        ];
        let got = merge_env(&image, &config, "pod-host");
        assert_eq!(got, v(&["PATH=/img", "HOSTNAME=mine", "A=1", "B=3", "C=4"]));
    }

    #[test]
    fn env_defaults_path_and_hostname() {
        let got = merge_env(&[], &[], "h");
        assert_eq!(
            got,
            vec![format!("PATH={DEFAULT_PATH}"), "HOSTNAME=h".to_owned()]
        );
    }

    #[test]
    fn image_entry_without_value_unsets() {
        let got = merge_env(&v(&["A=1", "A"]), &[], "h");
        assert!(!got.iter().any(|e| e.starts_with("A=")));
    }

    #[test]
    fn values_may_contain_equals() {
        let got = merge_env(&v(&["A=x=y"]), &[], "h");
        assert!(got.contains(&"A=x=y".to_owned()));
    }

    #[test]
    fn sandbox_env_is_path_then_image() {
        let got = sandbox_env(&v(&["X=1"]));
        assert_eq!(got, vec![format!("PATH={DEFAULT_PATH}"), "X=1".to_owned()]);
    }
}
