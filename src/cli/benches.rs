//! The `maintd bench` subcommands: their arguments and which benchmark each one runs.

use clap::Subcommand;

use super::{bench, bench_api, bench_peers, bench_plan, bench_store};

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// One poll-and-verify cycle against N simulated signed collectors on loopback.
    Poll {
        /// Comma-separated node counts.
        #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
        nodes: Vec<usize>,
        /// Cycles measured per node count (the first, which opens connections, is reported apart).
        #[arg(long, default_value_t = 5)]
        cycles: usize,
        /// Descriptors the poll may hold (daemon.poll-connections).
        #[arg(long, default_value_t = 4096)]
        connections: usize,
        /// Poll over HTTP only (daemon.poll-udp = false).
        #[arg(long)]
        tcp: bool,
        /// Share the decision state on the etcd at this URL after each cycle, as an elected
        /// leader does, and count the writes.
        #[arg(long)]
        etcd: Option<String>,
    },
    /// Admission of evacuation candidates (capacity, PDBs, cap) over a synthetic cluster.
    Plan {
        #[arg(long, default_value_t = 5000)]
        nodes: usize,
        #[arg(long, default_value_t = 30)]
        pods_per_node: usize,
        /// Comma-separated candidate counts.
        #[arg(long, value_delimiter = ',', default_value = "1,50,500,5000")]
        candidates: Vec<usize>,
    },
    /// What the peer heartbeats and the second opinion cost: assignment, bytes, node and leader
    /// CPU.
    Peers {
        /// Cluster size for the assignment, the bytes and the leader's cost.
        #[arg(long, default_value_t = 5000)]
        nodes: usize,
        /// Real heartbeat tasks run over loopback UDP to measure a node's CPU.
        #[arg(long, default_value_t = 500)]
        live: usize,
        /// Seconds the live nodes are measured.
        #[arg(long, default_value_t = 20)]
        secs: u64,
    },
    /// The API's answers with many repair events, against a real daemon process on loopback.
    Api {
        /// Repair events written to the daemon's database before it starts.
        #[arg(long, default_value_t = 10_000)]
        events: usize,
        /// Comma-separated counts of clients reading full lists as fast as they can.
        #[arg(long, value_delimiter = ',', default_value = "1,10,50")]
        clients: Vec<usize>,
        /// Seconds each figure is measured.
        #[arg(long, default_value_t = 5)]
        secs: u64,
        /// Requests per second for one node's events.
        #[arg(long, default_value_t = 500)]
        rate: u32,
        /// Run the simulated collectors at normal priority, sharing the two cores with the
        /// daemon and the client; by default they run in the idle scheduling class, as the
        /// other machines they stand for would take none of the daemon's CPU.
        #[arg(long)]
        collectors_share: bool,
    },
    /// What a commit of a fence step costs, with SQLite synced at checkpoints (NORMAL) and at
    /// every commit (FULL, the daemon's).
    Store {
        /// Where the databases are written: put it on the disk the state database lives on.
        #[arg(long, default_value = "target/bench-store")]
        dir: std::path::PathBuf,
        #[arg(long, default_value_t = 2000)]
        commits: usize,
    },
    /// Internal: serve N simulated collectors and print their ports.
    #[command(hide = true)]
    SimCollectors {
        #[arg(long)]
        count: usize,
        /// The number of the first node served (its name is sim<first>).
        #[arg(long, default_value_t = 0)]
        first: usize,
        /// The loopback address to serve on.
        #[arg(long, default_value = "127.0.0.1")]
        addr: std::net::Ipv4Addr,
        /// The verdict every collector reports (JSON); by default most report Ok and every
        /// tenth an evacuation.
        #[arg(long)]
        verdict: Option<String>,
    },
}

pub async fn run(cmd: &BenchCmd) -> Result<(), bench::BenchError> {
    match cmd {
        BenchCmd::Poll {
            nodes,
            cycles,
            connections,
            tcp,
            etcd,
        } => {
            bench::poll(nodes, *cycles, *connections, !*tcp, etcd.as_deref()).await?;
        }
        BenchCmd::Plan {
            nodes,
            pods_per_node,
            candidates,
        } => {
            bench_plan::plan(*nodes, *pods_per_node, candidates)?;
        }
        BenchCmd::Peers { nodes, live, secs } => {
            bench_peers::peers(*nodes, *live, *secs).await?;
        }
        BenchCmd::Api {
            events,
            clients,
            secs,
            rate,
            collectors_share,
        } => bench_api::api(*events, clients, *secs, *rate, *collectors_share).await?,
        BenchCmd::Store { dir, commits } => bench_store::store(dir, *commits)?,
        BenchCmd::SimCollectors {
            count,
            first,
            addr,
            verdict,
        } => {
            bench::sim_collectors(*count, *first, *addr, verdict.as_deref()).await?;
        }
    }
    Ok(())
}
