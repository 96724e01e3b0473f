//! Layers that try to write outside the root, or to make the applier allocate without
//! bound, or are broken. The sandbox checks on drop that nothing outside the root changed.

use std::io::Write;
use std::os::unix::fs::MetadataExt;

use super::*;

#[test]
fn dot_dot_and_absolute_names_land_inside_the_root() {
    for mode in modes() {
        let sb = Sandbox::new();
        sb.apply(
            &layer([
                E::file("../../etc/x", b"1"),
                E::file("/abs/path", b"2"),
                E::file("a/../../../b", b"3"),
            ]),
            mode,
        )
        .unwrap();
        assert_eq!(std::fs::read(sb.path("etc/x")).unwrap(), b"1");
        assert_eq!(std::fs::read(sb.path("abs/path")).unwrap(), b"2");
        assert_eq!(std::fs::read(sb.path("b")).unwrap(), b"3");
    }
}

#[test]
fn symlinked_parents_resolve_inside_the_root() {
    for mode in modes() {
        let sb = Sandbox::new();
        let outside = sb.outside();
        let abs = outside.to_str().unwrap();
        sb.apply(
            &layer([
                E::symlink("a", "/"),
                E::file("a/x", b"via /"),
                E::symlink("up", "../../../.."),
                E::file("up/y", b"via .."),
                E::symlink("c1", "c2"),
                E::symlink("c2", abs),
                E::file("c1/marker", b"via a chain to an absolute host path"),
                E::symlink("dangling", "/nowhere/deeper"),
                E::file("dangling/z", b"made under the root"),
            ]),
            mode,
        )
        .unwrap();
        assert_eq!(std::fs::read(sb.path("x")).unwrap(), b"via /");
        assert_eq!(std::fs::read(sb.path("y")).unwrap(), b"via ..");
        let inside = sb.root.join(abs.trim_start_matches('/')).join("marker");
        assert_eq!(
            std::fs::read(inside).unwrap(),
            b"via a chain to an absolute host path"
        );
        assert_eq!(std::fs::read(outside.join("marker")).unwrap(), b"outside");
        assert_eq!(
            std::fs::read(sb.path("nowhere/deeper/z")).unwrap(),
            b"made under the root"
        );
    }
}

#[test]
fn a_symlink_loop_is_refused() {
    let sb = Sandbox::new();
    let err = sb
        .apply(
            &layer([
                E::symlink("l1", "l2"),
                E::symlink("l2", "l1"),
                E::file("l1/x", b""),
            ]),
            Whiteouts::Plain,
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::TooManyLinks { .. }), "{err}");
}

#[test]
fn a_file_over_a_symlink_replaces_the_symlink() {
    let sb = Sandbox::new();
    let target = sb.outside().join("marker");
    sb.apply(
        &layer([
            E::symlink("f", target.to_str().unwrap()),
            E::file("f", b"replaced"),
            E::symlink("d", sb.outside().to_str().unwrap()),
            E::dir("d").mode(0o700),
        ]),
        Whiteouts::Plain,
    )
    .unwrap();
    assert!(sb.lstat("f").is_file());
    assert!(sb.lstat("d").is_dir());
}

#[test]
fn hard_links_resolve_inside_the_root() {
    let sb = Sandbox::new();
    // ../outside/marker is <root>/outside/marker, which does not exist.
    let err = sb
        .apply(
            &layer([E::hardlink("h", "../outside/marker")]),
            Whiteouts::Plain,
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::LinkTargetMissing { .. }), "{err}");
    let abs = sb.outside().join("marker");
    let err = sb
        .apply(
            &layer([E::hardlink("h", abs.to_str().unwrap())]),
            Whiteouts::Plain,
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::LinkTargetMissing { .. }), "{err}");
    // Through a symlinked directory pointing outside: resolved inside.
    let err = sb
        .apply(
            &layer([
                E::symlink("out", sb.outside().to_str().unwrap()),
                E::hardlink("h2", "out/marker"),
            ]),
            Whiteouts::Plain,
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::LinkTargetMissing { .. }), "{err}");
    for target in ["..", ".", "out/", ""] {
        let err = sb
            .apply(&layer([E::hardlink("h3", target)]), Whiteouts::Plain)
            .unwrap_err();
        assert!(
            matches!(err, ApplyError::LinkTargetDirectory { .. }),
            "{target:?}: {err}"
        );
    }
    assert_eq!(std::fs::symlink_metadata(abs).unwrap().nlink(), 1);
}

#[test]
fn a_hard_link_to_a_symlink_links_the_symlink() {
    let sb = Sandbox::new();
    sb.apply(
        &layer([
            E::symlink("s", sb.outside().join("marker").to_str().unwrap()),
            E::hardlink("hs", "s"),
            E::dir("d"),
            E::file("d/f", b"f"),
            E::symlink("ds", "d"),
            E::hardlink("hf", "ds/f"),
        ]),
        Whiteouts::Plain,
    )
    .unwrap();
    let (s, hs) = (sb.lstat("s"), sb.lstat("hs"));
    assert!(hs.file_type().is_symlink());
    assert_eq!(s.ino(), hs.ino());
    assert_eq!(
        sb.lstat("hf").ino(),
        sb.lstat("d/f").ino(),
        "parent symlink followed"
    );
}

#[test]
fn oversized_pax_headers_and_long_names_are_refused_before_reading_them() {
    for flag in [b'x', b'L'] {
        let mut l = Layer::default();
        l.block(&header(flag, b"big", b"", &E::file("", b""), (1 << 20) + 1));
        // No data follows: the size alone is refused.
        let sb = Sandbox::new();
        let err = sb.apply(&l.tar(), Whiteouts::Plain).unwrap_err();
        assert!(matches!(err, ApplyError::SpecialTooLarge { .. }), "{err}");
    }
}

#[test]
fn a_long_name_within_the_bound_is_read() {
    let name = format!("{}/f", "d".repeat(200));
    let mut l = Layer::default();
    let mut data = name.as_bytes().to_vec();
    data.push(0);
    let mut gnu = header(
        b'L',
        b"././@LongLink",
        b"",
        &E::file("", b""),
        data.len() as u64,
    );
    gnu[257..265].copy_from_slice(b"ustar  \0");
    set_checksum(&mut gnu);
    l.block(&gnu).data(&data).add(E::file("short", b"long"));
    let sb = Sandbox::new();
    sb.apply(&l.tar(), Whiteouts::Plain).unwrap();
    assert_eq!(std::fs::read(sb.path(&name)).unwrap(), b"long");
}

#[test]
fn truncated_and_corrupt_streams_fail() {
    let tar = layer([E::file("f", &[7u8; 100_000])]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    let sb = Sandbox::new();
    let err = sb.apply(&gz[..gz.len() / 2], Whiteouts::Plain).unwrap_err();
    assert!(matches!(err, ApplyError::Read(_)), "{err}");
    let err = sb.apply(&tar[..10_000], Whiteouts::Plain).unwrap_err();
    assert!(matches!(err, ApplyError::Read(_)), "truncated data: {err}");
    let mut bad = tar.clone();
    bad[0] ^= 1;
    let err = sb.apply(&bad, Whiteouts::Plain).unwrap_err();
    assert!(matches!(err, ApplyError::Header { .. }), "{err}");
    let mut zero_then_garbage = vec![0u8; 512];
    zero_then_garbage.extend_from_slice(&[1u8; 512]);
    let err = sb.apply(&zero_then_garbage, Whiteouts::Plain).unwrap_err();
    assert!(matches!(err, ApplyError::Header { .. }), "{err}");
}

#[test]
fn the_end_of_input_at_a_header_or_in_padding_ends_the_archive_as_in_go() {
    let sb = Sandbox::new();
    let one = layer([E::file("a", b"1")]);
    // Header + data block, no end blocks; and the data block cut short in its padding.
    sb.apply(&one[..1024], Whiteouts::Plain).unwrap();
    sb.apply(&one[..513], Whiteouts::Plain).unwrap();
    assert_eq!(std::fs::read(sb.path("a")).unwrap(), b"1");
    // One zero block, then the end.
    let mut single = one[..1024].to_vec();
    single.extend_from_slice(&[0u8; 512]);
    sb.apply(&single, Whiteouts::Plain).unwrap();
}

#[test]
fn bad_entries_are_refused_by_name() {
    let sb = Sandbox::new();
    let neg = {
        let mut l = Layer::default();
        let mut h = header(b'0', b"neg", b"", &E::file("", b""), 0);
        h[108] = 0xff; // base-256 -1 as uid
        h[109..116].fill(0xff);
        set_checksum(&mut h);
        l.block(&h);
        l.tar()
    };
    let err = sb.apply(&neg, Whiteouts::Plain).unwrap_err();
    assert!(
        matches!(err, ApplyError::OwnerOutOfRange { id: -1, .. }),
        "{err}"
    );
    let err = sb
        .apply(&layer([E::node(b'7', "cont", (0, 0))]), Whiteouts::Plain)
        .unwrap_err();
    assert!(
        matches!(err, ApplyError::UnknownType { flag: '7', .. }),
        "{err}"
    );
    let err = sb
        .apply(&layer([E::node(b'S', "sparse", (0, 0))]), Whiteouts::Plain)
        .unwrap_err();
    assert!(matches!(err, ApplyError::Sparse { .. }), "{err}");
    let err = sb
        .apply(
            &layer([E::file("s", b"").pax("GNU.sparse.major", b"1")]),
            Whiteouts::Plain,
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::Sparse { .. }), "{err}");
    let err = sb
        .apply(
            &layer([E::file("f", b""), E::file("f/x", b"")]),
            Whiteouts::Plain,
        )
        .unwrap_err();
    assert!(matches!(err, ApplyError::NotADirectory { .. }), "{err}");
}
