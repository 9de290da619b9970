//! Which replica acts: what a replica does with the leader Lease it just read. Expiry is judged
//! by how long the record has stood still on this replica's own clock, never by comparing its
//! clock with the holder's.

use std::time::Duration;

/// What of the Lease record the step reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseView<'a> {
    /// Who holds it; `None` once released.
    pub holder: Option<&'a str>,
    /// How many times it changed hands.
    pub transitions: i32,
}

/// What a replica does with the Lease it just read.
#[derive(Debug, PartialEq)]
pub enum LeaseStep {
    /// Nobody holds it, or the holder stopped renewing: take it.
    Acquire {
        transitions: i32,
    },
    Renew,
    Follow {
        holder: String,
    },
}

/// The step of replica `me` with `lease` (none: there is no Lease yet), which has not changed
/// for `unchanged_for` on this replica's clock, for a lease of `lease_duration`.
pub fn lease_step(
    lease: Option<LeaseView<'_>>,
    me: &str,
    unchanged_for: Duration,
    lease_duration: Duration,
) -> LeaseStep {
    let Some(l) = lease else {
        return LeaseStep::Acquire { transitions: 0 };
    };
    match l.holder {
        Some(h) if h == me => LeaseStep::Renew,
        Some(h) if unchanged_for < lease_duration => LeaseStep::Follow { holder: h.into() },
        // Released, or its holder stopped renewing.
        _ => LeaseStep::Acquire {
            transitions: l.transitions + 1,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>) -> Option<LeaseView<'_>> {
        Some(LeaseView {
            holder,
            transitions: 3,
        })
    }

    #[test]
    fn a_lease_is_taken_when_free_or_stale_and_followed_while_renewed() {
        let d = Duration::from_secs(15);
        let s = Duration::from_secs;
        assert_eq!(
            lease_step(None, "a", s(0), d),
            LeaseStep::Acquire { transitions: 0 }
        );
        assert_eq!(
            lease_step(lease(Some("a")), "a", s(99), d),
            LeaseStep::Renew
        );
        assert_eq!(
            lease_step(lease(Some("b")), "a", s(14), d),
            LeaseStep::Follow { holder: "b".into() }
        );
        assert_eq!(
            lease_step(lease(Some("b")), "a", s(15), d),
            LeaseStep::Acquire { transitions: 4 }
        );
        // Released on shutdown: taken at once.
        assert_eq!(
            lease_step(lease(None), "a", s(0), d),
            LeaseStep::Acquire { transitions: 4 }
        );
    }
}
