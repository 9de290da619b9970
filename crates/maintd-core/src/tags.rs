//! maintd's names on nodes, built in one place: the tags an operator sees and removes
//! (`maintd:repairready:<id>`, `maintd:repairfailed:<id>`, `maintd:fencefailed:<id>`) and the
//! `maintd:<id>` reference every job's reason trail and every Event message carries. Pure.

use uuid::Uuid;

/// What every maintd tag and reference starts with.
pub const PREFIX: &str = "maintd:";

/// The kinds of tag maintd puts on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "lowercase")]
pub enum TagKind {
    /// A repair event finished and the node is ready; removing the tag acknowledges it.
    RepairReady,
    RepairFailed,
    /// A fence flow failed for good; nothing was released.
    FenceFailed,
}

impl TagKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// `maintd:<kind>:<id>`.
pub fn tag(kind: TagKind, id: &Uuid) -> String {
    format!("{PREFIX}{}:{id}", kind.as_str())
}

/// The `(kind, id)` of a tag of that shape, whatever the kind (the backends map any of them).
pub fn split(tag: &str) -> Option<(&str, &str)> {
    tag.strip_prefix(PREFIX)?.split_once(':')
}

/// `maintd:<kind>:<id>` from its parts, for a backend that stores the two apart.
pub fn join(kind: &str, id: &str) -> String {
    format!("{PREFIX}{kind}:{id}")
}

/// `maintd:<id>`: the reference to an event or a fence flow in reason trails and Event messages.
pub fn reference(id: &impl std::fmt::Display) -> String {
    format!("{PREFIX}{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_built_and_split_the_same_way() {
        let id = Uuid::from_u128(7);
        let t = tag(TagKind::FenceFailed, &id);
        assert_eq!(t, format!("maintd:fencefailed:{id}"));
        assert_eq!(split(&t), Some(("fencefailed", id.to_string().as_str())));
        assert_eq!(join("repairready", "x"), "maintd:repairready:x");
        assert_eq!(split("other:repairready:x"), None);
        assert_eq!(reference(&id), format!("maintd:{id}"));
        assert_eq!("repairfailed".parse(), Ok(TagKind::RepairFailed));
    }
}
