//! NRI's hooks in the lifecycle, over the recording [`FakeNri`]: where each is called among
//! the operation's steps, whether its object is listed meanwhile, what a refusal undoes, and
//! that the stop events are sent once.

use super::fakes::{Call, FakeNri};
use super::*;
use crate::backend_error::BackendCode;

/// The position of the first call equal to `call`; panics naming it when absent.
fn position(calls: &[Call], call: &Call) -> usize {
    calls
        .iter()
        .position(|c| c == call)
        .unwrap_or_else(|| panic!("no {call:?} in {calls:?}"))
}

fn count(calls: &[Call], op: &str) -> usize {
    calls.iter().filter(|c| c.op() == op).count()
}

fn nri(op: &'static str, id: &str, listed: bool) -> Call {
    Call::Nri(op, id.to_string(), listed)
}

#[tokio::test]
async fn run_pod_sandbox_hook_runs_on_the_made_pod_before_it_is_listed() {
    let b = bed();
    FakeNri::install(b.log.clone(), &b.pods);
    let id = b.pods.run_sandbox(pod_request()).await.expect("a pod");
    let calls = b.log.calls();
    let hook = position(&calls, &nri("nri.run_pod_sandbox", &id, false));
    assert!(position(&calls, &Call::TaskStart(id.clone())) < hook);
    assert_eq!(
        b.pods
            .sandboxes
            .get(&id)
            .expect("listed after")
            .snapshot()
            .status
            .state,
        SandboxState::Ready
    );
}

#[tokio::test]
async fn a_refused_run_pod_sandbox_fails_undoes_the_pod_and_a_retry_works() {
    let b = bed();
    FakeNri::install(b.log.clone(), &b.pods);
    b.log.fail("nri.run_pod_sandbox", 1);
    let (err, id, netns) = run_sandbox_failing(&b).await;
    match &err {
        SandboxError::Nri(nri) => {
            assert_eq!(nri.code(), Some(BackendCode::Unknown), "its own code")
        }
        other => panic!("{other:?}"),
    }
    // Everything the pod was made of, undone newest first.
    let undo: Vec<Call> = sandbox_undo(&id, &netns)
        .into_iter()
        .rev()
        .flat_map(|(_, c)| c)
        .collect();
    assert_eq!(b.log.after_failure(), undo);
    assert_pod_undone(&b, &id, "nri.run_pod_sandbox");
    b.pods.run_sandbox(pod_request()).await.expect("the retry");
}

#[tokio::test]
async fn create_container_hook_adjusts_the_spec_before_the_record_and_hides_the_container() {
    let (b, pod) = bed_with_pod().await;
    FakeNri::install(b.log.clone(), &b.pods);
    let id = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect("a container");
    let calls = b.log.calls();
    let hook = position(&calls, &nri("nri.create_container", &id, false));
    assert!(hook < position(&calls, &Call::RecordCreate(id.clone())));
    assert!(hook < position(&calls, &nri("nri.post_create_container", &id, true)));
    let record = b.containerd.record(&id).expect("the record");
    let spec: oci_spec::runtime::Spec = serde_json::from_slice(&record.spec).expect("a spec");
    let env = spec.process().as_ref().and_then(|p| p.env().clone());
    assert!(
        env.unwrap_or_default().contains(&"NRI_ADDED=1".to_string()),
        "the adjustment is in the record's spec"
    );
}

#[tokio::test]
async fn a_refused_create_container_fails_and_leaves_nothing() {
    let (b, pod) = bed_with_pod().await;
    FakeNri::install(b.log.clone(), &b.pods);
    b.log.fail("nri.create_container", 1);
    let err = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect_err("the scripted refusal");
    assert!(matches!(err, ContainerError::Nri(_)), "{err:?}");
    let id = first_id(&b.log);
    assert_eq!(
        b.log.after_failure(),
        [
            Call::SnapshotRemove(id.clone()),
            Call::LeaseDelete(creation_lease_id(&id))
        ]
    );
    assert!(!b.containerd.has_record(&id));
    assert!(b.pods.containers_store.get(&id).is_err());
    assert_eq!(
        b.pods
            .names
            .holder(&container_name_key("app", "web", "default", "uid-1", 0)),
        None
    );
    b.pods
        .create_container(create_request(&pod))
        .await
        .expect("the retry");
}

#[tokio::test]
async fn start_container_hook_runs_between_task_create_and_start() {
    let (b, _pod, id) = bed_with_container().await;
    FakeNri::install(b.log.clone(), &b.pods);
    b.pods.start_container(&id).await.expect("started");
    let calls = b.log.calls();
    let hook = position(&calls, &nri("nri.start_container", &id, true));
    assert!(position(&calls, &Call::TaskCreate(id.clone())) < hook);
    assert!(hook < position(&calls, &Call::TaskStart(id.clone())));
    assert!(
        position(&calls, &Call::TaskStart(id.clone()))
            < position(&calls, &nri("nri.post_start_container", &id, true))
    );
}

#[tokio::test]
async fn a_refused_start_container_fails_and_deletes_the_task() {
    let (b, _pod, id) = bed_with_container().await;
    FakeNri::install(b.log.clone(), &b.pods);
    b.log.fail("nri.start_container", 1);
    let err = b.pods.start_container(&id).await.expect_err("refused");
    assert!(matches!(err, ContainerError::Nri(_)), "{err:?}");
    // The plugins hear it stopped; the task goes.
    assert_eq!(
        b.log.after_failure(),
        [
            nri("nri.stop_container", &id, true),
            Call::TaskDelete(id.clone())
        ]
    );
    assert!(!b.containerd.has_task(&id));
    assert!(!b.log.calls().contains(&Call::TaskStart(id.clone())));
}

#[tokio::test]
async fn stop_container_hook_is_sent_once_however_often_the_exit_is_handled() {
    let (b, _pod, id) = bed_with_container().await;
    FakeNri::install(b.log.clone(), &b.pods);
    b.pods.start_container(&id).await.expect("started");
    // The exit monitor and the event stream may handle one exit at once: both find it
    // unrecorded in their snapshots. Then a retry finds it recorded.
    let (first, second) = tokio::join!(
        b.pods.handle_exit(&id, 1, None),
        b.pods.handle_exit(&id, 1, None)
    );
    first.expect("handled");
    second.expect("handled beside");
    b.pods
        .handle_exit(&id, 1, None)
        .await
        .expect("handled again");
    let calls = b.log.calls();
    assert_eq!(count(&calls, "nri.stop_container"), 1, "{calls:?}");
    // Sent before the task delete that ends the exit's handling.
    assert!(
        position(&calls, &nri("nri.stop_container", &id, true))
            < position(&calls, &Call::TaskDelete(id.clone()))
    );
    b.pods.remove_container(&id).await.expect("removed");
    assert!(b
        .log
        .calls()
        .contains(&nri("nri.remove_container", &id, false)));
}

#[tokio::test]
async fn stop_pod_sandbox_hook_comes_after_its_containers_and_once() {
    let (b, pod, id) = bed_with_container().await;
    FakeNri::install(b.log.clone(), &b.pods);
    b.pods.start_container(&id).await.expect("started");
    b.pods.stop_sandbox(&pod).await.expect("stopped");
    b.pods.stop_sandbox(&pod).await.expect("stopped again");
    let calls = b.log.calls();
    assert_eq!(count(&calls, "nri.stop_pod_sandbox"), 1, "{calls:?}");
    let hook = position(&calls, &nri("nri.stop_pod_sandbox", &pod, true));
    // The container's task is gone before; the pod's task is killed after.
    assert!(position(&calls, &Call::TaskDelete(id.clone())) < hook);
    let pod_kill = calls
        .iter()
        .rposition(|c| matches!(c, Call::TaskKill(t, ..) if *t == pod))
        .expect("the pod's task killed");
    assert!(hook < pod_kill, "{calls:?}");
    b.pods.remove_sandbox(&pod).await.expect("removed");
    let calls = b.log.calls();
    assert!(calls.contains(&nri("nri.remove_pod_sandbox", &pod, false)));
    assert_eq!(count(&calls, "nri.stop_pod_sandbox"), 1, "{calls:?}");
}

#[tokio::test]
async fn a_create_failing_after_its_hook_tells_the_plugins_the_container_is_gone() {
    let (b, pod) = bed_with_pod().await;
    FakeNri::install(b.log.clone(), &b.pods);
    b.log.fail("containers.create", 1);
    let err = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect_err("the scripted failure");
    assert!(matches!(err, ContainerError::Containerd(_)), "{err:?}");
    let id = first_id(&b.log);
    assert_eq!(
        b.log.after_failure(),
        [
            nri("nri.stop_container", &id, false),
            nri("nri.remove_container", &id, false),
            Call::SnapshotRemove(id.clone()),
            Call::LeaseDelete(creation_lease_id(&id))
        ]
    );
}

#[tokio::test]
async fn a_refused_pod_update_fails_and_records_nothing() {
    let (b, pod) = bed_with_pod().await;
    FakeNri::install(b.log.clone(), &b.pods);
    b.log.fail("nri.update_pod_sandbox", 1);
    let resources = crate::spec::Resources {
        cpu_shares: 512,
        ..Default::default()
    };
    let err = b
        .pods
        .update_sandbox_resources(&pod, None, Some(&resources))
        .await
        .expect_err("refused");
    assert!(matches!(err, SandboxError::Nri(_)), "{err:?}");
    assert!(b.log.after_failure().is_empty(), "nothing recorded");
    let meta = b.pods.sandboxes.get(&pod).expect("the pod").metadata();
    assert!(meta.updated_resources.is_none());
    b.pods
        .update_sandbox_resources(&pod, None, Some(&resources))
        .await
        .expect("the retry");
    let calls = b.log.calls();
    assert!(
        position(
            &calls,
            &Call::RecordSetExtension(pod.clone(), SANDBOX_EXTENSION.into())
        ) < position(&calls, &nri("nri.post_update_pod_sandbox", &pod, true))
    );
}
