//! The operator commands' HTTP client: unsigned and signed requests to the daemon's API, and the
//! decoding and printing of its answers.

use super::*;

pub(super) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .expect("a plain HTTP client always builds")
}

pub(super) async fn api_get(url: &str, path: &str) -> Result<ExactJson, CliError> {
    decode(url, client().get(format!("{url}{path}")).send().await).await
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

pub(super) async fn api_signed(
    cfg: &Config,
    url: &str,
    method: reqwest::Method,
    path: &str,
) -> Result<ExactJson, CliError> {
    let key = Key::load(&cfg.cluster.key_file)?;
    decode(
        url,
        send_signed(
            &client(),
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
    println!("{}", v.pretty());
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
