//! The operator commands' HTTP client: unsigned and signed requests to the daemon's API, and the
//! decoding and printing of its answers.

use super::*;
use crate::report::operator::OperatorKey;

/// The client for the daemon's API: over HTTPS it trusts only `--ca-file`'s CAs (the daemon's
/// certificate is the cluster's own, not one the system's store would vouch for).
pub(super) fn client(api: &ApiArgs) -> Result<reqwest::Client, CliError> {
    let b = crate::http::client_builder().timeout(std::time::Duration::from_secs(10));
    let b = match &api.ca_file {
        Some(ca) => b.tls_backend_preconfigured(
            crate::http::tls::client_trusting(ca).map_err(|e| CliError::Tls(e.to_string()))?,
        ),
        None if api.url.starts_with("https://") => {
            return Err(CliError::Tls(format!(
                "{} is HTTPS: name the CA that signed the daemon's certificate with --ca-file (MAINTD_CA_FILE)",
                api.url
            )));
        }
        None => b,
    };
    b.build().map_err(|e| CliError::Tls(e.to_string()))
}

/// A read: signed by the operator's key when there is one (a daemon with
/// `anonymous-read = false` asks for it), else unsigned.
pub(super) async fn api_get(api: &ApiArgs, path: &str) -> Result<ExactJson, CliError> {
    let url = &api.url;
    let sent = match operator_key(api)? {
        Some(op) => send_as(&client(api)?, &op, reqwest::Method::GET, url, path).await,
        None => client(api)?.get(format!("{url}{path}")).send().await,
    };
    decode(url, sent).await
}

/// The operator key this command signs with: `--operator-key`, else the default file when it
/// exists.
pub(super) fn operator_key(api: &ApiArgs) -> Result<Option<OperatorKey>, CliError> {
    let path = match &api.operator_key {
        Some(p) => p.clone(),
        None => match std::env::var_os("HOME") {
            Some(h) => {
                let p = PathBuf::from(h).join(".config/maintd/operator.key");
                if !p.exists() {
                    return Ok(None);
                }
                p
            }
            None => return Ok(None),
        },
    };
    Ok(Some(OperatorKey::load(&path)?))
}

/// Sends a bodiless request signed by operator `op`, naming them.
async fn send_as(
    client: &reqwest::Client,
    op: &OperatorKey,
    method: reqwest::Method,
    url: &str,
    path: &str,
) -> Result<reqwest::Response, reqwest::Error> {
    let ts = now_ns();
    let sig = op.sign_request(method.as_str(), path, ts, b"");
    client
        .request(method, format!("{url}{path}"))
        .header(crate::report::TIMESTAMP_HEADER, ts.to_string())
        .header(crate::report::SIGNATURE_HEADER, sig)
        .header(crate::report::operator::OPERATOR_HEADER, &op.name)
        .send()
        .await
}

/// Turns a sent request into the JSON answer, or an error naming what went wrong.
pub(super) async fn decode(
    url: &str,
    sent: Result<reqwest::Response, reqwest::Error>,
) -> Result<ExactJson, CliError> {
    let connect = |source| CliError::Connect {
        url: url.into(),
        source,
    };
    let resp = sent.map_err(connect)?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(connect)?;
    if !status.is_success() {
        return Err(CliError::Api(error_message(status, &body)));
    }
    // Kept as sent: `--json` prints a diagnose's numbers exactly as the node wrote them.
    ExactJson::parse(&body).map_err(|e| CliError::Decode(e.to_string()))
}

/// A command: signed by the operator's key, or without one by the cluster key (which a
/// daemon with operators configured refuses).
pub(super) async fn api_signed(
    cfg: &Config,
    api: &ApiArgs,
    method: reqwest::Method,
    path: &str,
) -> Result<ExactJson, CliError> {
    let url = &api.url;
    if let Some(op) = operator_key(api)? {
        return decode(url, send_as(&client(api)?, &op, method, url, path).await).await;
    }
    let key = Key::load(&cfg.cluster.key_file)?;
    decode(
        url,
        send_signed(
            &client(api)?,
            &key,
            crate::report::DAEMON_TARGET,
            method,
            url,
            path,
            None,
        )
        .await,
    )
    .await
}

/// Percent-encodes one path segment (tags contain ':').
pub(super) fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The daemon's answer as the view it promises; a daemon that answers otherwise is named.
pub(super) fn view<T: serde::de::DeserializeOwned>(v: ExactJson) -> Result<T, CliError> {
    serde_json::from_str(v.as_str()).map_err(|e| CliError::Decode(e.to_string()))
}

pub(super) fn print_json(v: &ExactJson) {
    out!("{}", v.pretty());
}

/// The filters the API's lists take; the daemon does the filtering.
#[derive(Debug, Args)]
pub struct Filter {
    /// Only this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Only this status (events: noted, pending, canceled, failed, completed; nodes: reachable,
    /// unreachable; fence flows: new, running, done, error, final).
    #[arg(long)]
    pub status: Option<String>,
}

impl Filter {
    /// `path` with the filters given, and `more`, as its query string.
    pub fn query(&self, path: &str, more: &[(&str, Option<&str>)]) -> String {
        let pairs: Vec<String> = [
            ("node", self.node.as_deref()),
            ("status", self.status.as_deref()),
        ]
        .iter()
        .chain(more)
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", segment(v))))
        .collect();
        if pairs.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{}", pairs.join("&"))
        }
    }
}
