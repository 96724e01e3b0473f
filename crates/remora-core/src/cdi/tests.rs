use std::path::Path;

use oci_spec::runtime::{
    LinuxBuilder, LinuxDeviceType, LinuxIdMappingBuilder, LinuxNamespaceBuilder,
    LinuxNamespaceType, MountBuilder, ProcessBuilder, Spec, SpecBuilder, UserBuilder,
};

use super::apply::NodeInfo;
use super::parse::{self, qualified_name};
use super::*;

fn quiet() -> Logger {
    Logger::root(slog::Discard, slog::o!())
}

fn req(name: &str) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        field: format!("config.cdi_devices[0].name /* {name} */"),
    }
}

const NULL_JSON: &str = r#"{
  "cdiVersion": "0.6.0",
  "kind": "vendor.example/dev",
  "containerEdits": {"env": ["CDI_SPEC=1"]},
  "devices": [
    {"name": "null", "containerEdits": {
      "env": ["CDI_TEST=1"],
      "deviceNodes": [{"path": "/dev/cdi-null", "hostPath": "/dev/null", "permissions": "rw"}],
      "mounts": [{"hostPath": "/etc/hostname", "containerPath": "/etc/cdi-hostname",
                  "options": ["ro", "bind"]}]
    }},
    {"name": "zero", "containerEdits": {"env": ["ZERO=1"]}}
  ]
}"#;

const YAML: &str = "
cdiVersion: v1.1.0
kind: nvidia.com/gpu
devices:
  - name: '0'
    containerEdits:
      env: [GPU=0]
      deviceNodes:
        - path: /dev/nvidia0
          type: c
          major: 195
          minor: 0
      hooks:
        - hookName: createContainer
          path: /usr/bin/nvidia-ctk
          args: [nvidia-ctk, hook, update-ldcache]
          timeout: 5
      additionalGids: [0, 44, 44]
      netDevices:
        - hostInterfaceName: eth9
          name: net0
containerEdits:
  intelRdt:
    closID: gpu
    enableMonitoring: true
";

#[test]
fn json_and_yaml_specs_parse() {
    let s = parse::parse(NULL_JSON, true).unwrap();
    assert_eq!(s.kind, "vendor.example/dev");
    assert_eq!(s.devices.len(), 2);
    assert_eq!(
        s.devices[0].container_edits.device_nodes[0].host_path,
        "/dev/null"
    );
    let y = parse::parse(YAML, false).unwrap();
    assert_eq!(y.devices[0].name, "0");
    let e = &y.devices[0].container_edits;
    assert_eq!(
        (e.device_nodes[0].major, e.device_nodes[0].typ.as_str()),
        (195, "c")
    );
    assert_eq!(e.hooks[0].timeout, Some(5));
    assert_eq!(e.additional_gids, [0, 44, 44]);
    assert!(
        y.container_edits
            .intel_rdt
            .as_ref()
            .unwrap()
            .enable_monitoring
    );
    // JSON is YAML too (CDI reads both with one decoder).
    assert_eq!(parse::parse(NULL_JSON, false).unwrap(), s);
}

#[test]
fn versions_are_checked_against_the_fields_used() {
    for v in ["0.3.0", "v0.5.0", "0.8.0", "1.0.0", "1.1.0"] {
        let text = format!(
            r#"{{"cdiVersion":"{v}","kind":"a.com/b","devices":[{{"name":"x","containerEdits":{{"env":["A=1"]}}}}]}}"#
        );
        assert!(parse::parse(&text, true).is_ok(), "{v}");
    }
    // 0.1.0 and 0.2.0 are known but below the earliest supported (0.3.0), as in specs-go.
    for (v, why) in [
        ("1.2.0", "unknown cdiVersion"),
        ("", "unknown cdiVersion"),
        ("0.9.0", "unknown"),
        ("0.1.0", "at least 0.3.0"),
        ("0.2.0", "at least 0.3.0"),
    ] {
        let text = format!(
            r#"{{"cdiVersion":"{v}","kind":"a.com/b","devices":[{{"name":"x","containerEdits":{{"env":["A=1"]}}}}]}}"#
        );
        let err = parse::parse(&text, true).unwrap_err();
        assert!(err.contains(why), "{v}: {err}");
    }
    // hostPath needs 0.5.0, annotations 0.6.0, additionalGids 0.7.0, netDevices 1.1.0.
    let too_old = [
        (
            r#""deviceNodes":[{"path":"/dev/x","hostPath":"/dev/null"}]"#,
            "0.4.0",
            "0.5.0",
        ),
        (
            r#""mounts":[{"hostPath":"/a","containerPath":"/b","type":"bind"}]"#,
            "0.3.0",
            "0.4.0",
        ),
        (r#""additionalGids":[5]"#, "0.6.0", "0.7.0"),
        (
            r#""netDevices":[{"hostInterfaceName":"a","name":"b"}]"#,
            "1.0.0",
            "1.1.0",
        ),
    ];
    for (edit, old, need) in too_old {
        let text = format!(
            r#"{{"cdiVersion":"{old}","kind":"a.com/b","devices":[{{"name":"x","containerEdits":{{{edit}}}}}]}}"#
        );
        let err = parse::parse(&text, true).unwrap_err();
        assert!(err.contains(&format!("at least {need}")), "{edit}: {err}");
        let ok = text.replace(old, need);
        assert!(parse::parse(&ok, true).is_ok(), "{ok}");
    }
    // A device name starting with a digit needs 0.5.0; a dotted class 0.6.0.
    let digit = r#"{"cdiVersion":"0.4.0","kind":"a.com/b","devices":[{"name":"0","containerEdits":{"env":["A=1"]}}]}"#;
    assert!(parse::parse(digit, true).unwrap_err().contains("0.5.0"));
    let dotted = r#"{"cdiVersion":"0.5.0","kind":"a.com/b.c","devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}"#;
    assert!(parse::parse(dotted, true).unwrap_err().contains("0.6.0"));
}

#[test]
fn invalid_specs_are_refused_with_a_reason() {
    let base = |kind: &str, devices: &str| {
        format!(r#"{{"cdiVersion":"1.1.0","kind":"{kind}","devices":[{devices}]}}"#)
    };
    let dev =
        |name: &str, edits: &str| format!(r#"{{"name":"{name}","containerEdits":{{{edits}}}}}"#);
    let env = r#""env":["A=1"]"#;
    let cases = [
        (base("vendor.com", &dev("x", env)), "invalid kind"),
        (base("/class", &dev("x", env)), "invalid kind"),
        (base("1vendor.com/c", &dev("x", env)), "start with a letter"),
        (
            base("vendor.com/c-", &dev("x", env)),
            "end with a letter or digit",
        ),
        (base("vendor.com/c", ""), "no devices"),
        (base("vendor.com/c", &dev("-x", env)), "device \"-x\""),
        (base("vendor.com/c", &dev("a b", env)), "device \"a b\""),
        (
            base(
                "vendor.com/c",
                &format!("{},{}", dev("x", env), dev("x", env)),
            ),
            "defined twice",
        ),
        (base("vendor.com/c", &dev("x", "")), "no container edits"),
        (
            base("vendor.com/c", &dev("x", r#""env":["=1"]"#)),
            "environment variable",
        ),
        (
            base("vendor.com/c", &dev("x", r#""env":["NOEQ"]"#)),
            "environment variable",
        ),
        (
            base(
                "vendor.com/c",
                &dev("x", r#""deviceNodes":[{"path":"dev/x"}]"#),
            ),
            "absolute",
        ),
        (
            base(
                "vendor.com/c",
                &dev("x", r#""deviceNodes":[{"path":"/dev/x","type":"z"}]"#),
            ),
            "invalid type",
        ),
        (
            base(
                "vendor.com/c",
                &dev("x", r#""deviceNodes":[{"path":"/dev/x","major":-1}]"#),
            ),
            "negative",
        ),
        (
            base(
                "vendor.com/c",
                &dev(
                    "x",
                    r#""deviceNodes":[{"path":"/dev/x","permissions":"rx"}]"#,
                ),
            ),
            "permissions",
        ),
        (
            base(
                "vendor.com/c",
                &dev(
                    "x",
                    r#""hooks":[{"hookName":"prestartt","path":"/bin/true"}]"#,
                ),
            ),
            "hook name",
        ),
        (
            base(
                "vendor.com/c",
                &dev("x", r#""hooks":[{"hookName":"poststop","path":"true"}]"#),
            ),
            "absolute",
        ),
        (
            base(
                "vendor.com/c",
                &dev(
                    "x",
                    r#""hooks":[{"hookName":"poststop","path":"/t","timeout":0}]"#,
                ),
            ),
            "timeout",
        ),
        (
            base(
                "vendor.com/c",
                &dev("x", r#""mounts":[{"hostPath":"","containerPath":"/a"}]"#),
            ),
            "empty hostPath",
        ),
        (
            base(
                "vendor.com/c",
                &dev("x", r#""mounts":[{"hostPath":"/a","containerPath":"a"}]"#),
            ),
            "absolute",
        ),
        (
            base("vendor.com/c", &dev("x", r#""intelRdt":{"closID":"a/b"}"#)),
            "closID",
        ),
        (
            base(
                "vendor.com/c",
                &dev(
                    "x",
                    r#""netDevices":[{"hostInterfaceName":"a","name":"b"},{"hostInterfaceName":"a","name":"c"}]"#,
                ),
            ),
            "duplicate",
        ),
        (
            base(
                "vendor.com/c",
                &dev("x", r#""env":["A=1"],"unknownField":1"#),
            ),
            "unknown",
        ),
    ];
    for (text, why) in cases {
        let err = parse::parse(&text, true).expect_err(&text);
        assert!(err.contains(why), "{text}: {err}");
    }
    assert!(parse::parse("cdiVersion: [", false).is_err());
    assert!(parse::parse("", false).is_err());
}

#[test]
fn qualified_names() {
    for ok in [
        "vendor.com/class=name",
        "nvidia.com/gpu=0",
        "a/b=c",
        "v.example/c_1.x=dev:1-2",
    ] {
        assert!(qualified_name(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        "gpu0",
        "/dev/null",
        "vendor.com/class",
        "vendor.com/class=",
        "=x",
        "vendor.com=x",
        "/class=x",
        "vendor.com/=x",
        "vendor.com/class=-x",
        "vendor.com/class=x y",
        "ven dor/class=x",
        "vendor.com/cl/ass=x",
        "vendor.com/class=x,y",
    ] {
        assert!(qualified_name(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        qualified_name("vendor.com/class=name").unwrap(),
        ("vendor.com/class", "name")
    );
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), text).unwrap();
}

fn env_of(edits: &[ContainerEdits]) -> Vec<String> {
    edits.iter().flat_map(|e| e.env.clone()).collect()
}

fn one(kind: &str, name: &str, env: &str) -> String {
    format!(
        r#"{{"cdiVersion":"0.3.0","kind":"{kind}","devices":[{{"name":"{name}","containerEdits":{{"env":["{env}"]}}}}]}}"#
    )
}

#[test]
fn registry_resolves_in_request_order_with_spec_edits_once() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "null.json", NULL_JSON);
    let r = Registry::new(true, vec![tmp.path().into()], quiet());
    let edits = r
        .resolve(&[
            req("vendor.example/dev=zero"),
            req("vendor.example/dev=null"),
        ])
        .unwrap();
    assert_eq!(env_of(&edits), ["CDI_SPEC=1", "ZERO=1", "CDI_TEST=1"]);
    assert!(r.resolve(&[]).unwrap().is_empty());
}

#[test]
fn unknown_ambiguous_and_disabled_are_errors_naming_the_device() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.json", &one("v.com/c", "x", "A=1"));
    write(tmp.path(), "b.yaml", &one("v.com/c", "x", "B=1"));
    write(tmp.path(), "c.json", &one("v.com/c", "y", "C=1"));
    let r = Registry::new(true, vec![tmp.path().into()], quiet());
    let mut unknown = req("v.com/c=nope");
    unknown.field = "config.cdi_devices[3].name".into();
    let err = r.resolve(&[req("v.com/c=y"), unknown]).unwrap_err();
    assert!(matches!(err, CdiError::Unresolvable { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("config.cdi_devices[3].name") && msg.contains("v.com/c=nope"),
        "{msg}"
    );
    let err = r.resolve(&[req("v.com/c=x")]).unwrap_err();
    assert!(matches!(err, CdiError::Ambiguous { .. }), "{err}");
    assert!(err.to_string().contains("a.json") && err.to_string().contains("b.yaml"));
    let off = Registry::new(false, vec![tmp.path().into()], quiet());
    let err = off.resolve(&[req("v.com/c=y")]).unwrap_err();
    assert!(matches!(err, CdiError::Disabled { .. }));
    assert!(err.to_string().contains("v.com/c=y"));
}

#[test]
fn later_dirs_override_earlier_ones_and_bad_files_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let (low, high) = (tmp.path().join("etc"), tmp.path().join("run"));
    write(&low, "x.json", &one("v.com/c", "x", "FROM=etc"));
    write(&low, "y.json", &one("v.com/c", "y", "FROM=etc"));
    write(&high, "x.yaml", &one("v.com/c", "x", "FROM=run"));
    // Skipped, each without stopping the others: bad JSON, an invalid spec, a non-spec
    // extension, a directory, too large.
    write(&high, "broken.json", "{");
    write(&high, "invalid.json", &one("v.com/c", "-bad", "A=1"));
    write(&high, "other.txt", &one("v.com/c", "z", "A=1"));
    write(&high, "other.yml", &one("v.com/c", "z", "A=1"));
    std::fs::create_dir_all(high.join("dir.json")).unwrap();
    let big = format!(
        "{}\n{}",
        one("v.com/c", "big", "A=1"),
        " ".repeat(MAX_SPEC_BYTES as usize)
    );
    write(&high, "big.json", &big);
    let r = Registry::new(
        true,
        vec![low.clone(), high.clone(), tmp.path().join("missing")],
        quiet(),
    );
    assert_eq!(
        env_of(&r.resolve(&[req("v.com/c=x")]).unwrap()),
        ["FROM=run"]
    );
    assert_eq!(
        env_of(&r.resolve(&[req("v.com/c=y")]).unwrap()),
        ["FROM=etc"]
    );
    for missing in ["v.com/c=z", "v.com/c=big", "v.com/c=-bad"] {
        assert!(r.resolve(&[req(missing)]).is_err(), "{missing}");
    }
}

#[test]
fn changed_files_are_reread() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.json", &one("v.com/c", "x", "V=1"));
    let r = Registry::new(true, vec![tmp.path().into()], quiet());
    assert_eq!(env_of(&r.resolve(&[req("v.com/c=x")]).unwrap()), ["V=1"]);
    // Same size, new content: the inode (write via rename) tells.
    write(tmp.path(), "a.json.tmp", &one("v.com/c", "x", "V=2"));
    std::fs::rename(tmp.path().join("a.json.tmp"), tmp.path().join("a.json")).unwrap();
    assert_eq!(env_of(&r.resolve(&[req("v.com/c=x")]).unwrap()), ["V=2"]);
    // In place, another size.
    write(tmp.path(), "a.json", &one("v.com/c", "x", "V=three"));
    assert_eq!(
        env_of(&r.resolve(&[req("v.com/c=x")]).unwrap()),
        ["V=three"]
    );
    // A new file, then the file removed.
    write(tmp.path(), "b.json", &one("v.com/c", "y", "Y=1"));
    assert!(r.resolve(&[req("v.com/c=y")]).is_ok());
    std::fs::remove_file(tmp.path().join("a.json")).unwrap();
    assert!(matches!(
        r.resolve(&[req("v.com/c=x")]),
        Err(CdiError::Unresolvable { .. })
    ));
}

fn base_spec(uid: u32, userns: bool) -> Spec {
    let process = ProcessBuilder::default()
        .env(vec!["PATH=/bin".to_string(), "CDI_TEST=0".to_string()])
        .user(UserBuilder::default().uid(uid).gid(uid).build().unwrap())
        .build()
        .unwrap();
    let mut linux = LinuxBuilder::default();
    if userns {
        let map = LinuxIdMappingBuilder::default()
            .host_id(100000u32)
            .container_id(0u32)
            .size(65536u32)
            .build()
            .unwrap();
        linux = linux
            .uid_mappings(vec![map])
            .gid_mappings(vec![map])
            .namespaces(vec![LinuxNamespaceBuilder::default()
                .typ(LinuxNamespaceType::User)
                .build()
                .unwrap()]);
    }
    SpecBuilder::default()
        .process(process)
        .linux(linux.build().unwrap())
        .mounts(vec![
            MountBuilder::default()
                .destination("/proc")
                .typ("proc")
                .source("proc")
                .build()
                .unwrap(),
            MountBuilder::default()
                .destination("/etc/cdi-hostname/sub/deeper")
                .typ("tmpfs")
                .source("tmpfs")
                .build()
                .unwrap(),
            MountBuilder::default()
                .destination("/etc/cdi-hostname")
                .typ("tmpfs")
                .source("tmpfs")
                .build()
                .unwrap(),
        ])
        .build()
        .unwrap()
}

fn fake_node(path: &Path) -> std::io::Result<NodeInfo> {
    match path.to_str() {
        Some("/dev/null") => Ok(NodeInfo {
            typ: 'c',
            major: 1,
            minor: 3,
            mode: 0o666,
        }),
        Some("/dev/sda") => Ok(NodeInfo {
            typ: 'b',
            major: 8,
            minor: 0,
            mode: 0o660,
        }),
        _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
    }
}

#[test]
fn edits_apply_to_the_oci_spec() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "null.json", NULL_JSON);
    write(tmp.path(), "gpu.yaml", YAML);
    let r = Registry::new(true, vec![tmp.path().into()], quiet());
    let edits = r
        .resolve(&[req("vendor.example/dev=null"), req("nvidia.com/gpu=0")])
        .unwrap();
    let mut spec = base_spec(1000, false);
    apply(&mut spec, &edits, &fake_node).unwrap();

    let process = spec.process().as_ref().unwrap();
    assert_eq!(
        process.env().as_deref().unwrap(),
        ["PATH=/bin", "CDI_TEST=1", "CDI_SPEC=1", "GPU=0"]
    );
    assert_eq!(process.user().additional_gids().as_deref(), Some(&[44][..]));

    let linux = spec.linux().as_ref().unwrap();
    let devs = linux.devices().as_ref().unwrap();
    assert_eq!(devs.len(), 2);
    let null = &devs[0];
    assert_eq!(null.path(), Path::new("/dev/cdi-null"));
    assert_eq!(
        (null.typ(), null.major(), null.minor()),
        (LinuxDeviceType::C, 1, 3)
    );
    assert_eq!(null.file_mode(), Some(0o666));
    // Owner defaults to the (non-root) process user.
    assert_eq!((null.uid(), null.gid()), (Some(1000), Some(1000)));
    // Given type and major: no stat needed (the host has no /dev/nvidia0 here).
    assert_eq!((devs[1].major(), devs[1].file_mode()), (195, None));
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .as_ref()
        .unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(
        (
            rules[0].allow(),
            rules[0].major(),
            rules[0].minor(),
            rules[0].access().as_deref()
        ),
        (true, Some(1), Some(3), Some("rw"))
    );
    assert_eq!(rules[1].access().as_deref(), Some("rwm"));
    assert_eq!(
        linux.net_devices().as_ref().unwrap()["eth9"]
            .name()
            .as_deref(),
        Some("net0")
    );
    let rdt = linux.intel_rdt().as_ref().unwrap();
    assert_eq!(rdt.clos_id().as_deref(), Some("gpu"));
    assert_eq!(rdt.enable_monitoring(), &Some(true));

    // The CDI mount replaces the one at the same destination; mounts sorted by depth.
    let mounts = spec.mounts().as_ref().unwrap();
    let dests: Vec<_> = mounts
        .iter()
        .map(|m| m.destination().display().to_string())
        .collect();
    assert_eq!(
        dests,
        ["/proc", "/etc/cdi-hostname", "/etc/cdi-hostname/sub/deeper"]
    );
    assert_eq!(
        mounts[1].source().as_deref(),
        Some(Path::new("/etc/hostname"))
    );
    assert_eq!(mounts[1].options().as_deref().unwrap(), ["ro", "bind"]);

    let hooks = spec.hooks().as_ref().unwrap();
    let hook = &hooks.create_container().as_ref().unwrap()[0];
    assert_eq!(hook.path(), Path::new("/usr/bin/nvidia-ctk"));
    assert_eq!(hook.timeout(), Some(5));
}

#[test]
fn edits_for_root_and_user_namespaces_and_bad_hosts() {
    let node = |extra: &str| {
        vec![ContainerEdits {
            device_nodes: vec![
                serde_json::from_str(&format!(r#"{{"path":"/dev/x"{extra}}}"#)).unwrap(),
            ],
            mounts: vec![serde_json::from_str(
                r#"{"hostPath":"/a","containerPath":"/b","options":["rbind"]}"#,
            )
            .unwrap()],
            ..Default::default()
        }]
    };
    // Root: no owner set; none permissions: an empty access rule; userns: ridmap added.
    let mut spec = base_spec(0, true);
    apply(
        &mut spec,
        &node(r#","hostPath":"/dev/sda","permissions":"none""#),
        &fake_node,
    )
    .unwrap();
    let linux = spec.linux().as_ref().unwrap();
    let dev = &linux.devices().as_ref().unwrap()[0];
    assert_eq!(
        (dev.typ(), dev.uid(), dev.gid()),
        (LinuxDeviceType::B, None, None)
    );
    let rule = &linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .as_ref()
        .unwrap()[0];
    assert_eq!(rule.access().as_deref(), Some(""));
    let m = spec
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.destination() == Path::new("/b"))
        .unwrap();
    assert_eq!(m.options().as_deref().unwrap(), ["rbind", "ridmap"]);

    // The host node is missing and the spec does not say enough: refused.
    let err = apply(&mut base_spec(0, false), &node(""), &fake_node).unwrap_err();
    assert!(matches!(err, CdiError::HostDevice { .. }), "{err}");
    // The spec says block, the host node is a char device.
    let err = apply(
        &mut base_spec(0, false),
        &node(r#","hostPath":"/dev/null","type":"b""#),
        &fake_node,
    )
    .unwrap_err();
    assert!(matches!(err, CdiError::TypeMismatch { .. }), "{err}");
}

#[test]
fn host_node_stats_a_real_device() {
    let n = host_node(Path::new("/dev/null")).unwrap();
    assert_eq!((n.typ, n.major, n.minor), ('c', 1, 3));
    assert!(host_node(Path::new("/etc/hostname")).is_err());
}
