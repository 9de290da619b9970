//! The membership of a backend without a watch (Ganeti), read again every interval.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::Members;
use crate::cluster::Cluster;

/// Reads the membership of a backend without a watch (Ganeti) every `interval` until
/// `shutdown`, replacing `members` when it changed: nodes added or removed need no restart.
pub async fn refresh<C: Cluster>(
    cluster: Arc<C>,
    members: Arc<Members>,
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut ticker = crate::ticker::Ticker::new(interval);
    tokio::pin!(shutdown);
    while ticker.next(shutdown.as_mut()).await.is_some() {
        match cluster.members().await {
            Ok(Some(now)) if *members.get() != now => {
                info!(nodes = now.len(), "managed nodes changed");
                members.set(now);
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => warn!(error = %e, "cannot list nodes; the last list stays"),
        }
    }
}
