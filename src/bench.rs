//! Benchmarks: `maintd bench poll` measures the daemon's poll-and-verify cycle.

pub async fn poll(_nodes: &[usize], _cycles: usize) -> Result<(), String> {
    Err("not yet".into())
}

pub async fn sim_collectors(_count: usize) -> Result<(), String> {
    Err("not yet".into())
}
