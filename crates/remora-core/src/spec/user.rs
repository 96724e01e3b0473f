//! The process user: uid, primary gid and additional gids.
//!
//! Sources, in containerd's order: the CRI `run_as_username` / `run_as_user` (+
//! `run_as_group`), else the image's `User` (`uid`, `uid:gid`, `name`, `name:group`). Names
//! are resolved through the *image's* `/etc/passwd` and `/etc/group`, opened inside the
//! rootfs with symlinks resolved against the rootfs (an image may not point them at the
//! host's files). A numeric user without a passwd entry runs with gid 0; a name that does not
//! resolve is an error, because guessing would run the process as someone else.
//!
//! Additional gids follow containerd: the primary gid, the groups in `/etc/group` that list
//! the user as a member (unless the policy is `Strict`), and the requested supplemental
//! groups — de-duplicated and sorted.

use std::io;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{User, UserBuilder};

use super::rootfs::RootFs;
use super::types::{SecurityContext, SupplementalGroupsPolicy};
use super::SpecError;

/// Largest passwd or group file read from an image.
pub const MAX_USER_DB_LEN: u64 = 16 << 20;

/// One `/etc/passwd` entry (only the fields used).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    /// Login name.
    pub name: String,
    /// uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
}

/// One `/etc/group` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    /// Group name.
    pub name: String,
    /// gid.
    pub gid: u32,
    /// Member login names.
    pub members: Vec<String>,
}

/// Parses `/etc/passwd` text; comments, blank and malformed lines are skipped (as libc does).
pub fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?.to_owned();
            let _password = f.next()?;
            let uid = f.next()?.trim().parse().ok()?;
            let gid = f.next()?.trim().parse().ok()?;
            Some(PasswdEntry { name, uid, gid })
        })
        .collect()
}

/// Parses `/etc/group` text; comments, blank and malformed lines are skipped.
pub fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?.to_owned();
            let _password = f.next()?;
            let gid = f.next()?.trim().parse().ok()?;
            let members = f
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_owned)
                .collect();
            Some(GroupEntry { name, gid, members })
        })
        .collect()
}

/// The CRI user string (`user[:group]`) from the security context, or `None` if no user is
/// set. A group without a user is an error (CRI api.proto: "the runtime MUST error").
pub fn cri_user_string(sc: &SecurityContext) -> Result<Option<String>, SpecError> {
    let mut user = match sc.run_as_user {
        Some(uid) => Some(id_string("run_as_user", uid)?),
        None => None,
    };
    if !sc.run_as_username.is_empty() {
        user = Some(sc.run_as_username.clone());
    }
    let group = match sc.run_as_group {
        Some(gid) => Some(id_string("run_as_group", gid)?),
        None => None,
    };
    match (user, group) {
        (None, Some(gid)) => Err(SpecError::GroupWithoutUser { gid }),
        (None, None) => Ok(None),
        (Some(u), None) => Ok(Some(u)),
        (Some(u), Some(g)) => Ok(Some(format!("{u}:{g}"))),
    }
}

fn id_string(field: &'static str, id: i64) -> Result<String, SpecError> {
    u32::try_from(id)
        .map(|v| v.to_string())
        .map_err(|_| SpecError::InvalidId { field, value: id })
}

/// The OCI process user for a container, reading the rootfs's `/etc/passwd` and
/// `/etc/group` as needed.
pub fn resolve_user(
    rootfs: RootFs<'_>,
    sc: &SecurityContext,
    image_user: &str,
) -> Result<User, SpecError> {
    let db = UserDb::load(rootfs)?;
    let cri = cri_user_string(sc)?;
    let user_string = match cri {
        Some(s) => s,
        None => image_user.to_owned(),
    };
    let supplemental = sc
        .supplemental_groups
        .iter()
        .map(|&g| {
            u32::try_from(g).map_err(|_| SpecError::InvalidId {
                field: "supplemental_groups",
                value: g,
            })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    resolve_with(
        &db,
        &user_string,
        &supplemental,
        sc.supplemental_groups_policy,
    )
}

/// `/etc/passwd` and `/etc/group` of an image; `None` where the file does not exist.
#[derive(Debug, Clone, Default)]
pub struct UserDb {
    /// Parsed passwd, if the file exists.
    pub passwd: Option<Vec<PasswdEntry>>,
    /// Parsed group, if the file exists.
    pub group: Option<Vec<GroupEntry>>,
    /// Where passwd was looked for (for error messages).
    pub passwd_path: PathBuf,
    /// Where group was looked for (for error messages).
    pub group_path: PathBuf,
}

impl UserDb {
    /// Reads both files from the rootfs; a missing file is `None`, other read errors fail.
    /// Each must be a regular file of at most [`MAX_USER_DB_LEN`] bytes: an image's FIFO or
    /// device node there is refused, not read (it would block or never end).
    pub fn load(rootfs: RootFs<'_>) -> Result<UserDb, SpecError> {
        let read = |rel: &str| -> Result<(Option<String>, PathBuf), SpecError> {
            let resolved =
                rootfs
                    .resolve(Path::new(rel))
                    .map_err(|source| SpecError::ReadUserDb {
                        path: rootfs.display_path(Path::new(rel)),
                        source,
                    })?;
            let Some(path) = resolved else {
                return Ok((None, rootfs.display_path(Path::new(rel))));
            };
            match remora_host::fs::read_regular_file(&path, MAX_USER_DB_LEN) {
                Ok(text) => Ok((Some(text), path)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok((None, path)),
                Err(source) => Err(SpecError::ReadUserDb { path, source }),
            }
        };
        let (passwd, passwd_path) = read("etc/passwd")?;
        let (group, group_path) = read("etc/group")?;
        Ok(UserDb {
            passwd: passwd.as_deref().map(parse_passwd),
            group: group.as_deref().map(parse_group),
            passwd_path,
            group_path,
        })
    }

    fn user_by_uid(&self, uid: u32) -> Option<&PasswdEntry> {
        self.passwd.as_ref()?.iter().find(|p| p.uid == uid)
    }
}

/// Resolves a `user[:group]` string against a loaded user database.
pub fn resolve_with(
    db: &UserDb,
    user_string: &str,
    supplemental: &[u32],
    policy: SupplementalGroupsPolicy,
) -> Result<User, SpecError> {
    // No user anywhere: root, as the image format says.
    let user_string = if user_string.is_empty() {
        "0"
    } else {
        user_string
    };
    let (user_part, group_part) = match user_string.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user_string, None),
    };
    if user_part.is_empty() || group_part.is_some_and(|g| g.is_empty() || g.contains(':')) {
        return Err(SpecError::InvalidUser {
            user: user_string.to_owned(),
        });
    }

    // uid, the passwd entry if any, and the login name used for group membership.
    let (uid, entry) = match user_part.parse::<u32>() {
        Ok(uid) => (uid, db.user_by_uid(uid)),
        Err(_) => {
            let entry = db
                .passwd
                .as_ref()
                .and_then(|p| p.iter().find(|e| e.name == user_part))
                .ok_or_else(|| SpecError::UserNotFound {
                    name: user_part.to_owned(),
                    passwd: db.passwd_path.clone(),
                })?;
            (entry.uid, Some(entry))
        }
    };
    let member_name = entry.map(|e| e.name.as_str());

    let gid = match group_part {
        None => entry.map_or(0, |e| e.gid),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => db
                .group
                .as_ref()
                .and_then(|groups| groups.iter().find(|e| e.name == g))
                .map(|e| e.gid)
                .ok_or_else(|| SpecError::GroupNotFound {
                    name: g.to_owned(),
                    group: db.group_path.clone(),
                })?,
        },
    };

    let mut gids = vec![gid];
    if policy == SupplementalGroupsPolicy::Merge {
        // containerd matches the login name in member lists, skipping a group named like
        // the user (that is the user's own primary group, already present or overridden).
        let name = member_name.unwrap_or(user_part);
        if let Some(groups) = &db.group {
            gids.extend(
                groups
                    .iter()
                    .filter(|g| g.name != name && g.members.iter().any(|m| m == name))
                    .map(|g| g.gid),
            );
        }
    }
    gids.extend_from_slice(supplemental);
    gids.sort_unstable();
    gids.dedup();

    Ok(UserBuilder::default()
        .uid(uid)
        .gid(gid)
        .additional_gids(gids)
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::in_root::resolve_in_root;
    use std::fs;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
        # comment\n\
        www:x:33:33::/var/www:/sbin/nologin\n\
        alice:x:1000:1000:Alice:/home/alice:/bin/sh\n\
        broken line\n";
    const GROUP: &str = "root:x:0:\n\
        wheel:x:10:root,alice\n\
        audio:x:29:alice\n\
        alice:x:1000:alice\n\
        staff:x:50:\n";

    fn rootfs(passwd: Option<&str>, group: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        if let Some(p) = passwd {
            fs::write(dir.path().join("etc/passwd"), p).unwrap();
        }
        if let Some(g) = group {
            fs::write(dir.path().join("etc/group"), g).unwrap();
        }
        dir
    }

    fn sc() -> SecurityContext {
        SecurityContext::default()
    }

    fn ids(u: &User) -> (u32, u32, Vec<u32>) {
        (
            u.uid(),
            u.gid(),
            u.additional_gids().clone().unwrap_or_default(),
        )
    }

    #[test]
    fn no_user_is_root_with_roots_groups() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "").unwrap();
        assert_eq!(ids(&u), (0, 0, vec![0, 10]));
    }

    #[test]
    fn image_user_by_name() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "alice").unwrap();
        // alice's own group (named alice) is the primary gid; wheel and audio are
        // memberships.
        assert_eq!(ids(&u), (1000, 1000, vec![10, 29, 1000]));
    }

    #[test]
    fn image_user_numeric_uses_passwd_gid() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "33").unwrap();
        assert_eq!(ids(&u), (33, 33, vec![33]));
    }

    #[test]
    fn numeric_uid_not_in_passwd_gets_gid_zero() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "4242").unwrap();
        assert_eq!(ids(&u), (4242, 0, vec![0]));
    }

    #[test]
    fn name_and_group_forms() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "alice:staff").unwrap();
        assert_eq!(ids(&u), (1000, 50, vec![10, 29, 50]));
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "1000:29").unwrap();
        assert_eq!(ids(&u), (1000, 29, vec![10, 29]));
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "www:10").unwrap();
        assert_eq!(ids(&u), (33, 10, vec![10]));
    }

    #[test]
    fn missing_files_allow_numeric_only() {
        let r = rootfs(None, None);
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "1234:5678").unwrap();
        assert_eq!(ids(&u), (1234, 5678, vec![5678]));
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "1234").unwrap();
        assert_eq!(ids(&u), (1234, 0, vec![0]));
        let err = resolve_user(RootFs::Dir(r.path()), &sc(), "alice").unwrap_err();
        assert!(matches!(err, SpecError::UserNotFound { ref name, .. } if name == "alice"));
    }

    #[test]
    fn unknown_names_are_errors() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        let err = resolve_user(RootFs::Dir(r.path()), &sc(), "bob").unwrap_err();
        assert!(matches!(err, SpecError::UserNotFound { ref name, .. } if name == "bob"));
        assert!(err.to_string().contains("bob"));
        let err = resolve_user(RootFs::Dir(r.path()), &sc(), "alice:nogroup").unwrap_err();
        assert!(matches!(err, SpecError::GroupNotFound { ref name, .. } if name == "nogroup"));
    }

    #[test]
    fn malformed_user_strings_are_errors() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        for bad in [":1", "1:", "1:2:3"] {
            let err = resolve_user(RootFs::Dir(r.path()), &sc(), bad).unwrap_err();
            assert!(matches!(err, SpecError::InvalidUser { .. }), "{bad}");
        }
    }

    #[test]
    fn cri_user_overrides_image_user() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        let s = SecurityContext {
            run_as_user: Some(33),
            ..sc()
        };
        assert_eq!(
            ids(&resolve_user(RootFs::Dir(r.path()), &s, "alice").unwrap()),
            (33, 33, vec![33])
        );
        let s = SecurityContext {
            run_as_user: Some(33),
            run_as_username: "alice".into(),
            ..sc()
        };
        // The username wins over the uid.
        assert_eq!(
            resolve_user(RootFs::Dir(r.path()), &s, "").unwrap().uid(),
            1000
        );
        let s = SecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(50),
            ..sc()
        };
        assert_eq!(
            ids(&resolve_user(RootFs::Dir(r.path()), &s, "").unwrap()),
            (1000, 50, vec![10, 29, 50])
        );
    }

    #[test]
    fn group_without_user_is_an_error() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        let s = SecurityContext {
            run_as_group: Some(5),
            ..sc()
        };
        let err = resolve_user(RootFs::Dir(r.path()), &s, "alice").unwrap_err();
        assert!(matches!(err, SpecError::GroupWithoutUser { .. }));
    }

    #[test]
    fn negative_ids_are_errors() {
        let r = rootfs(None, None);
        let s = SecurityContext {
            run_as_user: Some(-1),
            ..sc()
        };
        assert!(matches!(
            resolve_user(RootFs::Dir(r.path()), &s, "").unwrap_err(),
            SpecError::InvalidId {
                field: "run_as_user",
                ..
            }
        ));
        let s = SecurityContext {
            supplemental_groups: vec![-3],
            ..sc()
        };
        assert!(matches!(
            resolve_user(RootFs::Dir(r.path()), &s, "").unwrap_err(),
            SpecError::InvalidId {
                field: "supplemental_groups",
                ..
            }
        ));
    }

    #[test]
    fn supplemental_groups_merge_dedup_and_strict() {
        let r = rootfs(Some(PASSWD), Some(GROUP));
        let s = SecurityContext {
            supplemental_groups: vec![29, 5000, 1000],
            ..sc()
        };
        assert_eq!(
            ids(&resolve_user(RootFs::Dir(r.path()), &s, "alice").unwrap()).2,
            vec![10, 29, 1000, 5000]
        );
        let s = SecurityContext {
            supplemental_groups: vec![5000],
            supplemental_groups_policy: SupplementalGroupsPolicy::Strict,
            ..sc()
        };
        assert_eq!(
            ids(&resolve_user(RootFs::Dir(r.path()), &s, "alice").unwrap()).2,
            vec![1000, 5000]
        );
    }

    #[test]
    fn a_passwd_fifo_in_the_image_is_refused_not_read() {
        let r = rootfs(None, None);
        let _ = fs::remove_file(r.path().join("etc/passwd"));
        nix::unistd::mkfifo(
            &r.path().join("etc/passwd"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let err = resolve_user(RootFs::Dir(r.path()), &sc(), "img").unwrap_err();
        assert!(
            matches!(&err, SpecError::ReadUserDb { source, .. } if source.kind() == io::ErrorKind::InvalidInput),
            "{err}"
        );
    }

    #[test]
    fn passwd_symlink_is_resolved_inside_the_rootfs() {
        let r = rootfs(None, None);
        fs::create_dir_all(r.path().join("data")).unwrap();
        fs::write(r.path().join("data/passwd"), "img:x:7:8::/:/bin/sh\n").unwrap();
        // An absolute target must land inside the rootfs, not on the host's /data.
        std::os::unix::fs::symlink("/data/passwd", r.path().join("etc/passwd")).unwrap();
        let u = resolve_user(RootFs::Dir(r.path()), &sc(), "img").unwrap();
        assert_eq!((u.uid(), u.gid()), (7, 8));
        // `..` cannot climb out either.
        std::os::unix::fs::symlink("../../../../../../etc/hostname", r.path().join("etc/group"))
            .unwrap();
        let got = resolve_in_root(r.path(), Path::new("etc/group")).unwrap();
        assert_eq!(got, r.path().join("etc/hostname"));
    }
}
