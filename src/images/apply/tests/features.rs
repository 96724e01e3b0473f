//! Every kind of entry and attribute, in both whiteout modes.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use sha2::{Digest, Sha256};

use super::*;
use crate::images::apply::Compression;

fn every_kind() -> Vec<E> {
    vec![
        E::dir("a")
            .mode(0o750)
            .owner(1000, 1001)
            .mtime(1_000_000_000),
        E::file("a/f", b"hello")
            .mode(0o4755)
            .owner(1000, 1001)
            .mtime(1_100_000_000),
        E::symlink("a/l", "f").owner(7, 8).mtime(1_200_000_000),
        E::hardlink("a/h", "a/f")
            .mode(0o4755)
            .owner(1000, 1001)
            .mtime(1_100_000_000),
        E::node(b'3', "a/c", (1, 3)).mode(0o666),
        E::node(b'4', "a/b", (7, 0)).mode(0o660),
        E::node(b'6', "a/p", (0, 0)).mode(0o600),
        E::dir("tmp").mode(0o1777),
        E::dir("g").mode(0o2775).owner(0, 50),
        E::file("a/pax", b"x")
            .pax("mtime", b"1300000000.123456789")
            .pax("atime", b"1400000000.5")
            .pax("uid", b"70000")
            .pax("gid", b"70001"),
    ]
}

#[test]
fn every_kind_of_entry_with_owner_mode_and_times() {
    for mode in modes() {
        let sb = Sandbox::new();
        let tar = layer(every_kind());
        let applied = sb.apply(&tar, mode.clone()).unwrap();
        assert_eq!(
            applied.diff_id,
            format!("sha256:{}", hex::encode(Sha256::digest(&tar)))
        );
        assert_eq!(applied.uncompressed_bytes, tar.len() as u64);
        assert_eq!(applied.compression, Compression::None);

        let a = sb.lstat("a");
        assert!(a.is_dir());
        assert_eq!(
            (a.mode() & 0o7777, a.uid(), a.gid()),
            (0o750, 1000, 1001),
            "{mode:?}"
        );
        assert_eq!(a.mtime(), 1_000_000_000, "dir mtime set after its children");
        let f = sb.lstat("a/f");
        assert_eq!(std::fs::read(sb.path("a/f")).unwrap(), b"hello");
        assert_eq!(f.mode() & 0o7777, 0o4755, "setuid kept (chmod after chown)");
        assert_eq!((f.uid(), f.gid(), f.mtime()), (1000, 1001, 1_100_000_000));
        assert_eq!(f.atime(), 1_100_000_000, "no atime: the mtime");
        assert_eq!(f.nlink(), 2);
        assert_eq!(sb.lstat("a/h").ino(), f.ino(), "hard link");
        let l = sb.lstat("a/l");
        assert!(l.file_type().is_symlink());
        assert_eq!(std::fs::read_link(sb.path("a/l")).unwrap(), Path::new("f"));
        assert_eq!((l.uid(), l.gid(), l.mtime()), (7, 8, 1_200_000_000));
        let c = sb.lstat("a/c");
        assert!(c.file_type().is_char_device());
        assert_eq!((c.rdev(), c.mode() & 0o7777), (libc::makedev(1, 3), 0o666));
        let b = sb.lstat("a/b");
        assert!(b.file_type().is_block_device());
        assert_eq!(b.rdev(), libc::makedev(7, 0));
        assert!(sb.lstat("a/p").file_type().is_fifo());
        assert_eq!(sb.lstat("a/p").mode() & 0o7777, 0o600);
        assert_eq!(sb.lstat("tmp").mode() & 0o7777, 0o1777, "sticky");
        assert_eq!(sb.lstat("g").mode() & 0o7777, 0o2775, "setgid dir");
        let p = sb.lstat("a/pax");
        assert_eq!((p.uid(), p.gid()), (70000, 70001), "PAX ids");
        assert_eq!((p.mtime(), p.mtime_nsec()), (1_300_000_000, 123_456_789));
        assert_eq!((p.atime(), p.atime_nsec()), (1_400_000_000, 500_000_000));
    }
}

#[test]
fn xattrs_from_pax_records() {
    // security.capability v2: cap_net_bind_service permitted + effective.
    let cap: Vec<u8> = vec![
        0x01, 0, 0, 0x02, 0x00, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    for mode in modes() {
        let sb = Sandbox::new();
        let tar = layer([
            E::file("bin", b"elf")
                .mode(0o755)
                .pax("SCHILY.xattr.user.comment", b"hi")
                .pax("SCHILY.xattr.security.capability", &cap)
                .pax("SCHILY.xattr.trusted.evil", b"1"),
            E::symlink("link", "bin").pax("SCHILY.xattr.user.x", b"refused on symlinks"),
        ]);
        let applied = sb.apply(&tar, mode).unwrap();
        assert_eq!(
            xattr(&sb.path("bin"), "user.comment").as_deref(),
            Some(&b"hi"[..])
        );
        assert_eq!(
            xattr(&sb.path("bin"), "security.capability"),
            Some(cap.clone())
        );
        assert_eq!(
            xattr(&sb.path("bin"), "trusted.evil"),
            None,
            "trusted.* not from a layer"
        );
        assert_eq!(xattr(&sb.path("link"), "user.x"), None);
        assert_eq!(
            applied.counts.ignored_xattrs, 2,
            "trusted.evil and user.x on a symlink"
        );
    }
}

#[test]
fn zeros_become_holes_and_read_back_the_same() {
    let mut data = vec![0u8; 1 << 20];
    data[300_000] = 7;
    data.extend_from_slice(&[0u8; 8192]);
    let sb = Sandbox::new();
    sb.apply(&layer([E::file("sparse", &data)]), Whiteouts::Plain)
        .unwrap();
    assert_eq!(std::fs::read(sb.path("sparse")).unwrap(), data);
    let m = sb.lstat("sparse");
    assert_eq!(m.len(), data.len() as u64, "ends in a hole: length set");
    assert!(m.blocks() * 512 < m.len(), "{} blocks", m.blocks());
}

#[test]
fn gzip_and_zstd_layers_have_the_tar_s_diff_id() {
    let tar = layer(every_kind());
    let want = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    let zst = zstd::stream::encode_all(&tar[..], 3).unwrap();
    for (bytes, kind) in [(gz, Compression::Gzip), (zst, Compression::Zstd)] {
        let sb = Sandbox::new();
        let applied = sb.apply(&bytes, Whiteouts::Plain).unwrap();
        assert_eq!(
            (applied.diff_id.as_str(), applied.compression),
            (want.as_str(), kind)
        );
        assert_eq!(std::fs::read(sb.path("a/f")).unwrap(), b"hello");
    }
}

#[test]
fn trailing_bytes_after_the_archive_count_in_the_diff_id() {
    let mut tar = layer([E::file("f", b"1")]);
    tar.extend_from_slice(&[0u8; 4096]);
    let sb = Sandbox::new();
    let applied = sb.apply(&tar, Whiteouts::Plain).unwrap();
    assert_eq!(
        applied.diff_id,
        format!("sha256:{}", hex::encode(Sha256::digest(&tar)))
    );
}

#[test]
fn replacing_entries_of_another_type_and_merging_directories() {
    for mode in modes() {
        let sb = Sandbox::new();
        sb.apply(
            &layer([
                E::dir("d"),
                E::file("d/child", b"c"),
                E::file("f", b"file"),
                E::dir("m").mode(0o700),
                E::file("m/keep", b"k"),
            ]),
            mode.clone(),
        )
        .unwrap();
        sb.apply(
            &layer([
                E::file("d", b"now a file"),
                E::dir("f").mode(0o711),
                E::file("f/inside", b"i"),
                E::dir("m").mode(0o755).owner(3, 3),
            ]),
            mode,
        )
        .unwrap();
        assert_eq!(std::fs::read(sb.path("d")).unwrap(), b"now a file");
        assert_eq!(sb.lstat("f").mode() & 0o7777, 0o711);
        assert_eq!(std::fs::read(sb.path("f/inside")).unwrap(), b"i");
        assert_eq!(std::fs::read(sb.path("m/keep")).unwrap(), b"k", "merged");
        let m = sb.lstat("m");
        assert_eq!(
            (m.mode() & 0o7777, m.uid()),
            (0o755, 3),
            "metadata of the new entry"
        );
    }
}

#[test]
fn duplicate_entries_the_last_wins() {
    let sb = Sandbox::new();
    sb.apply(
        &layer([
            E::file("x", b"first").mode(0o600),
            E::file("x", b"second").mode(0o640),
            E::symlink("y", "x"),
            E::symlink("y", "z"),
            E::dir("d").mode(0o700),
            E::dir("d").mode(0o750),
        ]),
        Whiteouts::Plain,
    )
    .unwrap();
    assert_eq!(std::fs::read(sb.path("x")).unwrap(), b"second");
    assert_eq!(sb.lstat("x").mode() & 0o7777, 0o640);
    assert_eq!(std::fs::read_link(sb.path("y")).unwrap(), Path::new("z"));
    assert_eq!(sb.lstat("d").mode() & 0o7777, 0o750);
}

#[test]
fn missing_parents_are_made_0755_and_the_root_entry_is_skipped() {
    let sb = Sandbox::new();
    std::fs::set_permissions(
        &sb.root,
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let applied = sb
        .apply(
            &layer([E::dir("./").mode(0o700), E::file("x/y/z", b"deep")]),
            Whiteouts::Plain,
        )
        .unwrap();
    assert_eq!(applied.counts.skipped_root, 1);
    assert_eq!(
        sb.lstat("").mode() & 0o7777,
        0o711,
        "the root keeps its mode"
    );
    assert_eq!(sb.lstat("x").mode() & 0o7777, 0o755);
    assert_eq!(sb.lstat("x/y").mode() & 0o7777, 0o755);
    assert_eq!(std::fs::read(sb.path("x/y/z")).unwrap(), b"deep");
}

#[test]
fn times_before_the_epoch_become_the_epoch() {
    let sb = Sandbox::new();
    sb.apply(
        &layer([E::file("old", b"o").pax("mtime", b"-100")]),
        Whiteouts::Plain,
    )
    .unwrap();
    assert_eq!(sb.lstat("old").mtime(), 0);
}
