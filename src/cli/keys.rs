//! `maintd keygen`: the cluster key, an operator's key, the master's node-key secret, and a
//! node's key, derived on the master from that secret for the generation its configuration
//! gives the node (or the one asked for).

use std::path::PathBuf;

use super::{Cli, CliError};
use crate::config::Config;
use crate::report::Key;
use crate::report::nodekey::{NodeKey, NodeSecret};

#[derive(Debug, thiserror::Error)]
pub enum NodeKeyCliError {
    #[error(
        "daemon.node-keys.secret-file is not set: write one with `maintd keygen --node-secret --out FILE` and name it there (on the master only)"
    )]
    NoSecretFile,
    #[error(
        "node {0:?} is configured with generation 0, which is the cluster key: set daemon.node-keys.generation (or the node's own) to 1 or above, or pass --generation"
    )]
    GenerationZero(String),
    #[error("{0:?} is not a node name: 1-64 characters of [A-Za-z0-9._-]")]
    Name(String),
    #[error(transparent)]
    Key(#[from] crate::report::KeyError),
}

/// Node `name`'s key of `generation`, or of the generation the configuration gives it.
pub fn node_key(
    cfg: &Config,
    name: &str,
    generation: Option<u32>,
) -> Result<NodeKey, NodeKeyCliError> {
    if name.len() > crate::report::heartbeat::MAX_NAME || crate::exec::validate_name(name).is_err()
    {
        return Err(NodeKeyCliError::Name(name.to_string()));
    }
    let nk = &cfg.daemon.node_keys;
    let path = nk
        .secret_file
        .as_ref()
        .ok_or(NodeKeyCliError::NoSecretFile)?;
    let secret = NodeSecret::load(path)?;
    let generation =
        generation.unwrap_or_else(|| nk.nodes.get(name).map_or(nk.generation, |g| g.generation));
    if generation == 0 {
        return Err(NodeKeyCliError::GenerationZero(name.to_string()));
    }
    Ok(secret.derive(name, generation))
}

/// What `maintd keygen` was asked to write.
pub struct Keygen<'a> {
    pub operator: Option<&'a str>,
    pub node: Option<&'a str>,
    pub generation: Option<u32>,
    pub node_secret: bool,
    pub out: Option<PathBuf>,
}

pub fn keygen(cli: &Cli, what: Keygen<'_>) -> Result<(), CliError> {
    if let Some(name) = what.operator {
        let path = what
            .out
            .unwrap_or_else(|| PathBuf::from(format!("{name}.key")));
        crate::report::operator::OperatorKey::generate(&path, name)?;
        out!(
            "wrote a new key for operator {name} to {}; list it under [daemon.operators.{name}] key-files",
            path.display()
        );
        return Ok(());
    }
    let cfg = cli.load_config()?;
    if let Some(name) = what.node {
        let path = what
            .out
            .unwrap_or_else(|| PathBuf::from(format!("{name}.key")));
        let k = node_key(&cfg, name, what.generation)?;
        k.write(&path)?;
        out!(
            "wrote node {name}'s key of generation {} to {}; install it on {name} (mode 0600) and list it in [collector] key-files",
            k.generation,
            path.display()
        );
    } else if what.node_secret {
        let path = what
            .out
            .or_else(|| cfg.daemon.node_keys.secret_file.clone())
            .ok_or(NodeKeyCliError::NoSecretFile)?;
        NodeSecret::generate(&path)?;
        out!(
            "wrote a new node-key secret to {}; keep it on the master only",
            path.display()
        );
    } else {
        Key::generate(&cfg.cluster.key_file)?;
        out!(
            "wrote a new cluster key to {}",
            cfg.cluster.key_file.display()
        );
    }
    Ok(())
}
