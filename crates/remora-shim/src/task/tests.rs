//! Tests of the task logic over recording fakes ([`super::fakes`]): the process states, the
//! events and their order, the OCI runtime calls, and the errors containerd gets.

use std::time::{Duration, SystemTime};

use super::fakes::{Call, Harness, EXEC_PID, HOST_PID_NS, INIT_PID, OWN_PID_NS, POD_HOLDER};
use super::*;
use crate::bundle::{ExitRecord, EXIT_FILE};
use crate::process::to_ns;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(123)
}

fn exec(id: &str, exec_id: &str) -> NewExec {
    NewExec {
        id: id.into(),
        exec_id: exec_id.into(),
        spec: br#"{"args":["sh"]}"#.to_vec(),
        ..NewExec::default()
    }
}

fn is_wrong_state(r: Result<impl std::fmt::Debug, ShimError>, want: &str) {
    match r {
        Err(ShimError::WrongState { state, .. }) => assert_eq!(state, want),
        other => panic!("not WrongState({want}): {other:?}"),
    }
}

#[tokio::test]
async fn create_start_exit_delete_moves_through_the_states_in_order() {
    let h = Harness::new();
    let pid = h.create("c1", OWN_PID_NS).await.unwrap();
    assert_eq!(pid, INIT_PID);
    let st = h.tasks.state("c1", "").unwrap();
    assert_eq!(
        (st.status, st.pid, st.exit),
        (ProcStatus::Created, pid, None)
    );
    assert_eq!(st.id, "c1");
    assert_eq!(st.bundle, h.dir.path().join("c1").display().to_string());
    assert!(
        h.exits.watched(pid),
        "the init's exit is watched from create on"
    );

    assert_eq!(h.tasks.start("c1", "").await.unwrap(), pid);
    assert_eq!(h.tasks.state("c1", "").unwrap().status, ProcStatus::Running);

    h.exits.exit(pid, 3, at(1_700_000_000));
    let exited = h.wait("c1", "").await;
    assert_eq!(exited.status, 3);
    assert_eq!(exited.at, at(1_700_000_000));
    let st = h.tasks.state("c1", "").unwrap();
    assert_eq!(st.status, ProcStatus::Stopped);
    assert_eq!(st.exit, Some(exited));
    // The exit is in the bundle too, for a delete after the shim died.
    let record: ExitRecord =
        serde_json::from_slice(&std::fs::read(h.dir.path().join("c1").join(EXIT_FILE)).unwrap())
            .unwrap();
    assert_eq!(
        (record.pid, record.status, record.oom_killed),
        (pid, 3, false)
    );
    assert_eq!(record.exited_at_ns, to_ns(at(1_700_000_000)));

    let d = h.tasks.delete("c1", "").await.unwrap();
    assert_eq!(d, Deleted { pid, exit: exited });
    assert!(matches!(
        h.tasks.state("c1", ""),
        Err(ShimError::ContainerNotFound { .. })
    ));
    assert!(h.tasks.is_empty());

    let bundle = h.dir.path().join("c1");
    assert_eq!(
        h.runtime.calls(),
        vec![
            Call::Create {
                id: "c1".into(),
                bundle
            },
            Call::Start("c1".into()),
            // Not forced: the container has stopped. Its own pid namespace: no kill on exit.
            Call::Delete {
                id: "c1".into(),
                force: false
            },
        ]
    );
    assert_eq!(h.events.kinds(), ["create", "start", "exit", "delete"]);
    let events = h.events.all();
    let (Event::Create(c), Event::Exit(x), Event::Delete(d)) = (&events[0], &events[2], &events[3])
    else {
        panic!("{events:?}");
    };
    assert_eq!((c.container_id.as_str(), c.pid), ("c1", pid));
    assert_eq!((x.container_id.as_str(), x.id.as_str()), ("c1", "c1"));
    assert_eq!((x.pid, x.exit_status), (pid, 3));
    assert_eq!(x.exited_at.seconds, 1_700_000_000);
    assert_eq!(x.exited_at.nanos, 123);
    assert_eq!(
        (d.pid, d.exit_status, d.exited_at.seconds),
        (pid, 3, 1_700_000_000)
    );
}

#[tokio::test]
async fn an_exit_during_start_is_published_after_task_start() {
    let h = Harness::new();
    h.create("c1", OWN_PID_NS).await.unwrap();
    let exits = h.exits.clone();
    h.runtime
        .during_start(move || exits.exit(INIT_PID, 1, at(1_700_000_001)));
    h.tasks.start("c1", "").await.unwrap();
    assert_eq!(h.wait("c1", "").await.status, 1);
    assert_eq!(h.events.kinds(), ["create", "start", "exit"]);
    assert_eq!(h.tasks.state("c1", "").unwrap().status, ProcStatus::Stopped);
}

#[tokio::test]
async fn an_init_sharing_the_pid_namespace_has_the_rest_killed_before_its_exit_goes_out() {
    let h = Harness::new();
    h.create("c1", HOST_PID_NS).await.unwrap();
    h.tasks.start("c1", "").await.unwrap();
    h.exits.exit(INIT_PID, 0, at(1_700_000_000));
    h.wait("c1", "").await;
    assert_eq!(
        h.runtime.calls().last(),
        Some(&Call::Kill {
            id: "c1".into(),
            signal: libc::SIGKILL as u32,
            all: true
        })
    );
}

#[tokio::test]
async fn unknown_ids_are_not_found() {
    let h = Harness::new();
    let none = |r: Result<(), ShimError>| {
        assert!(
            matches!(r, Err(ShimError::ContainerNotFound { ref id }) if id == "nope"),
            "{r:?}"
        )
    };
    none(h.tasks.start("nope", "").await.map(drop));
    none(h.tasks.delete("nope", "").await.map(drop));
    none(h.tasks.kill("nope", "", 9, false).await);
    none(h.tasks.state("nope", "").map(drop));
    none(h.tasks.wait("nope", "").await.map(drop));
    none(h.tasks.pids("nope").await.map(drop));
    none(h.tasks.pause_or_resume("nope", true).await);
    none(h.tasks.update("nope", b"{}").await);
    none(h.tasks.stats("nope").map(drop));
    none(h.tasks.exec(exec("nope", "e1")).await);
    none(h.tasks.close_io("nope", "", true));
    assert_eq!(h.tasks.task_pid("nope"), None);

    h.running("c1").await;
    let no_exec = |r: Result<(), ShimError>| {
        assert!(
            matches!(r, Err(ShimError::ExecNotFound { ref id, ref exec_id }) if id == "c1" && exec_id == "e9"),
            "{r:?}"
        )
    };
    no_exec(h.tasks.start("c1", "e9").await.map(drop));
    no_exec(h.tasks.delete("c1", "e9").await.map(drop));
    no_exec(h.tasks.kill("c1", "e9", 9, false).await);
    no_exec(h.tasks.state("c1", "e9").map(drop));
    no_exec(h.tasks.wait("c1", "e9").await.map(drop));
    no_exec(h.tasks.resize_pty("c1", "e9", 80, 24));
    // None of them reached the runtime.
    assert_eq!(
        h.runtime
            .calls()
            .iter()
            .filter(|c| !matches!(c, Call::Create { .. } | Call::Start(_)))
            .count(),
        0
    );
}

#[tokio::test]
async fn a_second_create_of_an_id_is_refused_as_are_an_empty_id_and_a_checkpoint() {
    let h = Harness::new();
    h.create("c1", OWN_PID_NS).await.unwrap();
    assert!(matches!(
        h.create("c1", OWN_PID_NS).await,
        Err(ShimError::AlreadyExists { what: "container", ref id }) if id == "c1"
    ));
    assert!(matches!(
        h.create("", OWN_PID_NS).await,
        Err(ShimError::InvalidArgument { field: "id", .. })
    ));
    let mut t = h.new_task("c2", OWN_PID_NS);
    t.checkpoint = "/ckpt".into();
    assert!(matches!(
        h.tasks.create(t).await,
        Err(ShimError::Unimplemented(_))
    ));
    assert_eq!(h.runtime.calls().len(), 1, "{:?}", h.runtime.calls());
    assert_eq!(h.events.kinds(), ["create"]);
}

#[tokio::test]
async fn a_failed_runtime_create_is_rolled_back_and_leaves_no_container() {
    let h = Harness::new();
    h.runtime.fail_next(
        "create",
        RuncError::Failed {
            command: "runc create".into(),
            id: "c1".into(),
            status: 1,
            message: "no such file".into(),
        },
    );
    assert!(matches!(
        h.create("c1", OWN_PID_NS).await,
        Err(ShimError::Runc(RuncError::Failed { .. }))
    ));
    assert_eq!(
        h.runtime.calls()[1..],
        [Call::Delete {
            id: "c1".into(),
            force: true
        }]
    );
    assert!(h.tasks.is_empty());
    assert!(h.events.all().is_empty());
    // The id is free again.
    h.create("c1", OWN_PID_NS).await.unwrap();
}

#[tokio::test]
async fn a_second_start_is_wrong_state_and_does_not_reach_the_runtime() {
    let h = Harness::new();
    h.running("c1").await;
    is_wrong_state(h.tasks.start("c1", "").await, "running");
    let starts = h
        .runtime
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Start(_)))
        .count();
    assert_eq!(starts, 1);
    assert_eq!(h.events.kinds(), ["create", "start"]);
}

#[tokio::test]
async fn a_running_or_paused_process_cannot_be_deleted_a_created_one_is_force_deleted() {
    let h = Harness::new();
    h.running("c1").await;
    is_wrong_state(h.tasks.delete("c1", "").await, "running");
    h.tasks.pause_or_resume("c1", true).await.unwrap();
    is_wrong_state(h.tasks.delete("c1", "").await, "paused");
    assert!(h.tasks.state("c1", "").is_ok(), "still there");

    h.create("c2", OWN_PID_NS).await.unwrap();
    let d = h.tasks.delete("c2", "").await.unwrap();
    // Never ran: exit status 0, pid the created one's.
    assert_eq!((d.pid, d.exit.status), (INIT_PID, 0));
    assert_eq!(
        h.runtime.calls().last(),
        Some(&Call::Delete {
            id: "c2".into(),
            force: true
        })
    );
}

#[tokio::test]
async fn a_runtime_that_no_longer_knows_the_container_does_not_fail_its_delete() {
    let h = Harness::new();
    h.create("c1", OWN_PID_NS).await.unwrap();
    h.runtime.fail_next(
        "delete",
        RuncError::NotFound {
            command: "runc delete".into(),
            id: "c1".into(),
        },
    );
    h.tasks.delete("c1", "").await.unwrap();
    assert!(h.tasks.is_empty());

    h.create("c2", OWN_PID_NS).await.unwrap();
    h.runtime.fail_next(
        "delete",
        RuncError::Failed {
            command: "runc delete".into(),
            id: "c2".into(),
            status: 1,
            message: "device busy".into(),
        },
    );
    assert!(matches!(
        h.tasks.delete("c2", "").await,
        Err(ShimError::Runc(RuncError::Failed { .. }))
    ));
    assert!(h.tasks.state("c2", "").is_ok(), "kept for another delete");
}

#[tokio::test]
async fn kill_goes_to_the_runtime_and_a_finished_process_is_not_found() {
    let h = Harness::new();
    h.running("c1").await;
    h.tasks.kill("c1", "", 15, true).await.unwrap();
    assert_eq!(
        h.runtime.calls().last(),
        Some(&Call::Kill {
            id: "c1".into(),
            signal: 15,
            all: true
        })
    );
    // The init died between the shim's check and the runtime's.
    h.runtime.fail_next(
        "kill",
        RuncError::Failed {
            command: "runc kill".into(),
            id: "c1".into(),
            status: 1,
            message: "container not running".into(),
        },
    );
    assert!(matches!(
        h.tasks.kill("c1", "", 9, false).await,
        Err(ShimError::ProcessFinished { ref id }) if id == "c1"
    ));
    h.runtime.fail_next(
        "kill",
        RuncError::Failed {
            command: "runc kill".into(),
            id: "c1".into(),
            status: 1,
            message: "permission denied".into(),
        },
    );
    assert!(matches!(
        h.tasks.kill("c1", "", 9, false).await,
        Err(ShimError::Runc(_))
    ));

    h.exits.exit(INIT_PID, 137, at(1_700_000_000));
    h.wait("c1", "").await;
    let calls = h.runtime.calls().len();
    assert!(matches!(
        h.tasks.kill("c1", "", 9, false).await,
        Err(ShimError::ProcessFinished { ref id }) if id == "c1"
    ));
    assert_eq!(
        h.runtime.calls().len(),
        calls,
        "an exited process is not signalled"
    );
}

#[tokio::test]
async fn an_exec_is_added_started_listed_exits_and_is_deleted() {
    let h = Harness::new();
    h.create("c1", OWN_PID_NS).await.unwrap();
    // Not in a created container.
    is_wrong_state(h.tasks.exec(exec("c1", "e1")).await, "created");
    h.tasks.start("c1", "").await.unwrap();

    assert!(matches!(
        h.tasks.exec(exec("c1", "")).await,
        Err(ShimError::InvalidArgument {
            field: "exec_id",
            ..
        })
    ));
    let mut no_spec = exec("c1", "e1");
    no_spec.spec.clear();
    assert!(matches!(
        h.tasks.exec(no_spec).await,
        Err(ShimError::InvalidArgument { field: "spec", .. })
    ));

    h.tasks.exec(exec("c1", "e1")).await.unwrap();
    assert!(matches!(
        h.tasks.exec(exec("c1", "e1")).await,
        Err(ShimError::AlreadyExists { what: "exec", ref id }) if id == "e1"
    ));
    let st = h.tasks.state("c1", "e1").unwrap();
    assert_eq!((st.id.as_str(), st.exec_id.as_str()), ("e1", "e1"));
    assert_eq!((st.status, st.pid), (ProcStatus::Created, 0));
    // A created exec has no process to signal.
    is_wrong_state(h.tasks.kill("c1", "e1", 9, false).await, "created");

    let pid = h.tasks.start("c1", "e1").await.unwrap();
    assert_eq!(pid, EXEC_PID);
    assert_eq!(
        h.runtime.calls().last(),
        Some(&Call::Exec {
            id: "c1".into(),
            spec: br#"{"args":["sh"]}"#.to_vec()
        })
    );
    is_wrong_state(h.tasks.start("c1", "e1").await, "running");
    is_wrong_state(h.tasks.delete("c1", "e1").await, "running");
    // The init is not the exec.
    assert_eq!(h.tasks.state("c1", "").unwrap().pid, INIT_PID);

    h.runtime.set_ps(vec![INIT_PID, pid, 77]);
    assert_eq!(
        h.tasks.pids("c1").await.unwrap(),
        [
            PidInfo {
                pid: INIT_PID,
                exec_id: None
            },
            PidInfo {
                pid,
                exec_id: Some("e1".into())
            },
            PidInfo {
                pid: 77,
                exec_id: None
            },
        ]
    );

    h.exits.exit(pid, 2, at(1_700_000_005));
    assert_eq!(h.wait("c1", "e1").await.status, 2);
    assert!(matches!(
        h.tasks.kill("c1", "e1", 9, false).await,
        Err(ShimError::ProcessFinished { ref id }) if id == "e1"
    ));
    // The init still runs.
    assert_eq!(h.tasks.state("c1", "").unwrap().status, ProcStatus::Running);

    let d = h.tasks.delete("c1", "e1").await.unwrap();
    assert_eq!(
        (d.pid, d.exit.status, d.exit.at),
        (pid, 2, at(1_700_000_005))
    );
    assert!(matches!(
        h.tasks.state("c1", "e1"),
        Err(ShimError::ExecNotFound { .. })
    ));
    // An exec's delete deletes nothing in the runtime and sends no TaskDelete.
    assert!(!h
        .runtime
        .calls()
        .iter()
        .any(|c| matches!(c, Call::Delete { .. })));
    assert_eq!(
        h.events.kinds(),
        ["create", "start", "exec-added", "exec-started", "exit"]
    );
    let events = h.events.all();
    let Event::Exit(x) = &events[4] else {
        panic!("{events:?}")
    };
    assert_eq!(
        (x.container_id.as_str(), x.id.as_str(), x.pid, x.exit_status),
        ("c1", "e1", pid, 2)
    );
    // The exec's pid file is gone.
    assert!(!h.dir.path().join("c1").join("exec-e1.pid").exists());
}

#[tokio::test]
async fn a_failed_exec_start_leaves_the_exec_created() {
    let h = Harness::new();
    h.running("c1").await;
    h.tasks.exec(exec("c1", "e1")).await.unwrap();
    h.runtime.fail_next(
        "exec",
        RuncError::Failed {
            command: "runc exec".into(),
            id: "c1".into(),
            status: 1,
            message: "exec failed".into(),
        },
    );
    assert!(matches!(
        h.tasks.start("c1", "e1").await,
        Err(ShimError::Runc(_))
    ));
    assert_eq!(
        h.tasks.state("c1", "e1").unwrap().status,
        ProcStatus::Created
    );
    assert!(!h.exits.watched(EXEC_PID));
    assert_eq!(h.events.kinds(), ["create", "start", "exec-added"]);
}

#[tokio::test]
async fn pause_and_resume_move_between_running_and_paused_only() {
    let h = Harness::new();
    h.create("c1", OWN_PID_NS).await.unwrap();
    is_wrong_state(h.tasks.pause_or_resume("c1", true).await, "created");
    h.tasks.start("c1", "").await.unwrap();
    is_wrong_state(h.tasks.pause_or_resume("c1", false).await, "running");

    h.tasks.pause_or_resume("c1", true).await.unwrap();
    assert_eq!(h.tasks.state("c1", "").unwrap().status, ProcStatus::Paused);
    is_wrong_state(h.tasks.pause_or_resume("c1", true).await, "paused");
    h.tasks.pause_or_resume("c1", false).await.unwrap();
    assert_eq!(h.tasks.state("c1", "").unwrap().status, ProcStatus::Running);

    // A failed pause changes nothing.
    h.runtime.fail_next(
        "pause",
        RuncError::Failed {
            command: "runc pause".into(),
            id: "c1".into(),
            status: 1,
            message: "freezer".into(),
        },
    );
    assert!(h.tasks.pause_or_resume("c1", true).await.is_err());
    assert_eq!(h.tasks.state("c1", "").unwrap().status, ProcStatus::Running);

    let calls: Vec<Call> = h.runtime.calls().into_iter().skip(2).collect();
    assert_eq!(
        calls,
        [
            Call::Pause("c1".into()),
            Call::Resume("c1".into()),
            Call::Pause("c1".into())
        ]
    );
    assert_eq!(h.events.kinds(), ["create", "start", "paused", "resumed"]);
}

#[tokio::test]
async fn update_passes_the_resources_and_refuses_none() {
    let h = Harness::new();
    h.running("c1").await;
    assert!(matches!(
        h.tasks.update("c1", b"").await,
        Err(ShimError::InvalidArgument {
            field: "resources",
            ..
        })
    ));
    h.tasks.update("c1", br#"{"cpu":{}}"#).await.unwrap();
    assert_eq!(
        h.runtime.calls().last(),
        Some(&Call::Update {
            id: "c1".into(),
            resources: br#"{"cpu":{}}"#.to_vec()
        })
    );
}

#[tokio::test]
async fn a_container_without_a_cgroup_has_no_stats() {
    let h = Harness::new();
    // The fake pid has no /proc entry, so no cgroup.
    h.running("c1").await;
    is_wrong_state(h.tasks.stats("c1"), "cgroup-less");
}

#[tokio::test]
async fn a_pod_holder_runs_nothing_and_a_kill_ends_it_with_128_plus_the_signal() {
    let h = Harness::new();
    let pid = h.create("pod", POD_HOLDER).await.unwrap();
    assert_eq!(pid, std::process::id());
    assert_eq!(h.tasks.start("pod", "").await.unwrap(), pid);
    assert_eq!(
        h.tasks.state("pod", "").unwrap().status,
        ProcStatus::Running
    );
    assert_eq!(h.tasks.task_pid("pod"), Some(pid));
    assert!(h.tasks.pids("pod").await.unwrap().is_empty());
    is_wrong_state(
        h.tasks.exec(exec("pod", "e1")).await,
        "a pod holder, which runs no process",
    );
    is_wrong_state(
        h.tasks.pause_or_resume("pod", true).await,
        "a pod holder, which runs no process",
    );
    is_wrong_state(
        h.tasks.update("pod", b"{}").await,
        "a pod holder, which runs no process",
    );

    // Signal 0 only asks.
    h.tasks.kill("pod", "", 0, false).await.unwrap();
    assert_eq!(
        h.tasks.state("pod", "").unwrap().status,
        ProcStatus::Running
    );
    h.tasks.kill("pod", "", 15, false).await.unwrap();
    assert_eq!(h.wait("pod", "").await.status, 128 + 15);
    assert_eq!(
        h.tasks.state("pod", "").unwrap().status,
        ProcStatus::Stopped
    );
    assert!(matches!(
        h.tasks.kill("pod", "", 9, false).await,
        Err(ShimError::ProcessFinished { .. })
    ));
    let d = h.tasks.delete("pod", "").await.unwrap();
    assert_eq!((d.pid, d.exit.status), (pid, 143));

    assert!(h.runtime.calls().is_empty(), "{:?}", h.runtime.calls());
    assert_eq!(h.events.kinds(), ["create", "start", "exit", "delete"]);
    let record: ExitRecord =
        serde_json::from_slice(&std::fs::read(h.dir.path().join("pod").join(EXIT_FILE)).unwrap())
            .unwrap();
    assert_eq!((record.pid, record.status), (pid, 143));
}

#[test]
fn exec_pid_files_keep_a_short_safe_name() {
    assert_eq!(short("abc/../def-01_x"), "abcdef-01_x");
    assert_eq!(short(&"x".repeat(64)).len(), 32);
}
