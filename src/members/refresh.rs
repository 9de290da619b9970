//! The membership of a backend without a watch (Ganeti), read again every interval.

use crate::cluster::NodeSource;
use std::sync::Arc;

use tracing::{info, warn};

use super::Members;

/// Reads the membership of a backend without a watch (Ganeti) every `interval` until
/// `shutdown`, replacing `members` when it changed: nodes added or removed need no restart.
pub async fn refresh(
    source: Arc<dyn NodeSource>,
    members: Arc<Members>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut ticker = crate::ticker::Ticker::new(source.interval());
    tokio::pin!(shutdown);
    while ticker.next(shutdown.as_mut()).await.is_some() {
        match source.members().await {
            Ok(now) if *members.get() != now => {
                info!(nodes = now.len(), "managed nodes changed");
                members.set(now);
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot list nodes; the last list stays"),
        }
    }
}
