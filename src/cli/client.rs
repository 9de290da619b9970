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
