//! The Talos client against the simulated fleet, over real gRPC and mTLS on loopback; and the
//! wire bytes of our proto subset against hand-computed encodings of FACTS' field numbers.
//!
//! Start at `fleet` (a fleet with a v1.14 and a v1.13 node and a client for it); each test
//! names the behaviour of Talos it checks.

use prost::Message;
use render::api::Role;
use runtime::plan::ContainerdNamespace;
use runtime::sim::pki::ClientSpec;
use runtime::sim::talos::{Fault, Fleet, NodeSpec};
use runtime::talos::client::{ApplyMode, Client, TalosError};
use runtime::talos::config::TalosConfig;
use runtime::talos::proto::machine::apply_configuration_request::Mode;
use std::time::Duration;

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn node(name: &str, role: Role, talos: &str) -> NodeSpec {
    NodeSpec { name: name.into(), role, talos: talos.into(), config: None }
}

async fn fleet() -> Fleet {
    Fleet::start(
        vec![
            node("cp1", Role::Controlplane, "v1.14.3"),
            node("w1", Role::Worker, "v1.14.3"),
            node("old1", Role::Worker, "v1.13.9"),
            node("older1", Role::Worker, "v1.12.6"),
        ],
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap()
}

fn client_for(talosconfig: &str, deadline: Duration) -> Client {
    let cfg = TalosConfig::parse(talosconfig, "talosconfig").unwrap();
    let (name, ctx) = cfg.context(None, "talosconfig").unwrap();
    let creds = ctx.credentials(name, "talosconfig", now()).unwrap();
    Client::new(ctx, &creds, deadline).unwrap()
}

fn admin(f: &Fleet) -> Client {
    client_for(&f.talosconfig(&["os:admin"]).unwrap(), Duration::from_secs(5))
}

// ---- wire: field numbers as FACTS gives them --------------------------------------------

#[test]
fn wire_apply_configuration_request_uses_facts_field_numbers() {
    use runtime::talos::proto::machine::ApplyConfigurationRequest;
    let m = ApplyConfigurationRequest {
        data: b"x".to_vec(),
        mode: Mode::NoReboot as i32,
        dry_run: true,
        try_mode_timeout: Some(prost_types::Duration { seconds: 60, nanos: 0 }),
    };
    // data=1 (LEN), mode=4 (VARINT 2), dry_run=5 (VARINT 1), try_mode_timeout=6 (LEN {seconds=1: 60}).
    assert_eq!(m.encode_to_vec(), [0x0a, 0x01, b'x', 0x20, 0x02, 0x28, 0x01, 0x32, 0x02, 0x08, 0x3c]);
    assert_eq!(ApplyConfigurationRequest::decode(&[0x20u8, 0x01][..]).unwrap().mode, Mode::Auto as i32);
    // REBOOT is 0: proto3 omits it, so a request without a mode IS a REBOOT request.
    assert_eq!(Mode::Reboot as i32, 0);
    assert_eq!((Mode::Auto as i32, Mode::NoReboot as i32, Mode::Staged as i32, Mode::Try as i32), (1, 2, 3, 4));
}

#[test]
fn wire_responses_and_common_messages_use_facts_field_numbers() {
    use runtime::talos::proto::common::{ContainerDriver, ContainerdInstance, ContainerdNamespace, Data, Metadata};
    use runtime::talos::proto::machine::*;
    let a = ApplyConfiguration { metadata: None, warnings: vec!["w".into()], mode: 2, mode_details: "d".into() };
    assert_eq!(a.encode_to_vec(), [0x12, 0x01, b'w', 0x18, 0x02, 0x22, 0x01, b'd']);
    let v = VersionInfo {
        tag: "t".into(),
        sha: "s".into(),
        built: "b".into(),
        go_version: "g".into(),
        os: "o".into(),
        arch: "a".into(),
    };
    assert_eq!(
        v.encode_to_vec(),
        [0x0a, 1, b't', 0x12, 1, b's', 0x1a, 1, b'b', 0x22, 1, b'g', 0x2a, 1, b'o', 0x32, 1, b'a']
    );
    let ver = Version {
        metadata: Some(Metadata { hostname: "h".into(), error: String::new(), status: None }),
        version: None,
        platform: Some(PlatformInfo { name: "n".into(), mode: "m".into() }),
        features: Some(FeaturesInfo { rbac: true }),
    };
    assert_eq!(ver.encode_to_vec(), [0x0a, 3, 0x0a, 1, b'h', 0x1a, 6, 0x0a, 1, b'n', 0x12, 1, b'm', 0x22, 2, 0x08, 1]);
    let pull = ImagePullRequest { namespace: ContainerdNamespace::NsCri as i32, reference: "r".into() };
    assert_eq!(pull.encode_to_vec(), [0x08, 0x02, 0x12, 1, b'r']);
    let img = ImageServicePullRequest {
        containerd: Some(ContainerdInstance {
            driver: ContainerDriver::Cri as i32,
            namespace: ContainerdNamespace::NsSystem as i32,
        }),
        image_ref: "i".into(),
    };
    assert_eq!(img.encode_to_vec(), [0x0a, 4, 0x08, 1, 0x10, 1, 0x1a, 1, b'i']);
    let done = ImageServicePullResponse { response: Some(image_service_pull_response::Response::Name("n".into())) };
    assert_eq!(done.encode_to_vec(), [0x0a, 1, b'n']);
    assert_eq!(Data { metadata: None, bytes: vec![7] }.encode_to_vec(), [0x12, 1, 7]);
    let st = Metadata { hostname: String::new(), error: "e".into(), status: None };
    assert_eq!(st.encode_to_vec(), [0x12, 1, b'e']);
}

#[test]
fn wire_reboot_messages_use_facts_field_numbers() {
    use runtime::talos::proto::machine::{Reboot, RebootRequest, RebootResponse, reboot_request};
    // RebootRequest{mode 1}: DEFAULT=0 (omitted), POWERCYCLE=1, FORCE=2.
    let r = RebootRequest { mode: reboot_request::Mode::Powercycle as i32 };
    assert_eq!(r.encode_to_vec(), [0x08, 0x01]);
    assert_eq!(RebootRequest { mode: reboot_request::Mode::Default as i32 }.encode_to_vec(), [0u8; 0]);
    assert_eq!(reboot_request::Mode::Force as i32, 2);
    // RebootResponse{messages 1: Reboot{metadata 1, actor_id 2}}.
    let resp = RebootResponse { messages: vec![Reboot { metadata: None, actor_id: "a".into() }] };
    assert_eq!(resp.encode_to_vec(), [0x0a, 3, 0x12, 1, b'a']);
}

#[test]
fn wire_upgrade_messages_use_facts_field_numbers() {
    use runtime::talos::proto::common::{ContainerDriver, ContainerdInstance, ContainerdNamespace};
    use runtime::talos::proto::machine::lifecycle_service_install_progress::Response as P;
    use runtime::talos::proto::machine::*;
    // UpgradeRequest{image 1, preserve 2, stage 3, force 4, reboot_mode 5 (DEFAULT=0, POWERCYCLE=1)}.
    let u = UpgradeRequest {
        image: "i".into(),
        preserve: true,
        stage: true,
        force: true,
        reboot_mode: upgrade_request::RebootMode::Powercycle as i32,
    };
    assert_eq!(u.encode_to_vec(), [0x0a, 1, b'i', 0x10, 1, 0x18, 1, 0x20, 1, 0x28, 1]);
    // UpgradeResponse{messages 1: Upgrade{metadata 1, ack 2, actor_id 3}}.
    let r = UpgradeResponse { messages: vec![Upgrade { metadata: None, ack: "a".into(), actor_id: "x".into() }] };
    assert_eq!(r.encode_to_vec(), [0x0a, 6, 0x12, 1, b'a', 0x1a, 1, b'x']);
    // LifecycleServiceUpgradeRequest{containerd 1 (ContainerdInstance{driver 1, namespace 2}),
    // source 2 (InstallArtifactsSource{image_name 1})}.
    let l = LifecycleServiceUpgradeRequest {
        containerd: Some(ContainerdInstance {
            driver: ContainerDriver::Cri as i32,
            namespace: ContainerdNamespace::NsSystem as i32,
        }),
        source: Some(InstallArtifactsSource { image_name: "i".into() }),
    };
    assert_eq!(l.encode_to_vec(), [0x0a, 4, 0x08, 1, 0x10, 1, 0x12, 3, 0x0a, 1, b'i']);
    // LifecycleServiceUpgradeResponse{progress 1: {oneof message 1 | exit_code 2}}.
    let m = LifecycleServiceUpgradeResponse {
        progress: Some(LifecycleServiceInstallProgress { response: Some(P::Message("m".into())) }),
    };
    assert_eq!(m.encode_to_vec(), [0x0a, 3, 0x0a, 1, b'm']);
    let e = LifecycleServiceUpgradeResponse {
        progress: Some(LifecycleServiceInstallProgress { response: Some(P::ExitCode(0)) }),
    };
    // An exit code of 0 is still sent: it is a oneof member.
    assert_eq!(e.encode_to_vec(), [0x0a, 2, 0x10, 0]);
}

#[test]
fn wire_cosi_messages_use_facts_field_numbers() {
    use runtime::talos::proto::cosi::resource::*;
    let g = GetRequest { namespace: "n".into(), r#type: "t".into(), id: "i".into(), options: Some(GetOptions {}) };
    assert_eq!(g.encode_to_vec(), [0x0a, 1, b'n', 0x12, 1, b't', 0x1a, 1, b'i', 0x22, 0]);
    let l = ListRequest {
        namespace: "n".into(),
        r#type: "t".into(),
        options: Some(ListOptions { label_query: vec![], id_query: Some(IdQuery { regexp: "r".into() }) }),
    };
    assert_eq!(l.encode_to_vec(), [0x0a, 1, b'n', 0x12, 1, b't', 0x1a, 5, 0x12, 3, 0x0a, 1, b'r']);
    let w = WatchRequest {
        namespace: String::new(),
        r#type: String::new(),
        id: Some("i".into()),
        options: Some(WatchOptions { bootstrap_contents: true, ..Default::default() }),
        api_version: 1,
    };
    assert_eq!(w.encode_to_vec(), [0x1a, 1, b'i', 0x22, 2, 0x08, 1, 0x28, 1]);
    let m = runtime::talos::proto::cosi::resource::Metadata {
        namespace: "n".into(),
        r#type: "t".into(),
        id: "i".into(),
        version: "1".into(),
        phase: "p".into(),
        ..Default::default()
    };
    assert_eq!(m.encode_to_vec(), [0x0a, 1, b'n', 0x12, 1, b't', 0x1a, 1, b'i', 0x22, 1, b'1', 0x32, 1, b'p']);
    let s = Spec { proto_spec: vec![9], yaml_spec: "y".into() };
    assert_eq!(s.encode_to_vec(), [0x0a, 1, 9, 0x12, 1, b'y']);
    let e = Event {
        resource: None,
        event_type: EventType::Bootstrapped as i32,
        old: None,
        error: Some("x".into()),
        bookmark: None,
    };
    assert_eq!(e.encode_to_vec(), [0x10, 3, 0x22, 1, b'x']);
    assert_eq!(
        (
            EventType::Created as i32,
            EventType::Updated as i32,
            EventType::Destroyed as i32,
            EventType::Errored as i32,
            EventType::Noop as i32
        ),
        (0, 1, 2, 4, 5)
    );
    use runtime::talos::proto::resource::config::MachineConfigSpec;
    assert_eq!(MachineConfigSpec { yaml_marshalled: b"a".to_vec() }.encode_to_vec(), [0x0a, 1, b'a']);
    use runtime::talos::proto::talos::resource::definitions::{k8s, v1alpha1};
    assert_eq!(k8s::KubeletSpecSpec { image: "i".into() }.encode_to_vec(), [0x0a, 1, b'i']);
    assert_eq!(k8s::ManifestStatusSpec { manifests_applied: vec!["m".into()] }.encode_to_vec(), [0x0a, 1, b'm']);
    assert_eq!(
        v1alpha1::ServiceSpec { running: true, healthy: true, unknown: true }.encode_to_vec(),
        [0x08, 1, 0x10, 1, 0x18, 1]
    );
}

// ---- the client against the simulated fleet ---------------------------------------------

#[tokio::test]
async fn version_reaches_each_node_through_one_endpoint_by_the_node_header() {
    let f = fleet().await;
    let c = admin(&f);
    assert_eq!(c.version("cp1").await.unwrap().tag, "v1.14.3");
    assert_eq!(c.version("old1").await.unwrap().tag, "v1.13.9");
    // No header: the endpoint's own node answers.
    assert_eq!(c.version("").await.unwrap().tag, "v1.14.3");
    // A node the endpoint cannot reach.
    assert!(matches!(c.version("nowhere").await, Err(TalosError::TryLater { .. })));
}

#[tokio::test]
async fn two_node_header_values_are_refused_as_apid_does() {
    use runtime::talos::proto::machine::machine_service_client::MachineServiceClient;
    let f = fleet().await;
    let c = admin(&f);
    let _ = c.version("cp1").await.unwrap();
    let ch = raw_channel(&f).await;
    let mut req = tonic::Request::new(());
    req.metadata_mut().append("node", "cp1".parse().unwrap());
    req.metadata_mut().append("node", "w1".parse().unwrap());
    let err = MachineServiceClient::new(ch).version(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
}

async fn raw_channel(f: &Fleet) -> tonic::transport::Channel {
    let cert = f.client_cert(&ClientSpec::talos(&["os:admin"])).unwrap();
    raw_channel_with(f, &cert.crt_pem, &cert.key_pem).await
}

async fn raw_channel_with(f: &Fleet, crt: &str, key: &str) -> tonic::transport::Channel {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let key = runtime::talos::config::normalize_key(key).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&f.pki.ca_pem))
        .identity(Identity::from_pem(crt, key))
        .domain_name("127.0.0.1");
    Endpoint::from_shared(format!("https://{}", f.addr)).unwrap().tls_config(tls).unwrap().connect_lazy()
}

fn bump_kubelet(config: &str) -> String {
    assert!(config.contains("ghcr.io/siderolabs/kubelet:v1.36.4"), "{config}");
    config.replace("ghcr.io/siderolabs/kubelet:v1.36.4", "ghcr.io/siderolabs/kubelet:v1.36.5")
}

#[tokio::test]
async fn apply_no_reboot_changes_the_running_config_read_back_through_cosi() {
    let f = fleet().await;
    let c = admin(&f);
    let before = c.running_config("w1").await.unwrap();
    let desired = bump_kubelet(&before);
    let applied = c.apply("w1", desired.as_bytes(), ApplyMode::NoReboot, false).await.unwrap();
    assert_eq!(applied.mode, "NO_REBOOT");
    assert_eq!(applied.details, "Applied configuration without a reboot");
    assert_eq!(c.running_config("w1").await.unwrap(), desired);
    assert_eq!(c.machine_config("w1", "persistent").await.unwrap(), desired);
    let o = runtime::talos::observe::observe_node(&c, "w1").await.unwrap();
    assert_eq!(o.kubelet_image, "ghcr.io/siderolabs/kubelet:v1.36.5", "KubeletSpec follows the config");
}

#[tokio::test]
async fn v1_14_turns_auto_into_no_reboot_and_staged_writes_only_the_persisted_config() {
    let f = fleet().await;
    let c = admin(&f);
    let before = c.running_config("w1").await.unwrap();
    let desired = bump_kubelet(&before);
    let staged = c.apply("w1", desired.as_bytes(), ApplyMode::Staged, false).await.unwrap();
    assert_eq!(staged.mode, "STAGED");
    assert_eq!(c.running_config("w1").await.unwrap(), before);
    assert_eq!(c.machine_config("w1", "persistent").await.unwrap(), desired);
    let auto = c.apply("w1", desired.as_bytes(), ApplyMode::Auto, false).await.unwrap();
    assert_eq!(auto.mode, "NO_REBOOT");
    assert_eq!(c.running_config("w1").await.unwrap(), desired);
}

#[tokio::test]
async fn the_reboot_trap_v1_14_rejects_mode_zero_as_unimplemented() {
    use runtime::talos::proto::machine::{ApplyConfigurationRequest, machine_service_client::MachineServiceClient};
    let f = fleet().await;
    let c = admin(&f);
    let config = c.running_config("w1").await.unwrap();
    // What a client that forgets the mode sends: proto3's default, REBOOT.
    let mut req = tonic::Request::new(ApplyConfigurationRequest { data: config.into_bytes(), ..Default::default() });
    req.metadata_mut().insert("node", "w1".parse().unwrap());
    let err = MachineServiceClient::new(raw_channel(&f).await).apply_configuration(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert_eq!(err.message(), "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead");
}

#[tokio::test]
async fn dry_run_answers_without_applying() {
    let f = fleet().await;
    let c = admin(&f);
    let before = c.running_config("w1").await.unwrap();
    let r = c.apply("w1", bump_kubelet(&before).as_bytes(), ApplyMode::NoReboot, true).await.unwrap();
    assert!(r.details.starts_with("Dry run summary:"), "{}", r.details);
    assert_eq!(c.running_config("w1").await.unwrap(), before);
}

#[tokio::test]
async fn v1_13_refuses_no_reboot_outside_its_allow_list_with_talos_message_even_in_a_dry_run() {
    let f = fleet().await;
    let c = admin(&f);
    let before = c.running_config("old1").await.unwrap();
    // machine.env is not in 1.13's allow-list: it needs a reboot there.
    let desired = before.replacen("machine:\n", "machine:\n    env:\n        FOO: bar\n", 1);
    assert_ne!(desired, before);
    for dry_run in [true, false] {
        match c.apply("old1", desired.as_bytes(), ApplyMode::NoReboot, dry_run).await {
            // Talos's diff (which can hold secrets) is withheld where the error is built.
            Err(TalosError::Refused { message, diff_withheld, .. }) => {
                assert_eq!(message, "this config change can't be applied in immediate mode");
                assert!(diff_withheld);
                assert!(!message.contains("FOO: bar"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    // An allow-listed change (machine.kubelet) applies live on 1.13.
    let ok = c.apply("old1", bump_kubelet(&before).as_bytes(), ApplyMode::NoReboot, false).await.unwrap();
    assert_eq!(ok.mode, "NO_REBOOT");
    // AUTO with a reboot-class change reboots on 1.13.
    let auto = c.apply("old1", desired.as_bytes(), ApplyMode::Auto, false).await.unwrap();
    assert_eq!(auto.mode, "REBOOT");
    assert!(
        auto.details.starts_with("Applied configuration with a reboot: this config change can't be applied"),
        "{}",
        auto.details
    );
    assert_eq!(f.reboots("old1"), 1);
}

#[tokio::test]
async fn talos_validation_refusals_are_invalid_argument_with_the_message() {
    let f = fleet().await;
    let c = admin(&f);
    let multi_only = "apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: w1\n";
    match c.apply("w1", multi_only.as_bytes(), ApplyMode::NoReboot, false).await {
        Err(TalosError::Refused { message, .. }) => assert_eq!(
            message,
            "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?"
        ),
        other => panic!("{other:?}"),
    }
    match c.apply("w1", b"machine: [unclosed", ApplyMode::NoReboot, false).await {
        Err(TalosError::Refused { message, .. }) => assert!(message.starts_with("failed to parse config"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn image_pulls_land_in_the_namespace_asked_through_image_service_or_the_old_call() {
    let f = fleet().await;
    let c = admin(&f);
    c.pull_image("cp1", ContainerdNamespace::K8s, "registry.k8s.io/kube-apiserver:v1.36.5").await.unwrap();
    c.pull_image("cp1", ContainerdNamespace::System, "ghcr.io/siderolabs/kubelet:v1.36.5").await.unwrap();
    // Talos 1.12 has no ImageService: the client falls back to MachineService.ImagePull.
    c.pull_image("older1", ContainerdNamespace::System, "ghcr.io/siderolabs/kubelet:v1.36.5").await.unwrap();
    assert_eq!(
        f.pulls("cp1"),
        [
            ("k8s.io".to_string(), "registry.k8s.io/kube-apiserver:v1.36.5".to_string()),
            ("system".to_string(), "ghcr.io/siderolabs/kubelet:v1.36.5".to_string())
        ]
    );
    assert_eq!(f.pulls("older1"), [("system".to_string(), "ghcr.io/siderolabs/kubelet:v1.36.5".to_string())]);
}

/// Waits (5 s at most) for a rebooting node to answer again; its Talos version then.
async fn back(f: &Fleet, c: &Client, node: &str) -> String {
    let start = std::time::Instant::now();
    while f.boot_id(node).is_none() && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.version(node).await.unwrap().tag
}

#[tokio::test]
async fn an_upgrade_installs_the_pulled_installer_and_the_next_boot_runs_it() {
    let f = fleet().await;
    let c = admin(&f);
    let image = "factory.talos.dev/metal-installer/abc:v1.14.6";
    // LifecycleService.Upgrade installs only an image pulled into the system namespace.
    let e = c.upgrade("w1", image, false).await.unwrap_err();
    assert!(e.to_string().contains("pull it first"), "{e}");
    c.pull_image("w1", ContainerdNamespace::System, image).await.unwrap();
    c.upgrade("w1", image, false).await.unwrap();
    // No reboot by itself: the node still runs its Talos until it reboots.
    assert_eq!(c.version("w1").await.unwrap().tag, "v1.14.3");
    assert_eq!(f.reboots("w1"), 0);
    c.reboot("w1").await.unwrap();
    assert_eq!(back(&f, &c, "w1").await, "v1.14.6");
    assert_eq!(f.reboots("w1"), 1);
    // An installer whose tag is no Talos version: the installer's non-zero exit is a refusal.
    c.pull_image("cp1", ContainerdNamespace::System, "x/installer:latest").await.unwrap();
    let e = c.upgrade("cp1", "x/installer:latest", false).await.unwrap_err();
    assert!(matches!(e, TalosError::Refused { .. }) && e.to_string().contains("exited with code 1"), "{e}");
}

#[tokio::test]
async fn a_failing_new_talos_boots_the_previous_one_and_talos_1_12_upgrades_through_the_legacy_call() {
    let f = fleet().await;
    let c = admin(&f);
    let image = "factory.talos.dev/metal-installer/abc:v1.14.6";
    f.set_upgrade_fails("cp1", true);
    c.pull_image("cp1", ContainerdNamespace::System, image).await.unwrap();
    c.upgrade("cp1", image, false).await.unwrap();
    c.reboot("cp1").await.unwrap();
    assert_eq!(back(&f, &c, "cp1").await, "v1.14.3", "the A/B fallback boots the old Talos");
    // Talos 1.12 has no LifecycleService; MachineService.Upgrade installs and reboots by itself.
    let e = c.upgrade("older1", "ghcr.io/siderolabs/installer:v1.13.10", false).await.unwrap_err();
    assert!(matches!(e, TalosError::Unimplemented { .. }), "{e}");
    c.upgrade("older1", "ghcr.io/siderolabs/installer:v1.13.10", true).await.unwrap();
    assert_eq!(back(&f, &c, "older1").await, "v1.13.10");
    assert_eq!(f.reboots("older1"), 1);
}

#[tokio::test]
async fn a_call_that_never_answers_ends_at_its_own_deadline_while_the_others_finish() {
    let f = fleet().await;
    f.set_fault("w1", Some(Fault::Hang));
    f.set_fault("cp1", Some(Fault::Latency(Duration::from_millis(300))));
    let mut c = client_for(&f.talosconfig(&["os:admin"]).unwrap(), Duration::from_millis(800));
    c.read_attempts = 1;
    let started = std::time::Instant::now();
    let (hung, slow, fine) = tokio::join!(c.version("w1"), c.version("cp1"), c.version("old1"));
    assert!(matches!(hung, Err(TalosError::TryLater { .. })), "{hung:?}");
    assert_eq!(slow.unwrap().tag, "v1.14.3", "a slow call within its own deadline finishes");
    assert_eq!(fine.unwrap().tag, "v1.13.9");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(750) && took < Duration::from_secs(5), "{took:?}");
}

/// A fault armed on apply starts once the apply took (mid-step: the apply answered, the next
/// call does not) and ends after its time; a node armed to stay away after its reboot does.
#[tokio::test]
async fn an_armed_fault_starts_mid_step_on_the_next_apply_and_ends_after_its_time() {
    use runtime::sim::talos::{ArmedFault, Trigger};
    let f = fleet().await;
    let c = admin(&f);
    let lasting = Some(Duration::from_millis(600));
    f.arm_fault("w1", ArmedFault { fault: Fault::Unavailable, on: Trigger::Apply, lasting });
    let before = c.running_config("w1").await.unwrap();
    assert!(c.version("w1").await.is_ok(), "armed, not yet started");
    let desired = bump_kubelet(&before);
    c.apply("w1", desired.as_bytes(), ApplyMode::NoReboot, false).await.unwrap();
    let e = c.running_config("w1").await.unwrap_err();
    assert!(e.is_transient() && e.to_string().contains("service unavailable"), "{e}");
    assert!(c.running_config("cp1").await.is_ok(), "the other nodes answer");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(c.running_config("w1").await.unwrap(), desired, "back after its time, with the apply kept");
    // Never back from its next reboot.
    f.set_reboot_time("w1", None);
    c.reboot("w1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = c.version("w1").await.unwrap_err();
    assert!(e.to_string().contains("rebooting"), "{e}");
}

#[tokio::test]
async fn a_kept_observation_stands_for_a_settled_node_until_it_is_written_to() {
    use runtime::talos::observe::{ObservationCache, Observed};
    let f = fleet().await;
    let c = admin(&f);
    let nodes = f.nodes();
    let cache = ObservationCache::default();
    let known = |seen: &[Observed], node: &str| seen.iter().any(|o| matches!(o, Observed::Known(n) if n.node == node));
    let first = cache.observe_fleet(&c, &nodes, 2).await;
    assert!(nodes.iter().all(|n| known(&first, n)), "every node answers at first");
    // The node stops answering: its settled observation is kept, not read again.
    f.set_fault("w1", Some(Fault::Gone));
    let second = cache.observe_fleet(&c, &nodes, 2).await;
    assert!(known(&second, "w1"), "a settled node observed just now is not read again");
    // Written to (an apply, a reboot, a failed precondition): read afresh, and found gone.
    c.touch("w1");
    let third = cache.observe_fleet(&c, &nodes, 2).await;
    assert!(!known(&third, "w1"), "a node written to is read again");
    assert!(known(&third, "cp1"), "the others are still kept");
    // Unknown is never kept: the next look reads it again (and finds it back).
    f.set_fault("w1", None);
    let fourth = cache.observe_fleet(&c, &nodes, 2).await;
    assert!(known(&fourth, "w1"));
}

#[tokio::test]
async fn one_unreachable_node_is_unknown_and_the_others_are_observed() {
    let f = fleet().await;
    f.set_fault("w1", Some(Fault::Gone));
    let c = admin(&f);
    let nodes = f.nodes();
    let seen = runtime::talos::observe::observe_fleet(&c, &nodes, 2).await;
    assert_eq!(seen.len(), 4);
    for o in &seen {
        match o {
            runtime::talos::observe::Observed::Unknown { node, error } => {
                assert_eq!(node, "w1");
                assert!(error.is_transient(), "{error}");
            }
            runtime::talos::observe::Observed::Known(n) => {
                assert!(!n.running_config.is_empty());
                assert_eq!(n.services.get("kubelet"), Some(&(true, true)));
                if n.node == "cp1" {
                    assert_eq!(
                        n.components.get("kube-apiserver").map(String::as_str),
                        Some("registry.k8s.io/kube-apiserver:v1.36.4")
                    );
                    assert_eq!(n.manifests, ["10-kube-proxy"]);
                } else {
                    assert!(n.components.is_empty() && n.manifests.is_empty());
                }
            }
        }
    }
}

#[tokio::test]
async fn a_certificate_with_more_than_client_auth_is_refused_as_apid_does() {
    use rcgen::ExtendedKeyUsagePurpose as E;
    use runtime::talos::proto::machine::machine_service_client::MachineServiceClient;
    let f = fleet().await;
    let spec =
        ClientSpec { roles: vec!["os:admin".into()], usages: vec![E::ClientAuth, E::ServerAuth], valid_for: 86_400 };
    let cert = f.client_cert(&spec).unwrap();
    let mut req = tonic::Request::new(());
    req.metadata_mut().insert("node", "cp1".parse().unwrap());
    let err = MachineServiceClient::new(raw_channel_with(&f, &cert.crt_pem, &cert.key_pem).await)
        .version(req)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    assert!(err.message().contains("exactly clientAuth"), "{err}");
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let f = fleet().await;
    let other =
        Fleet::start(vec![node("x1", Role::Controlplane, "v1.14.3")], "127.0.0.1:0".parse().unwrap()).await.unwrap();
    // A talosconfig for `other`'s CA, pointed at `f`.
    let cfg = other.talosconfig(&["os:admin"]).unwrap().replace(&other.addr.to_string(), &f.addr.to_string());
    let mut c = client_for(&cfg, Duration::from_secs(2));
    c.read_attempts = 1;
    assert!(c.version("cp1").await.is_err());
}

#[tokio::test]
async fn a_reader_cannot_apply_or_read_the_config_and_is_told_which_role_is_needed() {
    let f = fleet().await;
    let c = client_for(&f.talosconfig(&["os:reader"]).unwrap(), Duration::from_secs(5));
    assert_eq!(c.version("cp1").await.unwrap().tag, "v1.14.3");
    match c.apply("w1", b"version: v1alpha1\n", ApplyMode::NoReboot, false).await {
        Err(e @ TalosError::PermissionDenied { needed: "os:admin", .. }) => {
            assert!(e.to_string().contains("os:reader"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(c.running_config("w1").await, Err(TalosError::PermissionDenied { needed: "os:admin", .. })));
}

#[tokio::test]
async fn cosi_get_answers_not_found_and_the_machine_config_carries_its_yaml_spec() {
    let f = fleet().await;
    let c = admin(&f);
    assert!(matches!(
        c.get("w1", "controlplane", "APIServerConfigs.kubernetes.talos.dev", "kube-apiserver").await,
        Err(TalosError::NotFound { .. })
    ));
    let r = c.get("cp1", "config", "MachineConfigs.config.talos.dev", "v1alpha1").await.unwrap();
    let md = r.metadata.clone().unwrap();
    assert_eq!(md.annotations.get("talos.dev/yaml-spec").map(String::as_str), Some("1"));
    let spec = r.spec.unwrap();
    let s: serde_yaml::Value = serde_yaml::from_str(&spec.yaml_spec).unwrap();
    assert!(s.as_str().unwrap().starts_with("version: v1alpha1"), "yaml_spec is the config as one string");
}

#[tokio::test]
async fn a_watch_sees_the_apply() {
    use futures::StreamExt;
    use runtime::talos::proto::cosi::resource::{EventType, WatchOptions, WatchRequest, state_client::StateClient};
    let f = fleet().await;
    let c = admin(&f);
    let mut req = tonic::Request::new(WatchRequest {
        namespace: "k8s".into(),
        r#type: "KubeletSpecs.kubernetes.talos.dev".into(),
        id: Some("kubelet".into()),
        options: Some(WatchOptions { bootstrap_contents: true, ..Default::default() }),
        api_version: 1,
    });
    req.metadata_mut().insert("node", "w1".parse().unwrap());
    let mut events = StateClient::new(raw_channel(&f).await).watch(req).await.unwrap().into_inner();
    let first = events.next().await.unwrap().unwrap();
    assert_eq!(first.event[0].event_type, EventType::Created as i32);
    let marker = events.next().await.unwrap().unwrap();
    assert_eq!(marker.event[0].event_type, EventType::Bootstrapped as i32);
    let desired = bump_kubelet(&c.running_config("w1").await.unwrap());
    c.apply("w1", desired.as_bytes(), ApplyMode::NoReboot, false).await.unwrap();
    let update = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(update.event[0].event_type, EventType::Updated as i32);
}

#[tokio::test]
async fn kubeconfig_comes_from_a_control_plane_only() {
    let f = fleet().await;
    let c = admin(&f);
    let k = String::from_utf8(c.kubeconfig("cp1").await.unwrap()).unwrap();
    assert!(k.contains("kind: Config"), "{k}");
    assert!(c.kubeconfig("w1").await.is_err());
}

// ---- the talosconfig --------------------------------------------------------------------

#[tokio::test]
async fn talosconfig_errors_name_the_file_and_field_and_never_the_key() {
    let f = fleet().await;
    let good = f.talosconfig(&["os:admin"]).unwrap();
    let key_b64 = good
        .lines()
        .find(|l| l.trim_start().starts_with("key:"))
        .unwrap()
        .trim()
        .trim_start_matches("key: ")
        .to_string();
    let cases: Vec<(String, &str)> = vec![
        ("context: nope\ncontexts: {}\n".into(), "context"),
        (good.replace("context: sim\n", "context: other\n"), "context"),
        (good.replace(&key_b64, "!!!notbase64"), "contexts.sim.key"),
        (good.replacen("    ca: ", "    ca: AAAA", 1), "contexts.sim.ca"),
        (good.replace(&format!("      - {}\n", f.addr), ""), "contexts.sim.endpoints"),
        ("contexts: [1, 2\n".into(), "line"),
    ];
    for (text, field) in cases {
        let e = TalosConfig::parse(&text, "tc.yaml").and_then(|c| {
            let (n, ctx) = c.context(None, "tc.yaml")?;
            ctx.credentials(n, "tc.yaml", now()).map(|_| ())
        });
        let e = e.expect_err(field);
        assert!(e.field.starts_with(field), "{e} (wanted {field})");
        assert_eq!(e.file, "tc.yaml");
        assert!(!e.to_string().contains(&key_b64[..20]), "key material in {e}");
    }
    // An expired certificate.
    let expired = f.client_cert(&ClientSpec { valid_for: -3600, ..ClientSpec::talos(&["os:admin"]) }).unwrap();
    let text = f.pki.talosconfig("sim", &[f.addr.to_string()], &[], &expired);
    let cfg = TalosConfig::parse(&text, "tc.yaml").unwrap();
    let (n, ctx) = cfg.context(None, "tc.yaml").unwrap();
    let e = ctx.credentials(n, "tc.yaml", now()).unwrap_err();
    assert_eq!(e.field, "contexts.sim.crt");
    assert!(e.problem.contains("expired"), "{e}");
}

#[tokio::test]
async fn a_reboot_takes_the_node_away_and_it_comes_back_on_a_new_boot_running_its_persisted_config() {
    let f = fleet().await;
    let c = admin(&f);
    f.set_reboot_time("w1", Some(Duration::from_millis(200)));
    let boot = f.boot_id("w1").unwrap();
    let before = c.running_config("w1").await.unwrap();
    let desired = bump_kubelet(&before);
    c.apply("w1", desired.as_bytes(), ApplyMode::Staged, false).await.unwrap();
    c.reboot("w1").await.unwrap();
    // Away: every call answers Unavailable (as apid does for a node it cannot reach).
    assert!(matches!(c.version("w1").await, Err(e) if e.is_transient()));
    assert_eq!(f.boot_id("w1"), None);
    tokio::time::sleep(Duration::from_millis(250)).await;
    // Back: a new boot, running what was staged.
    let after = f.boot_id("w1").unwrap();
    assert_ne!(after, boot);
    assert_eq!(c.running_config("w1").await.unwrap(), desired);
    assert_eq!(f.reboots("w1"), 1);
    // The others never went away.
    assert_eq!(c.version("cp1").await.unwrap().tag, "v1.14.3");
    assert_eq!(f.reboots("cp1"), 0);
}

#[tokio::test]
async fn a_node_that_never_comes_back_stays_unavailable_and_a_reader_cannot_reboot() {
    let f = fleet().await;
    let reader = client_for(&f.talosconfig(&["os:reader"]).unwrap(), Duration::from_secs(5));
    assert!(matches!(reader.reboot("w1").await, Err(TalosError::PermissionDenied { needed: "os:operator", .. })));
    assert_eq!(f.reboots("w1"), 0);
    let c = admin(&f);
    f.set_reboot_time("w1", None);
    c.reboot("w1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(matches!(c.version("w1").await, Err(e) if e.is_transient()));
    assert_eq!(f.boot_id("w1"), None);
}
