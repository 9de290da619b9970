//! Every integration test, in one binary: it links the product once instead of once per file,
//! and its tests run side by side (the real peers of one test overlap with another's). Each
//! module is named for what it puts under test; a new test joins the module of that thing, or
//! a new module named for it. The modules by what they run against:
//!
//! - **the shipped files, no process**: `docs`, `structure`, `deploy`, `scripts`, `systemd`
//!   (units), `package` (.deb), `image` (OCI image);
//! - **a real daemon and collectors on loopback**: `flows` (repairs), `lists`, `api_spec`,
//!   `operators`, `operations`, `node_keys`, `rejections`, `hostile`, `tls`, `cli`,
//!   `heartbeats`, `durability` (kill -9), `isolation` (thousands of collectors), `ui` (a real
//!   browser);
//! - **fencing with real agents and device simulators**: `fencing`, `returns`, `maintenance`,
//!   `selffence` (watchdogs), `kdump`, `clocks` (libfaketime), `partitions` (network
//!   namespaces);
//! - **a backend's real peer**: `kube` (the in-process fake API server), `k8s_real` (a real
//!   control plane), `ganeti` (a real Ganeti cluster), `etcd` (leadership and the shared state
//!   on a real etcd), `etcd_ha` (three daemons and three etcd members in network namespaces,
//!   killed, stopped and cut mid-fence, etcd's quorum lost, and a seeded schedule of faults).
//!
//! `common` holds the harnesses (processes, ports, simulators, namespaces, the clusters).

mod common;

mod api_spec;
mod cli;
mod clocks;
mod deploy;
mod docs;
mod durability;
mod etcd;
mod etcd_ha;
mod fencing;
mod flows;
mod ganeti;
mod heartbeats;
mod hostile;
mod image;
mod isolation;
mod k8s_real;
mod kdump;
mod kube;
mod lists;
mod maintenance;
mod node_keys;
mod operations;
mod operators;
mod package;
mod partitions;
mod rejections;
mod returns;
mod scripts;
mod selffence;
mod structure;
mod systemd;
mod tls;
mod ui;
