//! TLS on the operator's port, against a real daemon and the real CLI: the CLI trusts only the
//! CA it is given, a plain-HTTP client is told what it reached instead of hanging, and a
//! renewed certificate is served after SIGHUP without a restart.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA `<name>-ca.pem` and a certificate for 127.0.0.1 it signed (`<name>.crt`, `<name>.key`).
fn ca_and_cert(dir: &Path, name: &str) {
    let ca = format!("{name}-ca");
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
    let (ca_cert, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    certs::ca(dir, &ca, &ca_cert, &ec, &format!("/CN={ca}"));
    std::fs::write(
        dir.join(format!("{name}.ext")),
        "subjectAltName=IP:127.0.0.1\n",
    )
    .unwrap();
    certs::issue(dir, &ca_cert, &ca_key, name, &ec, "/CN=maintd");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join(format!("{name}.key")),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
}

/// `maintd fencing status` over HTTPS, trusting `ca`.
fn status(c: &Cluster, ca: &str) -> std::process::Output {
    c.cli_command_env(
        &["fencing", "status"],
        &[
            ("MAINTD_URL", format!("https://127.0.0.1:{}", c.api_port)),
            ("MAINTD_CA_FILE", c.path(ca).display().to_string()),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_speaks_https_to_a_client_that_trusts_its_ca_and_reloads_its_certificate() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("notice: openssl not found; TLS test skipped");
        return;
    }
    let mut c = Cluster::new(1);
    ca_and_cert(c.dir.path(), "one");
    ca_and_cert(c.dir.path(), "two");
    // The daemon serves the pair at these paths; a renewal replaces the files.
    std::fs::copy(c.path("one.crt"), c.path("api.crt")).unwrap();
    std::fs::copy(c.path("one.key"), c.path("api.key")).unwrap();
    c.extra_daemon_toml = format!(
        "tls-cert-file = \"{}\"\ntls-key-file = \"{}\"\n",
        c.path("api.crt").display(),
        c.path("api.key").display()
    );
    c.start_collectors();
    c.start_daemon();

    // The CLI trusts its CA: it gets an answer once the daemon listens.
    let deadline = Instant::now() + WAIT;
    loop {
        let out = status(&c, "one-ca.pem");
        if out.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "{out:?}\n{}", c.daemon_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Another CA's client refuses the server, naming why.
    let out = status(&c, "two-ca.pem");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("certificate") || err.contains("Certificate"),
        "{err}"
    );
    // An https URL without a CA to trust: refused before anything is sent.
    let out = c.cli_command_env(
        &["fencing", "status"],
        &[("MAINTD_URL", format!("https://127.0.0.1:{}", c.api_port))],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--ca-file"), "{err}");

    // Plain HTTP to the TLS port: a clear answer at once, not a hang.
    let t = Instant::now();
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", c.api_port))
        .await
        .unwrap();
    s.write_all(b"GET /1/status HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut answer))
        .await
        .expect("the connection is answered and closed")
        .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("tls-required"),
        "{answer}"
    );
    assert!(t.elapsed() < Duration::from_secs(10));

    // A renewed certificate (another CA's): served after SIGHUP, with no restart.
    let pid = c.daemon.as_ref().unwrap().child.id();
    std::fs::copy(c.path("two.crt"), c.path("api.crt")).unwrap();
    std::fs::copy(c.path("two.key"), c.path("api.key")).unwrap();
    assert!(
        status(&c, "one-ca.pem").status.success(),
        "the old pair until the signal"
    );
    hup(pid);
    wait_for("the renewed certificate", || async {
        status(&c, "two-ca.pem").status.success().then_some(())
    })
    .await;
    assert!(!status(&c, "one-ca.pem").status.success());
    assert!(
        c.daemon_log()
            .contains("SIGHUP: the API's TLS certificate and key were read again")
    );
    // A broken renewal is refused and the pair in use stays.
    std::fs::write(c.path("api.crt"), "not a certificate").unwrap();
    hup(pid);
    wait_for("the refused renewal in the log", || async {
        c.daemon_log()
            .contains("the one in use stays")
            .then_some(())
    })
    .await;
    assert!(status(&c, "two-ca.pem").status.success());
    assert_eq!(c.daemon.as_ref().unwrap().child.id(), pid);
}

/// A listener others can reach, without TLS: refused at start unless plain HTTP is asked for.
#[test]
fn a_network_listener_without_tls_is_refused_unless_plain_http_is_asked_for() {
    let c = Cluster::new(1);
    let cfg = c.path("open.toml");
    std::fs::write(
        &cfg,
        format!(
            "[cluster]\nkey-file = \"{}\"\n[daemon]\nlisten = \"0.0.0.0:1\"\n",
            c.path("cluster.key").display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_maintd"))
        .args(["--config", cfg.to_str().unwrap(), "daemon"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("plain-http"), "{err}");
}

/// Without TLS, SIGHUP (systemd's reload) is logged and changes nothing: the daemon runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_without_tls_does_not_stop_the_daemon() {
    let mut c = Cluster::new(1);
    c.start().await;
    // Without TLS, a SIGHUP reads the operators and node keys again, and stops nothing.
    reload(&c.daemon, "SIGHUP: operators and node keys read again").await;
    assert!(alive(&mut c.daemon));
    assert_eq!(c.get("/1/health").await.0, 200);
}
