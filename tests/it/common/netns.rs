//! Hosts in network namespaces for the partition tests: the master and each node in
//! a namespace of its own, joined by veth pairs to a bridge in the test's namespace (which
//! holds the bridge's address, so the test reaches everyone). Links are cut for real: a link
//! taken down, blackhole routes both ways between two hosts, or every outbound route of one
//! host blackholed while it still receives. Needs root and iproute2; without them the tests
//! skip with a notice, unless `MAINTD_REQUIRE_NETNS=1` (scripts/test) makes that a failure.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(args: &[&str]) {
    if let Err(e) = ip(args) {
        panic!("{e}");
    }
}

/// Whether namespaces can be built here; prints why not (or fails under
/// `MAINTD_REQUIRE_NETNS=1`).
pub fn available() -> bool {
    static CHECKED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let ok = CHECKED.get_or_init(probe).clone();
    match ok {
        Ok(()) => true,
        Err(e) => {
            assert!(
                std::env::var("MAINTD_REQUIRE_NETNS").as_deref() != Ok("1"),
                "MAINTD_REQUIRE_NETNS=1 but network namespaces are not available: {e}"
            );
            eprintln!("skipped: network namespaces need root and iproute2 ({e})");
            false
        }
    }
}

fn probe() -> Result<(), String> {
    let probe = format!("maintd-probe-{}", std::process::id());
    match ip(&["netns", "add", &probe]) {
        Ok(()) => {
            let _ = ip(&["netns", "del", &probe]);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One host: its namespace, address, and the outside end of its veth pair.
pub struct Host {
    pub ns: String,
    pub ip: String,
    veth: String,
}

/// The network of one test: `hosts[0]` is the master, then the nodes.
pub struct Net {
    pub hosts: Vec<Host>,
    bridge: String,
    /// `10.77.<k>.`: each test of the process has its own subnet.
    prefix: String,
}

impl Net {
    /// A master and `nodes` nodes: 10.77.k.1 and 10.77.k.11, .12, …; the bridge is 10.77.k.254.
    pub fn new(nodes: usize) -> Net {
        let pid = std::process::id();
        let k = (pid % 200 + NEXT.fetch_add(1, Ordering::SeqCst)) % 250 + 1;
        let tag = format!("{:x}{k}", pid % 0xffff);
        let prefix = format!("10.77.{k}.");
        let bridge = format!("mdb{tag}");
        must(&["link", "add", &bridge, "type", "bridge"]);
        must(&["addr", "add", &format!("{prefix}254/24"), "dev", &bridge]);
        must(&["link", "set", &bridge, "up"]);
        let mut net = Net {
            hosts: Vec::new(),
            bridge,
            prefix: prefix.clone(),
        };
        for i in 0..=nodes {
            let ip_addr = if i == 0 {
                format!("{prefix}1")
            } else {
                format!("{prefix}{}", 10 + i)
            };
            net.add_host(
                &format!("maintd-{tag}-{i}"),
                &ip_addr,
                &format!("md{tag}v{i}"),
            );
        }
        net
    }

    /// A namespace `ns` at `ip_addr`, joined to the bridge by the veth pair `outside`/eth0.
    fn add_host(&mut self, ns: &str, ip_addr: &str, outside: &str) {
        must(&["netns", "add", ns]);
        self.hosts.push(Host {
            ns: ns.to_string(),
            ip: ip_addr.to_string(),
            veth: outside.to_string(),
        });
        must(&[
            "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ]);
        must(&["link", "set", outside, "master", &self.bridge, "up"]);
        must(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{ip_addr}/24"),
            "dev",
            "eth0",
        ]);
        must(&["-n", ns, "link", "set", "eth0", "up"]);
        must(&["-n", ns, "link", "set", "lo", "up"]);
    }

    /// The command prefix that runs a program on host `i`.
    /// A cluster of `nodes` whose daemon runs on host 0 and node `i` on host `i + 1`, each on
    /// its default port.
    pub fn cluster(&self, nodes: usize) -> super::Cluster {
        let mut c = super::Cluster::new(nodes);
        c.daemon_host = self.hosts[0].ip.clone();
        c.node_hosts = self.hosts[1..=nodes].iter().map(|h| h.ip.clone()).collect();
        c.ports = vec![1815; nodes];
        c.api_port = 1816;
        c
    }

    pub fn exec(&self, i: usize) -> Vec<String> {
        ["ip", "netns", "exec", &self.hosts[i].ns]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Host `i`'s only link goes down (or up): it reaches no one and no one reaches it.
    pub fn link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        must(&["-n", &self.hosts[i].ns, "link", "set", "eth0", state]);
    }

    /// Packets between hosts `a` and `b` are dropped, both ways.
    pub fn cut(&self, a: usize, b: usize) {
        self.blackholes(a, b, "add");
    }

    /// Adds (`add`) or deletes (`del`) the blackhole routes between hosts `a` and `b`.
    fn blackholes(&self, a: usize, b: usize, op: &str) {
        for (from, to) in [(a, b), (b, a)] {
            let dst = format!("{}/32", self.hosts[to].ip);
            must(&["-n", &self.hosts[from].ns, "route", op, "blackhole", &dst]);
        }
    }

    /// The packets between hosts `a` and `b` flow again (undoes `cut`).
    pub fn heal(&self, a: usize, b: usize) {
        self.blackholes(a, b, "del");
    }

    /// The bridge's address in the test's own namespace, which every host reaches (a device
    /// simulator listening there is on every host's network).
    pub fn bridge_ip(&self) -> String {
        format!("{}254", self.prefix)
    }

    /// A further host (10.77.k.250) with forwarding off, to stand on a path: returns its index.
    /// A host routed through it reaches nobody through it unless a program there resends.
    pub fn add_relay(&mut self) -> usize {
        let i = self.hosts.len();
        let tag = self.bridge.trim_start_matches("mdb").to_string();
        let ns = format!("maintd-{tag}-r");
        self.add_host(&ns, &format!("{}250", self.prefix), &format!("md{tag}vr"));
        let sysctl = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=0",
            ])
            .status()
            .expect("sysctl");
        assert!(sysctl.success(), "cannot turn forwarding off on the relay");
        i
    }

    /// Host `from` sends everything for host `to` through host `via`.
    pub fn route_via(&self, from: usize, to: usize, via: usize) {
        let dst = format!("{}/32", self.hosts[to].ip);
        must(&[
            "-n",
            &self.hosts[from].ns,
            "route",
            "add",
            &dst,
            "via",
            &self.hosts[via].ip,
        ]);
    }

    /// Everything host `i` sends is dropped; it still receives.
    pub fn drop_outbound(&self, i: usize) {
        for half in ["0/25", "128/25"] {
            let dst = format!("{}{half}", self.prefix);
            must(&["-n", &self.hosts[i].ns, "route", "add", "blackhole", &dst]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // The pair first: a namespace outlives its name while anything still refers to it
        // (a lingering socket), and its veth would stay behind with it.
        for h in &self.hosts {
            let _ = ip(&["link", "del", &h.veth]);
            let _ = ip(&["netns", "del", &h.ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}
