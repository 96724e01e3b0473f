//! Tests of the ttrpc adapter over the task logic's fakes: requests unpacked, answers packed,
//! and each failure the ttrpc status containerd maps back to its error kinds.

use std::time::{Duration, SystemTime};

use containerd_shim_protos::api::CheckpointTaskRequest;
use containerd_shim_protos::types::task::Status;
use slog::o;
use ttrpc::Code;

use super::*;
use crate::task::fakes::{Harness, EXEC_PID, INIT_PID, OWN_PID_NS};

fn service(h: &Harness) -> (Service, Arc<Notify>) {
    let shutdown = Arc::new(Notify::new());
    let log = Logger::root(slog::Discard, o!());
    (
        Service::over(h.tasks.clone(), shutdown.clone(), log),
        shutdown,
    )
}

fn ctx() -> TtrpcContext {
    TtrpcContext::default()
}

/// The status code and message of a failed call.
fn status<T: std::fmt::Debug>(r: ttrpc::Result<T>) -> (Code, String) {
    match r {
        Err(ttrpc::Error::RpcStatus(s)) => (s.code(), s.message().to_string()),
        other => panic!("not a status: {other:?}"),
    }
}

fn create_req(h: &Harness, id: &str) -> CreateTaskRequest {
    let mut req = CreateTaskRequest::new();
    req.id = id.into();
    req.bundle = h.bundle(id, OWN_PID_NS).display().to_string();
    req
}

fn start_req(id: &str, exec_id: &str) -> StartRequest {
    let mut req = StartRequest::new();
    req.id = id.into();
    req.exec_id = exec_id.into();
    req
}

#[tokio::test]
async fn a_lifecycle_answers_with_the_pids_states_and_exit() {
    let h = Harness::new();
    let (svc, _) = service(&h);
    let created = svc.create(&ctx(), create_req(&h, "c1")).await.unwrap();
    assert_eq!(created.pid, INIT_PID);
    let started = svc.start(&ctx(), start_req("c1", "")).await.unwrap();
    assert_eq!(started.pid, INIT_PID);

    let mut sreq = StateRequest::new();
    sreq.id = "c1".into();
    let st = svc.state(&ctx(), sreq.clone()).await.unwrap();
    assert_eq!((st.id.as_str(), st.pid), ("c1", INIT_PID));
    assert_eq!(st.status.enum_value(), Ok(Status::RUNNING));
    assert!(st.exited_at.is_none());

    let mut creq = ConnectRequest::new();
    creq.id = "c1".into();
    let conn = svc.connect(&ctx(), creq).await.unwrap();
    assert_eq!(
        (conn.shim_pid, conn.task_pid),
        (std::process::id(), INIT_PID)
    );

    let at = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
    h.exits.exit(INIT_PID, 137, at);
    let mut wreq = WaitRequest::new();
    wreq.id = "c1".into();
    let waited = tokio::time::timeout(crate::task::fakes::DEADLINE, svc.wait(&ctx(), wreq))
        .await
        .expect("no exit within the deadline")
        .unwrap();
    assert_eq!(waited.exit_status, 137);
    assert_eq!(
        (waited.exited_at.seconds, waited.exited_at.nanos),
        (1_700_000_000, 5)
    );
    let st = svc.state(&ctx(), sreq).await.unwrap();
    assert_eq!(st.status.enum_value(), Ok(Status::STOPPED));
    assert_eq!((st.exit_status, st.exited_at.seconds), (137, 1_700_000_000));

    let mut dreq = DeleteRequest::new();
    dreq.id = "c1".into();
    let deleted = svc.delete(&ctx(), dreq).await.unwrap();
    assert_eq!((deleted.pid, deleted.exit_status), (INIT_PID, 137));
    assert_eq!(deleted.exited_at.nanos, 5);
}

#[tokio::test]
async fn failures_reach_containerd_as_their_status_codes() {
    let h = Harness::new();
    let (svc, _) = service(&h);

    let mut sreq = StateRequest::new();
    sreq.id = "nope".into();
    assert_eq!(
        status(svc.state(&ctx(), sreq).await),
        (Code::NOT_FOUND, "container nope not found".to_string())
    );

    svc.create(&ctx(), create_req(&h, "c1")).await.unwrap();
    assert_eq!(
        status(svc.create(&ctx(), create_req(&h, "c1")).await).0,
        Code::ALREADY_EXISTS
    );
    svc.start(&ctx(), start_req("c1", "")).await.unwrap();
    assert_eq!(
        status(svc.start(&ctx(), start_req("c1", "")).await),
        (
            Code::FAILED_PRECONDITION,
            "c1: cannot start a running process".to_string()
        )
    );
    let mut dreq = DeleteRequest::new();
    dreq.id = "c1".into();
    assert_eq!(
        status(svc.delete(&ctx(), dreq).await).0,
        Code::FAILED_PRECONDITION
    );

    // An exec without a process spec.
    let mut ereq = ExecProcessRequest::new();
    ereq.id = "c1".into();
    ereq.exec_id = "e1".into();
    assert_eq!(
        status(svc.exec(&ctx(), ereq).await),
        (
            Code::INVALID_ARGUMENT,
            "invalid spec: no process spec".to_string()
        )
    );
    assert_eq!(
        status(svc.start(&ctx(), start_req("c1", "e1")).await).0,
        Code::NOT_FOUND
    );

    let mut ureq = UpdateTaskRequest::new();
    ureq.id = "c1".into();
    assert_eq!(
        status(svc.update(&ctx(), ureq).await).0,
        Code::INVALID_ARGUMENT
    );
    assert_eq!(
        status(svc.checkpoint(&ctx(), CheckpointTaskRequest::new()).await).0,
        Code::UNIMPLEMENTED
    );

    h.exits
        .exit(INIT_PID, 0, SystemTime::UNIX_EPOCH + Duration::from_secs(1));
    h.wait("c1", "").await;
    let mut kreq = KillRequest::new();
    kreq.id = "c1".into();
    kreq.signal = 9;
    assert_eq!(
        status(svc.kill(&ctx(), kreq).await),
        (Code::NOT_FOUND, "process c1 already finished".to_string())
    );
}

#[tokio::test]
async fn an_exec_is_unpacked_and_pids_name_it() {
    let h = Harness::new();
    let (svc, _) = service(&h);
    svc.create(&ctx(), create_req(&h, "c1")).await.unwrap();
    svc.start(&ctx(), start_req("c1", "")).await.unwrap();

    let mut ereq = ExecProcessRequest::new();
    ereq.id = "c1".into();
    ereq.exec_id = "e1".into();
    let out = h.dir.path().join("e1.out");
    std::fs::write(&out, "").unwrap();
    ereq.stdout = out.display().to_string();
    let mut spec = Any::new();
    spec.value = br#"{"args":["true"]}"#.to_vec();
    ereq.spec = MessageField::some(spec);
    svc.exec(&ctx(), ereq).await.unwrap();
    let mut sreq = StateRequest::new();
    sreq.id = "c1".into();
    sreq.exec_id = "e1".into();
    let st = svc.state(&ctx(), sreq).await.unwrap();
    assert_eq!((st.id.as_str(), st.exec_id.as_str()), ("e1", "e1"));
    assert_eq!(st.stdout, out.display().to_string());
    assert_eq!(st.status.enum_value(), Ok(Status::CREATED));

    let pid = h.tasks.start("c1", "e1").await.unwrap();
    assert_eq!(pid, EXEC_PID);
    h.runtime.set_ps(vec![INIT_PID, pid]);
    let mut preq = PidsRequest::new();
    preq.id = "c1".into();
    let pids = svc.pids(&ctx(), preq).await.unwrap();
    assert_eq!(pids.processes.len(), 2);
    assert_eq!(pids.processes[0].pid, INIT_PID);
    assert!(pids.processes[0].info.is_none());
    let info = pids.processes[1].info.as_ref().unwrap();
    assert_eq!(info.type_url, "containerd.runc.v1.ProcessDetails");
    let details = ProcessDetails::parse_from_bytes(&info.value).unwrap();
    assert_eq!(details.exec_id, "e1");
}

#[tokio::test]
async fn shutdown_waits_for_the_last_container_unless_now() {
    let h = Harness::new();
    let (svc, shutdown) = service(&h);
    svc.create(&ctx(), create_req(&h, "c1")).await.unwrap();
    svc.shutdown(&ctx(), ShutdownRequest::new()).await.unwrap();
    let notified = shutdown.notified();
    tokio::pin!(notified);
    // `enable` is true when a notification is already there.
    assert!(
        !notified.as_mut().enable(),
        "shut down with a container left"
    );

    let mut now = ShutdownRequest::new();
    now.now = true;
    svc.shutdown(&ctx(), now).await.unwrap();
    assert!(notified.as_mut().enable());
}
