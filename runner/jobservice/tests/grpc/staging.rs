//! Artifact staging through the reverse retrieval protocol.

use std::collections::HashMap;
use std::path::Path;

use refract_proto::job_api::job_state::Enum as State;
use refract_proto::job_api::{GetJobStateRequest, JobMessagesRequest, RunJobRequest};
use refract_proto::pipeline::ArtifactFilePayload;
use refract_proto::prost::Message;
use refract_proto::tonic::Code;
use refract_proto::urns;

use crate::harness::*;

/// Every file below `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test]
async fn stages_deduplicated_chunked_artifacts_inside_the_job_dir() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;

    let small = b"pickled main session".to_vec();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let main_session = file_artifact("/src/main_session.pkl", "pickled_main_session", "");
    let evil = file_artifact("/src/big.bin", "../../etc/x", "");
    let mut main_session_other_role = main_session.clone();
    main_session_other_role.role_urn = "beam:artifact:role:pip_requirements_file:v1".into();
    main_session_other_role.role_payload = vec![];
    let envs = vec![
        ("py", vec![main_session.clone(), evil.clone()]),
        ("py2", vec![main_session_other_role.clone()]),
    ];
    let prepared = jobs
        .prepare(prepare_request(
            pipeline(envs, "beam:transform:impulse:v1"),
            "done",
        ))
        .await
        .unwrap()
        .into_inner();
    let id = prepared.preparation_id;
    let endpoint = prepared.artifact_staging_endpoint.unwrap().url;

    let files: HashMap<String, Vec<u8>> = [
        ("/src/main_session.pkl".to_string(), small.clone()),
        ("/src/big.bin".to_string(), big.clone()),
    ]
    .into();
    let mut staging = server.staging(&endpoint).await;
    let offered = offer_artifacts(
        &mut staging,
        &prepared.staging_session_token,
        &files,
        64 * 1024,
    )
    .await
    .unwrap();
    // One request per distinct artifact, whatever its roles.
    let mut requested = offered.requested.clone();
    requested.sort();
    assert_eq!(requested, ["/src/big.bin", "/src/main_session.pkl"]);

    // A second offer for a finished session has nothing left to ask for.
    let again = offer_artifacts(&mut staging, &id, &files, 1024)
        .await
        .unwrap();
    assert!(again.requested.is_empty());

    let seen = run_to_end(&mut jobs, &id).await;
    assert_eq!(seen.last(), Some(&State::Done));

    let snapshot = server.runner.started.lock()[&id].clone();
    let job_dir = server.staging_dir.canonicalize().unwrap().join(&id);
    assert_eq!(snapshot.artifact_dir, job_dir);

    let py = &snapshot.resolved["py"];
    assert_eq!(py.len(), 2);
    for (resolved, declared, bytes) in [(&py[0], &main_session, &small), (&py[1], &evil, &big)] {
        assert_eq!(resolved.type_urn, urns::artifact::FILE);
        assert_eq!(resolved.role_urn, declared.role_urn);
        assert_eq!(resolved.role_payload, declared.role_payload);
        let payload = ArtifactFilePayload::decode(resolved.type_payload.as_slice()).unwrap();
        let path = std::path::PathBuf::from(&payload.path);
        assert_eq!(path.parent(), Some(job_dir.as_path()), "{path:?}");
        assert!(!payload.path.contains(".."));
        assert_eq!(payload.sha256.len(), 64);
        assert_eq!(&snapshot.contents[&path], bytes);
    }
    let py2 = &snapshot.resolved["py2"];
    assert_eq!(py2.len(), 1);
    assert_eq!(py2[0].role_urn, main_session_other_role.role_urn);
    assert_eq!(py2[0].type_payload, py[0].type_payload);

    // Nothing escaped the staging dir, and the job's files are gone now
    // that it is done.
    for file in files_under(server.root.path()) {
        assert!(file.starts_with(&server.staging_dir), "{file:?}");
    }
    assert!(!server.root.path().join("a").join("etc").exists());
    assert!(!job_dir.exists());

    server.shutdown().await.unwrap();
}

/// Prepares a job declaring `artifacts` and stages them from `files`,
/// returning the job id and the paths the server asked for.
async fn stage_job(
    server: &Server,
    artifacts: Vec<refract_proto::pipeline::ArtifactInformation>,
    files: &HashMap<String, Vec<u8>>,
) -> (String, Vec<String>) {
    let mut jobs = server.jobs().await;
    let prepared = jobs
        .prepare(prepare_request(
            pipeline(vec![("java", artifacts)], "beam:transform:impulse:v1"),
            "done",
        ))
        .await
        .unwrap()
        .into_inner();
    let mut staging = server.staging(&server.addr.to_string()).await;
    let offered = offer_artifacts(&mut staging, &prepared.staging_session_token, files, 4096)
        .await
        .unwrap();
    (prepared.preparation_id, offered.requested)
}

#[tokio::test]
async fn artifacts_with_a_known_digest_are_not_transferred_again() {
    use sha2::Digest;
    let server = Server::start().await;
    let jar: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    let digest = hex::encode(sha2::Sha256::digest(&jar));
    let files: HashMap<String, Vec<u8>> = [
        ("/m2/beam-core.jar".to_string(), jar.clone()),
        ("/m2/other.jar".to_string(), b"other".to_vec()),
    ]
    .into();
    let declared = vec![
        file_artifact("/m2/beam-core.jar", "beam-core.jar", &digest),
        file_artifact("/m2/other.jar", "other.jar", ""),
    ];
    let (first, requested) = stage_job(&server, declared.clone(), &files).await;
    assert_eq!(requested, ["/m2/beam-core.jar", "/m2/other.jar"]);

    // The same jar, declared with its digest by the next job (from another
    // path): only the artifact without a digest is transferred.
    let mut moved = declared.clone();
    moved[0] = file_artifact("/elsewhere/beam-core.jar", "beam-core.jar", &digest);
    let (second, requested) = stage_job(&server, moved, &files).await;
    assert_eq!(requested, ["/m2/other.jar"]);

    let mut jobs = server.jobs().await;
    for id in [&first, &second] {
        let seen = run_to_end(&mut jobs, id).await;
        assert_eq!(seen.last(), Some(&State::Done));
    }
    // The second job saw the jar's bytes under its own directory.
    let snapshot = server.runner.started.lock()[&second].clone();
    let resolved = &snapshot.resolved["java"][0];
    let payload = ArtifactFilePayload::decode(resolved.type_payload.as_slice()).unwrap();
    assert_eq!(payload.sha256, digest);
    assert_eq!(
        &snapshot.contents[&std::path::PathBuf::from(&payload.path)],
        &jar
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_stored_artifact_that_changed_is_fetched_again() {
    use sha2::Digest;
    let server = Server::start().await;
    let jar = b"the real jar".to_vec();
    let digest = hex::encode(sha2::Sha256::digest(&jar));
    let files: HashMap<String, Vec<u8>> = [("/m2/a.jar".to_string(), jar.clone())].into();
    let declared = vec![file_artifact("/m2/a.jar", "a.jar", &digest)];
    let (first, requested) = stage_job(&server, declared.clone(), &files).await;
    assert_eq!(requested, ["/m2/a.jar"]);
    // Someone with access to the staging directory swaps the stored bytes
    // (a new file under the same name: the first job's own link keeps the
    // original).
    let shared = server.staging_dir.join(".by-sha256").join(&digest);
    std::fs::remove_file(&shared).unwrap();
    std::fs::write(&shared, b"tampered").unwrap();
    let (second, requested) = stage_job(&server, declared, &files).await;
    assert_eq!(requested, ["/m2/a.jar"], "the changed file was reused");

    let mut jobs = server.jobs().await;
    for id in [&first, &second] {
        let seen = run_to_end(&mut jobs, id).await;
        assert_eq!(seen.last(), Some(&State::Done));
    }
    let snapshot = server.runner.started.lock()[&second].clone();
    let resolved = &snapshot.resolved["java"][0];
    let payload = ArtifactFilePayload::decode(resolved.type_payload.as_slice()).unwrap();
    assert_eq!(
        &snapshot.contents[&std::path::PathBuf::from(&payload.path)],
        &jar
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn checksum_mismatch_fails_staging_and_the_job() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    let wrong = "0".repeat(64);
    let envs = vec![("py", vec![file_artifact("/src/a", "a", &wrong)])];
    let id = jobs
        .prepare(prepare_request(
            pipeline(envs, "beam:transform:impulse:v1"),
            "done",
        ))
        .await
        .unwrap()
        .into_inner()
        .preparation_id;
    let files: HashMap<String, Vec<u8>> = [("/src/a".to_string(), b"abc".to_vec())].into();
    let mut staging = server.staging(&server.addr.to_string()).await;
    let error = offer_artifacts(&mut staging, &id, &files, 2)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().contains("sha256"), "{}", error.message());

    let mut messages = jobs
        .get_message_stream(JobMessagesRequest { job_id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let seen = describe_messages(&drain(&mut messages).await.unwrap());
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen[1].starts_with("JobMessageError: artifact staging failed"),
        "{seen:?}"
    );
    assert_eq!(seen[2], "state Failed");

    let run = jobs
        .run(RunJobRequest {
            preparation_id: id,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(run.code(), Code::FailedPrecondition);
    assert!(files_under(&server.staging_dir).is_empty());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn unknown_token_and_client_abort_are_handled() {
    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    let mut staging = server.staging(&server.addr.to_string()).await;
    let unknown = offer_artifacts(&mut staging, "no-such-token", &HashMap::new(), 8)
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    // The client cannot provide the file: it aborts, the job fails.
    let envs = vec![("py", vec![file_artifact("/src/missing", "m", "")])];
    let id = jobs
        .prepare(prepare_request(
            pipeline(envs, "beam:transform:impulse:v1"),
            "done",
        ))
        .await
        .unwrap()
        .into_inner()
        .preparation_id;
    let error = offer_artifacts(&mut staging, &id, &HashMap::new(), 8)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::NotFound);
    let mut states = jobs
        .get_state_stream(GetJobStateRequest { job_id: id })
        .await
        .unwrap()
        .into_inner();
    // The server may notice the abort only after the subscription.
    let seen = read_states(&mut states).await;
    assert_eq!(seen.last(), Some(&State::Failed), "{seen:?}");
    server.shutdown().await.unwrap();
}

// Paused time: the sleep below ends only once every task (client and
// server) is idle, so Run has done all it can before the check.
#[tokio::test(start_paused = true)]
async fn run_waits_for_a_transfer_in_flight() {
    use refract_proto::job_api::artifact_response_wrapper::Response;
    use refract_proto::job_api::{ArtifactResponseWrapper, GetArtifactResponse};
    use tokio_stream::wrappers::ReceiverStream;

    let server = Server::start().await;
    let mut jobs = server.jobs().await;
    let envs = vec![("py", vec![file_artifact("/src/a", "a", "")])];
    let id = jobs
        .prepare(prepare_request(
            pipeline(envs, "beam:transform:impulse:v1"),
            "hang",
        ))
        .await
        .unwrap()
        .into_inner()
        .preparation_id;

    let mut staging = server.staging(&server.addr.to_string()).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ArtifactResponseWrapper {
        staging_token: id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut requests = staging
        .reverse_artifact_retrieval_service(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert!(requests.message().await.unwrap().is_some());
    let chunk = |data: &[u8], is_last| ArtifactResponseWrapper {
        is_last,
        response: Some(Response::GetArtifactResponse(GetArtifactResponse {
            data: data.to_vec(),
        })),
        ..Default::default()
    };
    tx.send(chunk(b"first half, ", false)).await.unwrap();

    let mut runner_client = jobs.clone();
    let run_id = id.clone();
    let run = tokio::spawn(async move {
        runner_client
            .run(RunJobRequest {
                preparation_id: run_id,
                ..Default::default()
            })
            .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        !run.is_finished(),
        "Run returned while staging was in flight"
    );

    tx.send(chunk(b"second half", false)).await.unwrap();
    tx.send(chunk(b"", true)).await.unwrap();
    assert!(requests.message().await.unwrap().is_none());
    run.await.unwrap().unwrap();

    let snapshot = server.runner.started.lock()[&id].clone();
    let contents: Vec<&Vec<u8>> = snapshot.contents.values().collect();
    assert_eq!(contents, [&b"first half, second half".to_vec()]);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn deferred_artifacts_are_not_asked_of_the_client() {
    // Go's client passes on the Java expansion service's deferred jars,
    // which it cannot give; the job still runs (a worker pool in the
    // expansion service has them).
    let server = Server::start().await;
    let files: HashMap<String, Vec<u8>> = [("/m2/a.jar".to_string(), b"a".to_vec())].into();
    let deferred = refract_proto::pipeline::ArtifactInformation {
        type_urn: refract_proto::urns::artifact::DEFERRED.to_string(),
        type_payload: b"a key of the expansion service".to_vec(),
        ..file_artifact("/unused", "deferred.jar", "")
    };
    let declared = vec![deferred, file_artifact("/m2/a.jar", "a.jar", "")];
    let (job, requested) = stage_job(&server, declared, &files).await;
    assert_eq!(requested, ["/m2/a.jar"]);
    let mut jobs = server.jobs().await;
    let seen = run_to_end(&mut jobs, &job).await;
    assert_eq!(seen.last(), Some(&State::Done));
    server.shutdown().await.unwrap();
}
