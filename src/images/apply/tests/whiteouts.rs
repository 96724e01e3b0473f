//! Whiteouts and opaque directories, in each mode.

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use super::*;

#[test]
fn plain_whiteouts_remove_what_they_name() {
    let sb = Sandbox::new();
    sb.apply(
        &layer([
            E::file("gone", b"g"),
            E::dir("dir"),
            E::file("dir/sub", b"s"),
            E::file("kept", b"k"),
        ]),
        Whiteouts::Plain,
    )
    .unwrap();
    let applied = sb
        .apply(
            &layer([
                E::file(".wh.gone", b""),
                E::file(".wh.dir", b""),
                E::file(".wh.absent", b""),
            ]),
            Whiteouts::Plain,
        )
        .unwrap();
    assert_eq!(applied.counts.whiteouts, 3);
    assert!(!sb.exists("gone") && !sb.exists("dir") && !sb.exists(".wh.gone"));
    assert!(sb.exists("kept"));
}

#[test]
fn plain_opaque_keeps_only_what_this_layer_applied_in_either_order() {
    for opaque_first in [true, false] {
        let sb = Sandbox::new();
        sb.apply(
            &layer([
                E::dir("d"),
                E::file("d/old", b"o"),
                E::dir("d/olddir"),
                E::file("d/olddir/x", b"x"),
                E::dir("d/both"),
                E::file("d/both/old", b"o"),
            ]),
            Whiteouts::Plain,
        )
        .unwrap();
        let mut entries = vec![E::dir("d"), E::file("d/new", b"n"), E::dir("d/both")];
        let opq = E::file("d/.wh..wh..opq", b"");
        if opaque_first {
            entries.insert(1, opq);
        } else {
            entries.push(opq);
        }
        sb.apply(&layer(entries), Whiteouts::Plain).unwrap();
        let mut names: Vec<_> = std::fs::read_dir(sb.path("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["both", "new"], "opaque first: {opaque_first}");
        assert!(
            !sb.exists("d/both/old"),
            "children of a kept directory go too"
        );
    }
}

#[test]
fn overlay_whiteouts_are_0_0_character_devices_and_opaque_is_an_xattr() {
    for (opaque, key) in [
        (OpaqueXattr::Trusted, "trusted.overlay.opaque"),
        (OpaqueXattr::User, "user.overlay.opaque"),
    ] {
        let sb = Sandbox::new();
        let lower = sb.tmp.path().join("lower");
        std::fs::create_dir_all(lower.join("d")).unwrap();
        let mode = Whiteouts::Overlay {
            lowers: vec![lower.clone()],
            opaque,
        };
        let applied = sb
            .apply(
                &layer([
                    E::file(".wh.gone", b"").owner(5, 6),
                    E::dir("d"),
                    E::file("d/.wh..wh..opq", b""),
                    E::file("d/new", b"n"),
                ]),
                mode,
            )
            .unwrap();
        assert_eq!(applied.counts.whiteouts, 2);
        let w = sb.lstat("gone");
        assert!(w.file_type().is_char_device());
        assert_eq!(
            (w.rdev(), w.mode() & 0o7777, w.uid(), w.gid()),
            (0, 0, 5, 6)
        );
        assert!(!sb.exists(".wh.gone") && !sb.exists("d/.wh..wh..opq"));
        assert_eq!(xattr(&sb.path("d"), key).as_deref(), Some(&b"y"[..]));
        assert!(sb.exists("d/new"));
        std::fs::remove_dir_all(&lower).unwrap();
    }
}

#[test]
fn overlay_whiteout_of_an_entry_this_layer_made_fails_as_in_containerd() {
    let sb = Sandbox::new();
    let err = sb
        .apply(
            &layer([E::file("x", b"1"), E::file(".wh.x", b"")]),
            modes()[1].clone(),
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::Fs { op: "mknodat", .. }), "{err}");
}

#[test]
fn overlay_parents_made_for_a_deep_entry_copy_the_lower_directory() {
    let sb = Sandbox::new();
    let lower = sb.tmp.path().join("lower");
    let upper_lower = sb.tmp.path().join("lower2");
    std::fs::create_dir_all(lower.join("etc/ssl")).unwrap();
    std::fs::create_dir_all(upper_lower.join("etc")).unwrap();
    std::os::unix::fs::chown(lower.join("etc/ssl"), Some(9), Some(10)).unwrap();
    std::fs::set_permissions(
        lower.join("etc/ssl"),
        std::os::unix::fs::PermissionsExt::from_mode(0o701),
    )
    .unwrap();
    std::fs::set_permissions(
        upper_lower.join("etc"),
        std::os::unix::fs::PermissionsExt::from_mode(0o710),
    )
    .unwrap();
    let set = |p: &Path, v: &str| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated strings, a valid value slice.
        let r = unsafe {
            libc::setxattr(
                c.as_ptr(),
                c"user.origin".as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                0,
            )
        };
        assert_eq!(r, 0);
    };
    set(&lower.join("etc/ssl"), "lower");
    let mode = Whiteouts::Overlay {
        // Highest first: lower2 has etc, only lower has etc/ssl.
        lowers: vec![upper_lower.clone(), lower.clone()],
        opaque: OpaqueXattr::Trusted,
    };
    sb.apply(&layer([E::file("etc/ssl/cert.pem", b"pem")]), mode)
        .unwrap();
    assert_eq!(
        sb.lstat("etc").mode() & 0o7777,
        0o710,
        "from the highest lower"
    );
    let ssl = sb.lstat("etc/ssl");
    assert_eq!((ssl.mode() & 0o7777, ssl.uid(), ssl.gid()), (0o701, 9, 10));
    assert_eq!(
        xattr(&sb.path("etc/ssl"), "user.origin").as_deref(),
        Some(&b"lower"[..])
    );
    std::fs::remove_dir_all(&lower).unwrap();
    std::fs::remove_dir_all(&upper_lower).unwrap();
}

#[test]
fn whiteout_names_that_reach_their_own_directory_are_refused() {
    for name in [".wh.", ".wh..", "d/.wh.."] {
        let sb = Sandbox::new();
        let err = sb
            .apply(&layer([E::file(name, b"")]), Whiteouts::Plain)
            .unwrap_err();
        assert!(
            matches!(err, ApplyError::InvalidWhiteout { .. }),
            "{name}: {err}"
        );
    }
}
