//! Test certificates made with `openssl`: a CA, and the certificates it signs.

use std::path::Path;
use std::process::Command;

/// Runs `openssl` in `dir`, failing the test with its output when it fails.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A self-signed CA in `dir`: `<ca>.key` and the certificate `ca_cert`, of a key made by
/// `newkey` (`openssl req`'s key options, e.g. `["-newkey", "rsa:2048"]`).
pub fn ca(dir: &Path, ca: &str, ca_cert: &str, newkey: &[&str], subj: &str) {
    let key = format!("{ca}.key");
    let mut args = vec!["req", "-x509"];
    args.extend_from_slice(newkey);
    args.extend([
        "-nodes", "-keyout", &key, "-out", ca_cert, "-days", "2", "-subj", subj,
    ]);
    openssl(dir, &args);
}

/// `<name>.key` (made by `newkey`) and `<name>.crt` for `subj`, signed by the CA
/// `ca_cert`/`ca_key`, with the extensions written in `<name>.ext`.
pub fn issue(dir: &Path, ca_cert: &str, ca_key: &str, name: &str, newkey: &[&str], subj: &str) {
    let (key, csr, crt, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    let mut args = vec!["req"];
    args.extend_from_slice(newkey);
    args.extend(["-nodes", "-keyout", &key, "-out", &csr, "-subj", subj]);
    openssl(dir, &args);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            ca_cert,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}
